//! Harness: the `reservoir` server binary on an embedded log (or a broker), a
//! tenant's history driven over HTTP, the projector run over the finished log,
//! and the `reservoir-replay` binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reservoir_core::Policy;
use reservoir_log::embedded::EmbeddedLog;
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::EventLog;
use reservoir_projections::{store, Projector, ProjectorConfig};
use reservoir_testkit::{output_bounded, terminate, StderrTail, EXIT_LIMIT};
use serde_json::{json, Value};

/// The server binary, built next to this test's binary by a workspace build
/// (`cargo test --workspace` builds it for the server's own tests). A test
/// never runs cargo itself: cargo holds the target lock while tests run.
pub fn server_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("reservoir");
    assert!(
        bin.exists(),
        "no server binary at {}: build it first with `cargo build --release -p reservoir-server --bin reservoir`",
        bin.display()
    );
    bin
}

pub fn replay_binary() -> &'static str {
    env!("CARGO_BIN_EXE_reservoir-replay")
}

/// Runs `reservoir-replay` with `args`.
pub fn replay(args: &[&str]) -> Output {
    output_bounded(
        Command::new(replay_binary()).args(args),
        "reservoir-replay",
        EXIT_LIMIT,
    )
}

/// `reservoir-replay --log-dir LOG audit --tenant TENANT --format FORMAT EXTRA…`.
pub fn audit(log: &str, tenant: &str, format: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "--log-dir",
        log,
        "audit",
        "--tenant",
        tenant,
        "--format",
        format,
    ];
    args.extend_from_slice(extra);
    replay(&args)
}

