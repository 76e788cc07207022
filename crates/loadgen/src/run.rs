//! The load loop: N clients, each with its own connection, driving
//! reserve → start → settle cycles against one target until a deadline or a
//! cycle budget is reached (and always before a hard time cap), spread over S
//! subjects so that S ledger partitions (or Redis buckets) are hot at once.

use crate::http::{authority_of, HttpConn, HttpError};
use crate::redis_dims::{DimKeys, THREE};
use crate::redis_ledger::{BucketPolicy, RedisLedger, Reply, Scripts};
use crate::stats::{process_cpu_secs, Recorder, RunShape, Step, Summary};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which system the cycles run against.
#[derive(Clone, Debug)]
pub enum Target {
    /// `reservoir serve` over HTTP, base URL such as `http://127.0.0.1:8080`.
    Reservoir {
        /// Base URL.
        url: String,
    },
    /// Redis with the Lua scripts, URL such as `redis://127.0.0.1:6379`.
    Redis {
        /// Connection URL.
        url: String,
    },
}

impl Target {
    /// `reservoir` or `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Reservoir { .. } => "reservoir",
            Target::Redis { .. } => "redis",
        }
    }
}

/// When a run stops (it also always stops at [`RunConfig::max_time`]).
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// Start no new cycle after warm-up plus this long.
    After(Duration),
    /// Start exactly this many cycles in total (warm-up included).
    Cycles(u64),
}

/// A run against a three-dimension policy ([`THREE`]: requests primary, input
/// and output tokens further, each bucket [`RunConfig::policy`]): every reserve
/// is sized from `counted_input_tokens` and `max_tokens` (1 request, the input,
/// `max_tokens` of output) and every settle gives the provider's usage
/// (1 request, `reported_input_tokens`, `output_tokens`) instead of units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Input tokens the gateway counted, sent with the reserve.
    pub counted_input_tokens: u64,
    /// The request's `max_tokens`: the output reserved.
    pub max_tokens: u64,
    /// Input tokens the provider reported, sent with the settle.
    pub reported_input_tokens: u64,
    /// Output tokens the provider reported, sent with the settle.
    pub output_tokens: u64,
}

impl Dims {
    /// Units held in each dimension of [`THREE`].
    pub fn reserved(&self) -> [u64; 3] {
        [1, self.counted_input_tokens, self.max_tokens]
    }

    /// Units spent in each dimension of [`THREE`].
    pub fn used(&self) -> [u64; 3] {
        [1, self.reported_input_tokens, self.output_tokens]
    }
}

/// Everything one run needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The system under test.
    pub target: Target,
    /// Name of the run in reports.
    pub label: String,
    /// Concurrent clients, one connection each.
    pub clients: usize,
    /// Subjects (tenants) the clients are spread over, round robin.
    pub subjects: usize,
    /// Subjects are named `{subject_prefix}1 ..= {subject_prefix}S`, unless
    /// `owned_only` picks other numbers.
    pub subject_prefix: String,
    /// Reservoir in cluster mode: only subjects whose log partition the node
    /// at the target URL owns, so no request is forwarded to a peer (a
    /// gateway that knows the topic's placement, [`owned_subjects`]).
    pub owned_only: bool,
    /// The subjects' names, when not `{subject_prefix}1 ..= S` (set by
    /// [`run`] for `owned_only`).
    pub subject_names: Vec<String>,
    /// Route of every reservation.
    pub route: String,
    /// Accounting epoch sent with the policies.
    pub epoch: String,
    /// Units reserved per cycle.
    pub units: u64,
    /// Units settled per cycle.
    pub actual_units: u64,
    /// A three-dimension policy instead (then `units` and `actual_units` are
    /// not used).
    pub dims: Option<Dims>,
    /// When to stop.
    pub stop: Stop,
    /// Cycles started before this are run but not measured.
    pub warmup: Duration,
    /// Hard cap on the whole run, whatever `stop` says.
    pub max_time: Duration,
    /// Stop early after this many errors.
    pub max_errors: u64,
    /// Policy published for every subject before the run.
    pub policy: BucketPolicy,
    /// Publish the policies first (skip when they already exist).
    pub publish: bool,
    /// Makes reservation ids unique across runs against the same server.
    pub run_id: String,
    /// Process id of the server, to report its CPU use (same machine only).
    pub server_pid: Option<u32>,
}

