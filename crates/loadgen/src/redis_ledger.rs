//! The Redis + Lua baseline: the single-script reserve / start / settle (refund)
//! design of the first seed, driven through EVALSHA.
//!
//! The scripts live in `crates/loadgen/lua/*.lua` (documented there) and are
//! compiled into the binary; [`Scripts::load`] sends each one to the server once
//! with `SCRIPT LOAD`, and every call afterwards is one `EVALSHA` round trip.
//! All keys of one subject and route share a hash tag (see [`Keys`]), so a
//! bucket, its leases and its expiry index sit in one hash slot.

use redis::aio::MultiplexedConnection;
use redis::Value;

/// The Lua sources, embedded at compile time.
pub mod lua {
    /// Publishes a bucket's limits (creates the bucket on first publish).
    pub const POLICY: &str = include_str!("../lua/policy.lua");
    /// Refill, check, debit and write the lease, idempotent on the id.
    pub const RESERVE: &str = include_str!("../lua/reserve.lua");
    /// Marks a held lease started.
    pub const START: &str = include_str!("../lua/start.lua");
    /// Credits reserved - used back once and tombstones the lease.
    pub const SETTLE: &str = include_str!("../lua/settle.lua");
    /// Refunds leases that outlived their hold TTL.
    pub const SWEEP: &str = include_str!("../lua/sweep.lua");
    /// `reserve.lua` over several dimensions' buckets, one lease for all.
    pub const RESERVE_DIMS: &str = include_str!("../lua/reserve_dims.lua");
    /// `settle.lua` over several dimensions' buckets, from the usage of each.
    pub const SETTLE_DIMS: &str = include_str!("../lua/settle_dims.lua");
}

/// How long a settled or swept lease is kept to answer retries (24 h).
pub const DEFAULT_TOMBSTONE_MS: u64 = 86_400_000;

/// The limits published for one bucket; mirrors the HTTP policy body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPolicy {
    /// Only a newer generation replaces existing limits.
    pub generation: u64,
    /// Ceiling of the bucket.
    pub burst_units: u64,
    /// Units added per `interval_ms`.
    pub refill_units: u64,
    /// Refill interval.
    pub interval_ms: u64,
    /// Balance of a new bucket.
    pub opening_units: u64,
    /// Larger reservations are refused unconditionally.
    pub max_reservation_units: u64,
    /// Lease lifetime before the sweeper may refund it.
    pub hold_ttl_ms: u64,
}

impl Default for BucketPolicy {
    /// The benchmark policy: large enough that nothing is ever refused.
    fn default() -> Self {
        BucketPolicy {
            generation: 1,
            burst_units: 1_000_000_000,
            refill_units: 1_000_000_000,
            interval_ms: 1000,
            opening_units: 1_000_000_000,
            max_reservation_units: 100_000,
            hold_ttl_ms: 180_000,
        }
    }
}

/// Key names of one subject and route; every key shares the `{rsv:S:R}` hash tag.
#[derive(Clone, Debug)]
pub struct Keys {
    tag: String,
    /// `{rsv:S:R}:bucket`
    pub bucket: String,
    /// `{rsv:S:R}:expiry`
    pub expiry: String,
}

impl Keys {
    /// Keys for `subject` and `route`.
    pub fn new(subject: &str, route: &str) -> Keys {
        let tag = format!("{{rsv:{subject}:{route}}}");
        Keys {
            bucket: format!("{tag}:bucket"),
            expiry: format!("{tag}:expiry"),
            tag,
        }
    }

    /// Prefix of every lease key (what `sweep.lua` appends ids to).
    pub fn lease_prefix(&self) -> String {
        format!("{}:lease:", self.tag)
    }

    /// The lease record of reservation `id`.
    pub fn lease(&self, id: &str) -> String {
        format!("{}:lease:{id}", self.tag)
    }

    /// The bucket of each of `dimensions` (primary first): the primary is
    /// [`Keys::bucket`], a further one `{rsv:S:R}:bucket:<dimension>`.
    pub fn buckets(&self, dimensions: &[&str]) -> Vec<String> {
        let further = dimensions.iter().skip(1);
        std::iter::once(self.bucket.clone())
            .chain(further.map(|d| format!("{}:{d}", self.bucket)))
            .collect()
    }
}