/// The lines of a successful JSON lines output, parsed.
pub fn json_lines(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub struct Server {
    child: Child,
    stderr: StderrTail,
    pub base: String,
    pub client: reqwest::Client,
}

impl Server {
    /// `reservoir serve` on `data_dir` (plus `extra` flags), ready.
    pub async fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(server_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--writer-shards", "2"])
            .args(["--sweep-interval-ms", "50", "--refill-interval-ms", "100"])
            .args(extra)
            .arg("--data-dir")
            .arg(data_dir)
            .env("RESERVOIR_LOG_LEVEL", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn reservoir");
        let (tx, rx) = std::sync::mpsc::channel();
        let mut tx = Some(tx);
        let stderr = StderrTail::follow(child.stderr.take().unwrap(), move |line| {
            if let Some(addr) = line.split("addr=").nth(1) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(addr.split_whitespace().next().unwrap_or("").to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("server printed its address");
        let server = Server {
            child,
            stderr,
            base: format!("http://{addr}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = server
                .client
                .get(format!("{}/readyz", server.base))
                .send()
                .await
            {
                if r.status().is_success() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "server not ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> Value {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        r.json().await.unwrap()
    }

    /// SIGTERM, then wait for a clean exit (a bounded wait: a server that
    /// does not stop fails the test with its stacks and its last log lines).
    /// The client goes first: its pooled keep-alive connection is one the
    /// server would otherwise wait on for its shutdown grace.
    pub fn stop(self) {
        let Server {
            mut child,
            stderr,
            client,
            ..
        } = self;
        drop(client);
        let status = terminate(&mut child, "reservoir serve", Some(&stderr));
        assert!(status.success(), "server exited with {status}");
    }
}

/// 1,000-unit bucket refilling `refill_per_s`, a 200 ms lease, overdraft allowed.
pub fn policy(subject: &str, route: &str, refill_per_s: u64) -> Policy {
    let mut p = Policy::example(subject, route, 1);
    p.burst_units = 1_000;
    p.opening_units = 1_000;
    p.max_reservation_units = 1_000;
    p.refill.units = refill_per_s;
    p.refill.interval_ms = 1_000;
    p.max_overdraft_units = 2_000;
    p.hold_ttl_ms = 200;
    p
}

async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "{what}: not reached in time");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A disputed tenant's history: settlements with a refund, a retried reserve
/// and settle (answered from the record, no second debit), an expiry, a
/// refusal, an overdraft and its repayment by refills, a release; and another
/// tenant's traffic beside it.
pub async fn tenant_history(s: &Server) {
    for (subject, refill) in [("acme", 400), ("other", 100)] {
        let (status, body) = s
            .post(
                "/v1/policies",
                json!({"accounting_epoch": "2026-07", "policy": policy(subject, "chat", refill)}),
            )
            .await;
        assert!(status < 300, "{status} {body}");
    }
    let reserve = |id: &str, subject: &str, units: u64| json!({"id": id, "subject": subject, "route": "chat", "units": units});
    // A settled call with a refund; reserve and settle retried with the same ids.
    let (status, first) = s.post("/v1/reservations", reserve("r1", "acme", 600)).await;
    assert_eq!(status, 201, "{first}");
    let (status, again) = s.post("/v1/reservations", reserve("r1", "acme", 600)).await;
    assert!(
        status < 300,
        "retry answered from the record: {status} {again}"
    );
    let (status, _) = s
        .post("/v1/reservations/r1/start", json!({"operation_id": "op-1"}))
        .await;
    assert_eq!(status, 200);
    let (status, _) = s
        .post("/v1/reservations/r1/settle", json!({"actual_units": 450}))
        .await;
    assert_eq!(status, 200);
    let (status, _) = s
        .post("/v1/reservations/r1/settle", json!({"actual_units": 450}))
        .await;
    assert!(
        status < 300,
        "a retried settle is answered, not applied twice"
    );
    // Another tenant meanwhile.
    s.post("/v1/reservations", reserve("o1", "other", 100))
        .await;
    s.post("/v1/reservations/o1/release", json!({})).await;
    // A lease nobody starts: the sweeper expires it.
    let (status, _) = s.post("/v1/reservations", reserve("r2", "acme", 300)).await;
    assert_eq!(status, 201);
    eventually("r2 expired", || async {
        s.get("/v1/reservations/r2").await["state"] == "EXPIRED"
    })
    .await;
    // A request bigger than what is available: refused (429) and logged.
    let (status, body) = s
        .post("/v1/reservations", reserve("big", "acme", 1_000))
        .await;
    assert!(status == 429 || status == 201, "{status} {body}");
    if status == 201 {
        s.post("/v1/reservations/big/release", json!({})).await;
    }
    // Overdraft: uses far more than it reserved.
    eventually("room for r3", || async {
        s.post("/v1/reservations", reserve("r3", "acme", 500))
            .await
            .0
            == 201
    })
    .await;
    s.post("/v1/reservations/r3/start", json!({"operation_id": "op-3"}))
        .await;
    let (status, body) = s
        .post("/v1/reservations/r3/settle", json!({"actual_units": 2_200}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "SETTLED_WITH_DEBT", "{body}");
    // Debt outstanding: refused.
    let (status, body) = s.post("/v1/reservations", reserve("r4", "acme", 10)).await;
    assert_eq!(status, 429, "{body}");
    // Refills repay the debt; then admission resumes.
    eventually("debt repaid", || async {
        let parts = s.get("/v1/partitions").await;
        parts.as_array().unwrap().iter().any(|p| {
            p["subject"] == "acme"
                && p["debt_units"] == 0
                && p["available_units"].as_u64() >= Some(100)
        })
    })
    .await;
    let (status, body) = s.post("/v1/reservations", reserve("r5", "acme", 100)).await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = s.post("/v1/reservations/r5/release", json!({})).await;
    assert_eq!(status, 200);
}

/// The projector (the live read side's code) run over the finished embedded log.
pub async fn project_embedded(log_dir: &Path, into: &Path) -> Arc<rocksdb::DB> {
    let log = EmbeddedLog::open(log_dir, "test-projector").unwrap();
    project(Arc::new(log), into).await
}

pub async fn project<L: EventLog>(log: Arc<L>, into: &Path) -> Arc<rocksdb::DB> {
    let db = store::open(into).unwrap();
    let mut projector = Projector::open(log, db.clone(), ProjectorConfig::default()).unwrap();
    projector.catch_up().await.unwrap();
    db.flush().unwrap();
    db
}

/// A Kafka log client for tests (never claims).
pub async fn kafka(brokers: &str, topic: &str) -> KafkaLog {
    let mut config = KafkaConfig::new(brokers, "test-reader");
    config.topic = topic.to_string();
    KafkaLog::connect(config).await.unwrap()
}

/// The broker of `scripts/test`, if any; under CI=true its absence is a failure.
pub fn brokers() -> Option<String> {
    match std::env::var("RESERVOIR_TEST_BROKERS")
        .ok()
        .filter(|b| !b.trim().is_empty())
    {
        Some(b) => Some(b),
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but RESERVOIR_TEST_BROKERS is not set: the broker test must run in CI"
            );
            eprintln!("\n*** SKIPPED (no broker): RESERVOIR_TEST_BROKERS is not set (scripts/test starts Apache Kafka) ***\n");
            None
        }
    }
}

/// A server history on a fresh embedded log; returns (data dir, log dir).
pub async fn embedded_history() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    tenant_history(&server).await;
    server.stop();
    let log_dir = dir.path().join("log");
    (dir, log_dir)
}

/// A server history on a fresh topic of `brokers` (named after `name`);
/// returns (data dir, topic).
pub async fn kafka_history(brokers: &str, name: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("reservoir.test.{name}.{}.{nanos}", std::process::id());
    let server = Server::start(
        dir.path(),
        &["--log", "kafka", "--brokers", brokers, "--topic", &topic],
    )
    .await;
    tenant_history(&server).await;
    server.stop();
    (dir, topic)
}

/// Copies a directory (a stopped log) so it can be tampered with.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
