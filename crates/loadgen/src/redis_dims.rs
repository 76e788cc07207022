//! The Redis + Lua baseline of a policy in several dimensions (issue 15):
//! one bucket hash per dimension ([`Keys::buckets`]), each published with
//! `policy.lua`, and `reserve_dims.lua` / `settle_dims.lua`, which hold and
//! settle in all of them in ONE `EVALSHA` each, with one lease for all. The
//! lease of a reserve in three dimensions is started by `start.lua` as any
//! other.

use crate::redis_ledger::{BucketPolicy, Keys, RedisLedger, Reply};

/// The dimensions of the benchmark's three-dimension policy, primary first,
/// named as in the Reservoir API.
pub const THREE: [&str; 3] = ["requests", "input_tokens", "output_tokens"];

/// One subject's keys and the bucket of each dimension, in [`THREE`] order.
#[derive(Clone, Debug)]
pub struct DimKeys {
    /// Lease and expiry keys (and the primary bucket).
    pub keys: Keys,
    /// `keys.buckets(&THREE)`.
    pub buckets: Vec<String>,
}

impl DimKeys {
    /// The keys of `subject` and `route` for the dimensions `dimensions`.
    pub fn new(subject: &str, route: &str, dimensions: &[&str]) -> DimKeys {
        let keys = Keys::new(subject, route);
        DimKeys {
            buckets: keys.buckets(dimensions),
            keys,
        }
    }

    fn with<'a>(&'a self, lease: &'a str) -> Vec<&'a str> {
        let mut all: Vec<&str> = self.buckets.iter().map(String::as_str).collect();
        all.push(lease);
        all.push(&self.keys.expiry);
        all
    }
}

impl RedisLedger {
    /// Publishes `policies[i]` for the bucket of dimension `i`; the replies in order.
    pub async fn publish_dims(
        &mut self,
        keys: &DimKeys,
        policies: &[BucketPolicy],
    ) -> redis::RedisResult<Vec<Reply>> {
        let mut replies = Vec::with_capacity(policies.len());
        for (bucket, p) in keys.buckets.iter().zip(policies) {
            replies.push(self.publish_bucket(bucket, p).await?);
        }
        Ok(replies)
    }

    /// Reserves `units[i]` in dimension `i` for reservation `id` of `tenant`,
    /// in every dimension or none.
    pub async fn reserve_dims(
        &mut self,
        keys: &DimKeys,
        id: &str,
        tenant: &str,
        units: &[u64],
    ) -> redis::RedisResult<Reply> {
        let lease = keys.keys.lease(id);
        let units: Vec<String> = units.iter().map(u64::to_string).collect();
        let mut args = vec![id, tenant];
        args.extend(units.iter().map(String::as_str));
        let sha = self.scripts().reserve_dims.clone();
        self.eval(&sha, &keys.with(&lease), &args).await
    }

    /// Settles reservation `id` with `used[i]` units in dimension `i`.
    pub async fn settle_dims(
        &mut self,
        keys: &DimKeys,
        id: &str,
        used: &[u64],
    ) -> redis::RedisResult<Reply> {
        let lease = keys.keys.lease(id);
        let used: Vec<String> = used.iter().map(u64::to_string).collect();
        let tomb = self.tombstone_ms.to_string();
        let mut args = vec![id, tomb.as_str()];
        args.extend(used.iter().map(String::as_str));
        let sha = self.scripts().settle_dims.clone();
        self.eval(&sha, &keys.with(&lease), &args).await
    }
}