/// SHA1 digests of the loaded scripts.
#[derive(Clone, Debug)]
pub struct Scripts {
    policy: String,
    reserve: String,
    start: String,
    settle: String,
    sweep: String,
    pub(crate) reserve_dims: String,
    pub(crate) settle_dims: String,
}

impl Scripts {
    /// `SCRIPT LOAD` every script once; afterwards only `EVALSHA` is sent.
    pub async fn load(conn: &mut MultiplexedConnection) -> redis::RedisResult<Scripts> {
        async fn one(c: &mut MultiplexedConnection, src: &str) -> redis::RedisResult<String> {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(src)
                .query_async(c)
                .await
        }
        Ok(Scripts {
            policy: one(conn, lua::POLICY).await?,
            reserve: one(conn, lua::RESERVE).await?,
            start: one(conn, lua::START).await?,
            settle: one(conn, lua::SETTLE).await?,
            sweep: one(conn, lua::SWEEP).await?,
            reserve_dims: one(conn, lua::RESERVE_DIMS).await?,
            settle_dims: one(conn, lua::SETTLE_DIMS).await?,
        })
    }

    /// `(name, SHA1 digest)` of every script, named as in `crates/loadgen/lua/`
    /// without `.lua`: what an `EVALSHA` from another client needs.
    pub fn digests(&self) -> [(&'static str, &str); 7] {
        [
            ("policy", &self.policy),
            ("reserve", &self.reserve),
            ("start", &self.start),
            ("settle", &self.settle),
            ("sweep", &self.sweep),
            ("reserve_dims", &self.reserve_dims),
            ("settle_dims", &self.settle_dims),
        ]
    }
}

/// A script's answer: its status word and the integer or text fields after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The first element, e.g. `HELD`, `REFUSED`, `SETTLED`.
    pub status: String,
    /// The remaining elements, integers rendered as decimal text.
    pub fields: Vec<String>,
}

impl Reply {
    /// Field `i` as an integer (0 if missing or not a number).
    pub fn int(&self, i: usize) -> i64 {
        self.fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0)
    }

    fn parse(v: Value) -> redis::RedisResult<Reply> {
        let items = match v {
            Value::Array(items) => items,
            other => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::TypeError,
                    "script reply is not an array",
                    format!("{other:?}"),
                )))
            }
        };
        let mut text = items.into_iter().map(|v| match v {
            Value::Int(i) => i.to_string(),
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::SimpleString(s) => s,
            other => format!("{other:?}"),
        });
        let status = text.next().unwrap_or_default();
        Ok(Reply {
            status,
            fields: text.collect(),
        })
    }
}

/// The books of one bucket, read back for conservation checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Books {
    /// Available balance.
    pub tokens: i64,
    /// Opening balance.
    pub opening: i64,
    /// Refilled so far.
    pub minted: i64,
    /// Units held by live (held or started) leases.
    pub held: i64,
    /// Settled usage.
    pub spent: i64,
    /// Units refunded by the sweeper.
    pub expired: i64,
    /// Settled usage beyond the hold that the available tokens lacked (the
    /// debt it created; `settle_dims.lua` only).
    pub overdraft: i64,
}

impl Books {
    /// `opening + minted == tokens + held + spent`.
    pub fn balanced(&self) -> bool {
        self.opening + self.minted == self.tokens + self.held + self.spent
    }
}

/// One client's handle on the Redis ledger: a connection and the script digests.
#[derive(Clone)]
pub struct RedisLedger {
    conn: MultiplexedConnection,
    scripts: Scripts,
    /// How long settled leases answer retries.
    pub tombstone_ms: u64,
}