impl RunConfig {
    /// The dimensions of the policy, primary first.
    pub fn dimensions(&self) -> &'static [&'static str] {
        match self.dims {
            None => &THREE[..1],
            Some(_) => &THREE,
        }
    }

    /// The Redis keys of `subject`: one bucket per dimension.
    pub fn redis_keys(&self, subject: &str) -> DimKeys {
        DimKeys::new(subject, &self.route, self.dimensions())
    }

    /// Subject of client `i`.
    pub fn subject(&self, i: usize) -> String {
        let slot = i % self.subjects.max(1);
        match self.subject_names.get(slot) {
            Some(name) => name.clone(),
            None => format!("{}{}", self.subject_prefix, slot + 1),
        }
    }
}

/// A run id unique enough for one machine: time and process id, in hex.
pub fn fresh_run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:x}",
        (nanos as u64) & 0xff_ffff_ffff,
        std::process::id()
    )
}

/// The HTTP body of `POST /v1/policies` for `subject`.
pub fn policy_body(cfg: &RunConfig, subject: &str) -> serde_json::Value {
    let p = &cfg.policy;
    let dimension = |name: &str| {
        json!({
            "dimension": name,
            "refill": {"units": p.refill_units, "interval_ms": p.interval_ms},
            "burst_units": p.burst_units,
            "opening_units": p.opening_units,
            "max_reservation_units": p.max_reservation_units,
            "max_overdraft_units": 1_000_000,
        })
    };
    let unit = if cfg.dims.is_some() {
        "requests"
    } else {
        "tokens"
    };
    let mut body = json!({
        "accounting_epoch": cfg.epoch,
        "policy": {
            "subject": subject,
            "route": cfg.route,
            "region": "local",
            "capacity_unit": unit,
            "refill": {"units": p.refill_units, "interval_ms": p.interval_ms},
            "burst_units": p.burst_units,
            "opening_units": p.opening_units,
            "estimator_digest": "",
            "max_reservation_units": p.max_reservation_units,
            "hold_ttl_ms": p.hold_ttl_ms,
            "hard_execution_limit_ms": 600_000,
            "max_overdraft_units": 1_000_000,
            "priority": 0,
            "emergency_mode": "disabled",
            "shadow_mode": false,
            "generation": p.generation,
        }
    });
    if cfg.dims.is_some() {
        let further: Vec<_> = THREE[1..].iter().map(|d| dimension(d)).collect();
        body["policy"]["dimensions"] = further.into();
    }
    body
}

enum Client {
    Http(HttpConn),
    /// The keys of every subject, by slot.
    Redis(RedisLedger, Vec<DimKeys>),
}

/// One failed step: a short kind for the error table, and whether to back off.
struct Failure {
    kind: String,
    transport: bool,
}

fn http_failure(e: HttpError) -> Failure {
    let HttpError::Transport(msg) = e;
    let kind = if msg.starts_with("connect") {
        "transport: connect".to_string()
    } else {
        "transport".to_string()
    };
    Failure {
        kind,
        transport: true,
    }
}

fn redis_failure(e: redis::RedisError) -> Failure {
    Failure {
        kind: format!("redis error: {:?}", e.kind()),
        transport: e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal(),
    }
}

fn expect(reply: Reply, want: &str) -> Result<(), Failure> {
    if reply.status == want {
        Ok(())
    } else {
        Err(Failure {
            kind: reply.status,
            transport: false,
        })
    }
}

fn expect_2xx(status: hyper::StatusCode) -> Result<(), Failure> {
    if status.is_success() {
        Ok(())
    } else {
        Err(Failure {
            kind: format!("HTTP {}", status.as_u16()),
            transport: false,
        })
    }
}