impl RedisLedger {
    /// Opens a connection to `url` and loads the scripts.
    pub async fn connect(url: &str) -> redis::RedisResult<RedisLedger> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let scripts = Scripts::load(&mut conn).await?;
        Ok(RedisLedger {
            conn,
            scripts,
            tombstone_ms: DEFAULT_TOMBSTONE_MS,
        })
    }

    /// A new, separate connection that reuses already loaded script digests.
    pub async fn connect_with(url: &str, scripts: Scripts) -> redis::RedisResult<RedisLedger> {
        let client = redis::Client::open(url)?;
        let conn = client.get_multiplexed_async_connection().await?;
        Ok(RedisLedger {
            conn,
            scripts,
            tombstone_ms: DEFAULT_TOMBSTONE_MS,
        })
    }

    /// The loaded script digests.
    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// The underlying connection (for inspection in tests).
    pub fn conn(&mut self) -> &mut MultiplexedConnection {
        &mut self.conn
    }

    pub(crate) async fn eval(
        &mut self,
        sha: &str,
        keys: &[&str],
        args: &[&str],
    ) -> redis::RedisResult<Reply> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        for a in args {
            cmd.arg(*a);
        }
        let v: Value = cmd.query_async(&mut self.conn).await?;
        Reply::parse(v)
    }

    /// Publishes `policy` for the bucket of `keys`.
    pub async fn publish_policy(
        &mut self,
        keys: &Keys,
        p: &BucketPolicy,
    ) -> redis::RedisResult<Reply> {
        self.publish_bucket(&keys.bucket, p).await
    }

    /// Publishes `policy` for the bucket hash `bucket`.
    pub async fn publish_bucket(
        &mut self,
        bucket: &str,
        p: &BucketPolicy,
    ) -> redis::RedisResult<Reply> {
        let args = [
            p.generation,
            p.burst_units,
            p.refill_units,
            p.interval_ms,
            p.opening_units,
            p.max_reservation_units,
            p.hold_ttl_ms,
        ]
        .map(|n| n.to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let sha = self.scripts.policy.clone();
        self.eval(&sha, &[bucket], &args).await
    }

    /// Reserves `units` for reservation `id` of `tenant`.
    pub async fn reserve(
        &mut self,
        keys: &Keys,
        id: &str,
        tenant: &str,
        units: u64,
    ) -> redis::RedisResult<Reply> {
        let lease = keys.lease(id);
        let units = units.to_string();
        let sha = self.scripts.reserve.clone();
        self.eval(
            &sha,
            &[&keys.bucket, &lease, &keys.expiry],
            &[id, tenant, &units],
        )
        .await
    }

    /// Marks reservation `id` started by `operation_id`.
    pub async fn start(
        &mut self,
        keys: &Keys,
        id: &str,
        operation_id: &str,
    ) -> redis::RedisResult<Reply> {
        let lease = keys.lease(id);
        let sha = self.scripts.start.clone();
        self.eval(&sha, &[&lease], &[operation_id]).await
    }

    /// Settles reservation `id` with `used` units (refunds reserved - used).
    pub async fn settle(&mut self, keys: &Keys, id: &str, used: u64) -> redis::RedisResult<Reply> {
        let lease = keys.lease(id);
        let used = used.to_string();
        let tomb = self.tombstone_ms.to_string();
        let sha = self.scripts.settle.clone();
        self.eval(
            &sha,
            &[&keys.bucket, &lease, &keys.expiry],
            &[id, &used, &tomb],
        )
        .await
    }

    /// Refunds at most `limit` expired leases of the bucket of `keys`.
    pub async fn sweep(&mut self, keys: &Keys, limit: u64) -> redis::RedisResult<Reply> {
        let prefix = keys.lease_prefix();
        let limit = limit.to_string();
        let tomb = self.tombstone_ms.to_string();
        let sha = self.scripts.sweep.clone();
        self.eval(
            &sha,
            &[&keys.bucket, &keys.expiry],
            &[&prefix, &limit, &tomb],
        )
        .await
    }

    /// Reads the books of the bucket of `keys`.
    pub async fn books(&mut self, keys: &Keys) -> redis::RedisResult<Books> {
        self.books_of(&keys.bucket).await
    }

    /// Reads the books of the bucket hash `bucket` (e.g. one of [`Keys::buckets`]).
    pub async fn books_of(&mut self, bucket: &str) -> redis::RedisResult<Books> {
        let v: Vec<Option<i64>> = redis::cmd("HMGET")
            .arg(bucket)
            .arg(&[
                "tokens",
                "opening",
                "minted",
                "held",
                "spent",
                "expired",
                "overdraft",
            ])
            .query_async(&mut self.conn)
            .await?;
        let g = |i: usize| v.get(i).copied().flatten().unwrap_or(0);
        Ok(Books {
            tokens: g(0),
            opening: g(1),
            minted: g(2),
            held: g(3),
            spent: g(4),
            expired: g(5),
            overdraft: g(6),
        })
    }
}