impl Client {
    async fn reserve(
        &mut self,
        cfg: &RunConfig,
        slot: usize,
        subject: &str,
        id: &str,
    ) -> Result<(), Failure> {
        match self {
            Client::Http(c) => {
                let body = match cfg.dims {
                    None => {
                        json!({"id": id, "subject": subject, "route": cfg.route, "units": cfg.units})
                    }
                    Some(d) => json!({"id": id, "subject": subject, "route": cfg.route,
                        "counted_input_tokens": d.counted_input_tokens, "max_tokens": d.max_tokens}),
                };
                let (status, bytes) = c
                    .post_json("/v1/reservations", &body)
                    .await
                    .map_err(http_failure)?;
                expect_2xx(status)?;
                // The receipt must name the reservation, its state and the log
                // position (and, for three dimensions, the two further holds).
                let further = cfg.dims.map_or(0, |_| THREE.len() - 1);
                let ok = serde_json::from_slice::<serde_json::Value>(&bytes).is_ok_and(|v| {
                    v.get("id").and_then(|x| x.as_str()) == Some(id)
                        && v.get("state").is_some()
                        && v.get("log_position").is_some()
                        && v.get("dimensions")
                            .and_then(|d| d.as_array())
                            .map_or(0, Vec::len)
                            == further
                });
                if ok {
                    Ok(())
                } else {
                    Err(Failure {
                        kind: "bad receipt".into(),
                        transport: false,
                    })
                }
            }
            Client::Redis(r, keys) => {
                let reply = match cfg.dims {
                    None => r.reserve(&keys[slot].keys, id, subject, cfg.units).await,
                    Some(d) => {
                        r.reserve_dims(&keys[slot], id, subject, &d.reserved())
                            .await
                    }
                };
                expect(reply.map_err(redis_failure)?, "HELD")
            }
        }
    }

    async fn start(&mut self, slot: usize, id: &str) -> Result<(), Failure> {
        let op = format!("op-{id}");
        match self {
            Client::Http(c) => {
                let path = format!("/v1/reservations/{id}/start");
                let (status, _) = c
                    .post_json(&path, &json!({"operation_id": op}))
                    .await
                    .map_err(http_failure)?;
                expect_2xx(status)
            }
            Client::Redis(r, keys) => {
                let reply = r
                    .start(&keys[slot].keys, id, &op)
                    .await
                    .map_err(redis_failure)?;
                expect(reply, "STARTED")
            }
        }
    }

    async fn settle(&mut self, cfg: &RunConfig, slot: usize, id: &str) -> Result<(), Failure> {
        match self {
            Client::Http(c) => {
                let path = format!("/v1/reservations/{id}/settle");
                let body = match cfg.dims {
                    None => json!({"actual_units": cfg.actual_units}),
                    Some(d) => json!({"usage": {"reported_input_tokens": d.reported_input_tokens,
                        "output_tokens": d.output_tokens}}),
                };
                let (status, _) = c.post_json(&path, &body).await.map_err(http_failure)?;
                expect_2xx(status)
            }
            Client::Redis(r, keys) => {
                let reply = match cfg.dims {
                    None => r.settle(&keys[slot].keys, id, cfg.actual_units).await,
                    Some(d) => r.settle_dims(&keys[slot], id, &d.used()).await,
                };
                expect(reply.map_err(redis_failure)?, "SETTLED")
            }
        }
    }

    fn connects(&self) -> u64 {
        match self {
            Client::Http(c) => c.connects,
            Client::Redis(..) => 1,
        }
    }
}

/// Publishes the policy of every subject (unless `cfg.publish` is false).
/// Returns the Redis script digests, loaded with `SCRIPT LOAD`, when the
/// target is Redis.
pub async fn publish(cfg: &RunConfig) -> Result<Option<Scripts>, String> {
    let subjects: Vec<String> = (0..cfg.subjects).map(|i| cfg.subject(i)).collect();
    match &cfg.target {
        Target::Reservoir { url } => {
            if cfg.publish {
                let mut c = HttpConn::new(authority_of(url)?);
                for s in &subjects {
                    let (status, body) = c
                        .post_json("/v1/policies", &policy_body(cfg, s))
                        .await
                        .map_err(|e| format!("publishing the policy of {s}: {e}"))?;
                    if status.as_u16() == 409 {
                        eprintln!("loadgen: policy of {s} already published (409), using it");
                    } else if !status.is_success() {
                        return Err(format!(
                            "publishing the policy of {s}: HTTP {status}: {}",
                            String::from_utf8_lossy(&body)
                        ));
                    }
                }
            }
            Ok(None)
        }
        Target::Redis { url } => {
            let mut r = RedisLedger::connect(url)
                .await
                .map_err(|e| format!("connecting to {url}: {e}"))?;
            if cfg.publish {
                for s in &subjects {
                    let keys = cfg.redis_keys(s);
                    let policies = vec![cfg.policy.clone(); keys.buckets.len()];
                    let replies = r
                        .publish_dims(&keys, &policies)
                        .await
                        .map_err(|e| format!("publishing the policy of {s}: {e}"))?;
                    if let Some(reply) = replies.iter().find(|r| r.status == "STALE") {
                        eprintln!(
                            "loadgen: bucket of {s} already has generation {}, using it",
                            reply.int(0)
                        );
                    }
                }
            }
            Ok(Some(r.scripts().clone()))
        }
    }
}

struct Shared {
    cfg: RunConfig,
    measure_start: Instant,
    end: Instant,
    hard_end: Instant,
    claimed: AtomicU64,
    errors: AtomicU64,
}

async fn client_loop(idx: usize, mut client: Client, sh: Arc<Shared>) -> (Recorder, u64) {
    let cfg = &sh.cfg;
    let subject = cfg.subject(idx);
    let slot = idx % cfg.subjects.max(1);
    let mut rec = Recorder::default();
    let mut seq: u64 = 0;
    loop {
        let now = Instant::now();
        if now >= sh.hard_end || sh.errors.load(Ordering::Relaxed) >= cfg.max_errors {
            break;
        }
        match cfg.stop {
            Stop::After(_) if now >= sh.end => break,
            Stop::Cycles(n) if sh.claimed.fetch_add(1, Ordering::Relaxed) >= n => break,
            _ => {}
        }
        seq += 1;
        let id = format!("lg-{}-{idx}-{seq}", cfg.run_id);
        let t0 = Instant::now();
        let measured = t0 >= sh.measure_start;

        let mut times = [Duration::ZERO; 3];
        let mut result = client.reserve(cfg, slot, &subject, &id).await;
        times[0] = t0.elapsed();
        let mut failed_step = Step::Reserve;
        if result.is_ok() {
            let t = Instant::now();
            result = client.start(slot, &id).await;
            times[1] = t.elapsed();
            failed_step = Step::Start;
        }
        if result.is_ok() {
            let t = Instant::now();
            result = client.settle(cfg, slot, &id).await;
            times[2] = t.elapsed();
            failed_step = Step::Settle;
        }
        match result {
            Ok(()) if measured => {
                rec.step(Step::Reserve, times[0]);
                rec.step(Step::Start, times[1]);
                rec.step(Step::Settle, times[2]);
                rec.cycle(t0.elapsed());
            }
            Ok(()) => rec.warmup_cycles += 1,
            Err(f) => {
                rec.error(failed_step, &f.kind);
                sh.errors.fetch_add(1, Ordering::Relaxed);
                if f.transport {
                    // Do not spin on a dead server; the loop stays bounded by time.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    let connects = client.connects();
    (rec, connects)
}

/// `cfg.subjects` names `{subject_prefix}N` (N = 1, 2, …, skipping the
/// rest) whose subject/route the cluster node at the target URL owns, by its
/// `GET /v1/cluster/node` (the topic's partition count and the node's
/// assignment) and the log's placement (`reservoir_core::placement`).
pub async fn owned_subjects(cfg: &RunConfig) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct NodeStatus {
        log_partitions: u32,
        assigned: Vec<u32>,
    }
    let Target::Reservoir { url } = &cfg.target else {
        return Err("--owned-only needs --target reservoir".into());
    };
    let (status, body) = HttpConn::new(authority_of(url)?)
        .get("/v1/cluster/node")
        .await
        .map_err(|e| format!("GET {url}/v1/cluster/node: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "GET {url}/v1/cluster/node answered {status} (--owned-only needs a cluster node): {}",
            String::from_utf8_lossy(&body)
        ));
    }
    let node: NodeStatus = serde_json::from_slice(&body)
        .map_err(|e| format!("GET {url}/v1/cluster/node: unexpected answer: {e}"))?;
    subjects_in(
        &cfg.subject_prefix,
        &cfg.route,
        cfg.subjects,
        node.log_partitions,
        &node.assigned,
    )
    .ok_or_else(|| format!("the node at {url} owns no partition right now"))
}

/// The first `n` subjects `{prefix}1, {prefix}2, …` whose `route` lies in
/// one of the `assigned` log partitions (of `log_partitions`); `None` when
/// none of them exists (no name could ever be found).
pub fn subjects_in(
    prefix: &str,
    route: &str,
    n: usize,
    log_partitions: u32,
    assigned: &[u32],
) -> Option<Vec<String>> {
    if !assigned.iter().any(|&p| p < log_partitions) {
        return None;
    }
    let owned = |name: &String| {
        let p = reservoir_core::placement::log_partition_of_route(name, route, log_partitions);
        assigned.contains(&p)
    };
    Some(
        (1..)
            .map(|i| format!("{prefix}{i}"))
            .filter(owned)
            .take(n)
            .collect(),
    )
}

/// Runs one benchmark and returns its summary.
pub async fn run(mut cfg: RunConfig) -> Result<Summary, String> {
    if cfg.clients == 0 || cfg.subjects == 0 {
        return Err("clients and subjects must be at least 1".into());
    }
    if cfg.owned_only {
        cfg.subject_names = owned_subjects(&cfg).await?;
    }
    let scripts = publish(&cfg).await?;

    let mut clients = Vec::with_capacity(cfg.clients);
    for i in 0..cfg.clients {
        clients.push(match &cfg.target {
            Target::Reservoir { url } => Client::Http(HttpConn::new(authority_of(url)?)),
            Target::Redis { url } => {
                let r = RedisLedger::connect_with(url, scripts.clone().expect("loaded in setup"))
                    .await
                    .map_err(|e| format!("client {i} connecting to {url}: {e}"))?;
                let keys = (0..cfg.subjects)
                    .map(|s| cfg.redis_keys(&cfg.subject(s)))
                    .collect();
                Client::Redis(r, keys)
            }
        });
    }

    let start = Instant::now();
    let measure_start = start + cfg.warmup;
    let end = match cfg.stop {
        Stop::After(d) => measure_start + d,
        Stop::Cycles(_) => start + cfg.max_time,
    };
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        measure_start,
        end,
        hard_end: start + cfg.max_time,
        claimed: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    // CPU counters at the start of the measured window.
    let server_pid = cfg.server_pid;
    let cpu_at_start = tokio::spawn(async move {
        tokio::time::sleep_until(measure_start.into()).await;
        (process_cpu_secs(None), process_cpu_secs(server_pid))
    });
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| tokio::spawn(client_loop(i, c, shared.clone())))
        .collect();
    let mut total = Recorder::default();
    let mut connections = 0;
    for h in handles {
        let (rec, connects) = h.await.map_err(|e| format!("client task failed: {e}"))?;
        total.merge(&rec);
        connections += connects;
    }
    let finished = Instant::now();
    let (client0, server0) = cpu_at_start.await.unwrap_or((None, None));
    let delta = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a).max(0.0));
    let client_cpu_s = delta(client0, process_cpu_secs(None));
    let server_cpu_s = delta(server0, process_cpu_secs(server_pid));
    let measured = finished.saturating_duration_since(measure_start);
    Ok(Summary::new(
        RunShape {
            label: &cfg.label,
            target: cfg.target.kind(),
            clients: cfg.clients,
            subjects: cfg.subjects,
            dimensions: cfg.dimensions().len(),
            // Three dimensions: the tokens held and spent (input + output).
            units: cfg
                .dims
                .map_or(cfg.units, |d| d.reserved()[1..].iter().sum()),
            actual_units: cfg
                .dims
                .map_or(cfg.actual_units, |d| d.used()[1..].iter().sum()),
            warmup: cfg.warmup,
            measured,
            connections,
            client_cpu_s,
            server_cpu_s,
        },
        &total,
    ))
}
