//! The real ledger for the client's tests: `reservoir serve` as a child
//! process on the embedded log in a temporary data directory, its policies,
//! and the conservation check every state-changing test ends with.
//!
//! Which binary: `RESERVOIR_TEST_SERVER_BIN` when set; otherwise
//! `reservoir` beside this test binary's directory (`<target>/release/`), which
//! `cargo test --release --workspace` (what `scripts/test` runs) builds before
//! any test starts, from the same checkout. A test never runs cargo itself:
//! cargo holds the target directory's lock while tests run, so a nested build
//! would wait for it or, worse, build against other features. Running this
//! crate's tests alone needs the binary first: `cargo build --release -p
//! reservoir-server --bin reservoir`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use reservoir_testkit::DeadPort;
use serde_json::{json, Value};

pub fn server_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("RESERVOIR_TEST_SERVER_BIN") {
            return PathBuf::from(bin);
        }
        let exe = std::env::current_exe().expect("the test binary's path");
        // <target>/release/deps/client-<hash> → <target>/release/reservoir
        let bin = exe
            .parent()
            .and_then(Path::parent)
            .map(|release| release.join("reservoir"))
            .expect("the test binary lives in <target>/release/deps");
        assert!(
            bin.is_file(),
            "{} is missing: build it first with `cargo build --release -p reservoir-server --bin reservoir` \
             (or set RESERVOIR_TEST_SERVER_BIN)",
            bin.display()
        );
        bin
    })
    .clone()
}

/// A `reservoir serve` process on `data_dir`.
pub struct ServerProcess {
    child: Child,
    pub addr: SocketAddr,
}

impl ServerProcess {
    /// Starts it on a free port and returns once `/readyz` answers 200.
    pub async fn spawn(data_dir: &Path) -> ServerProcess {
        let child = Command::new(server_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--writer-shards", "2"])
            .args(["--sweep-interval-ms", "100", "--refill-interval-ms", "100"])
            .arg("--data-dir")
            .arg(data_dir)
            .env("RESERVOIR_LOG_LEVEL", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn reservoir");
        // Owned by the guard at once: killed and waited for on every path.
        let mut server = ServerProcess {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let stderr = server.child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("addr=").nth(1) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr.split_whitespace().next().unwrap_or("").to_string());
                    }
                }
                if std::env::var_os("RESERVOIR_TEST_VERBOSE").is_some() {
                    eprintln!("[reservoir] {line}");
                }
            }
        });
        server.addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("server printed its address")
            .parse()
            .expect("an address");
        let http = reqwest::Client::new();
        for _ in 0..3000 {
            if let Ok(r) = http
                .get(format!("http://{}/readyz", server.addr))
                .send()
                .await
            {
                if r.status() == 200 {
                    return server;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("reservoir never became ready");
    }

    /// SIGKILL (this test's own child, by its pid), then waits for it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One ledger for one test: its data directory, its process and a plain HTTP
/// client for setup and checks (the client under test is built by the test).
pub struct Ledger {
    /// Dropped before `dir` (fields drop in order): the process is killed
    /// and reaped before its data directory is removed, which it could
    /// otherwise write into meanwhile, leaving it behind.
    pub server: Option<ServerProcess>,
    pub dir: tempfile::TempDir,
    pub http: reqwest::Client,
    /// The port of a ledger [`Ledger::kill`] killed, held until the test
    /// ends.
    dead_port: Option<DeadPort>,
}

impl Ledger {
    pub async fn start() -> Ledger {
        let dir = tempfile::tempdir().unwrap();
        let server = ServerProcess::spawn(dir.path()).await;
        Ledger {
            dir,
            server: Some(server),
            http: reqwest::Client::new(),
            dead_port: None,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.as_ref().expect("running").addr
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// A ledger that authenticates: `<data-dir>/tokens.toml` holds an
    /// operator token (which `http` sends, for setup and checks) and one
    /// gateway token per entry of `gateway_subjects`, returned in that order.
    pub async fn start_authenticated(gateway_subjects: &[&str]) -> (Ledger, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let tokens_file = dir.path().join("tokens.toml");
        let create = |principal: &str, args: &[&str]| -> String {
            let out = Command::new(server_bin())
                .args(["token", "create", "--principal", principal, "--tokens-file"])
                .arg(&tokens_file)
                .args(args)
                .output()
                .expect("reservoir token create");
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let operator = create("ops", &["--scope", "operator"]);
        let gateways = gateway_subjects
            .iter()
            .map(|subject| {
                create(
                    &format!("gw-{subject}"),
                    &["--scope", "gateway", "--subject", subject],
                )
            })
            .collect();
        let server = ServerProcess::spawn(dir.path()).await;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {operator}").parse().unwrap(),
        );
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap();
        (
            Ledger {
                dir,
                server: Some(server),
                http,
                dead_port: None,
            },
            gateways,
        )
    }

    /// SIGKILL, reaped, and its port held for the rest of the test, so a
    /// connection to the dead ledger is refused at once ([`DeadPort`]).
    pub fn kill(&mut self) {
        let server = self.server.take().expect("running");
        let addr = server.addr;
        server.kill();
        self.dead_port = Some(DeadPort::hold(addr));
    }

    /// Kills the process and starts another on the same data directory.
    pub async fn restart(&mut self) {
        self.server.take().expect("running").kill();
        self.server = Some(ServerProcess::spawn(self.dir.path()).await);
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base()))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base()))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    /// Publishes generation 1 of a policy (and an estimator, if given).
    pub async fn publish(&self, policy: Value, estimator: Option<Value>) {
        let mut body = json!({"accounting_epoch": "2026-11", "policy": policy});
        if let Some(e) = estimator {
            body["estimator"] = e;
        }
        let (status, answer) = self.post("/v1/policies", body).await;
        assert!(status == 201 || status == 200, "publish: {status} {answer}");
    }

    /// Every partition, each checked for conservation: the server's own check
    /// is `ok`, and the sources equal the destinations when summed here.
    pub async fn assert_conserved(&self) -> Vec<Value> {
        let (status, body) = self.get("/v1/partitions").await;
        assert_eq!(status, 200, "{body}");
        let partitions = body.as_array().unwrap().clone();
        for p in &partitions {
            let term = |name: &str| -> u128 {
                u128::from(p[name].as_u64().unwrap_or_else(|| panic!("{name} in {p}")))
            };
            let sources: u128 = SOURCES.iter().map(|t| term(t)).sum();
            let destinations: u128 = DESTINATIONS.iter().map(|t| term(t)).sum();
            assert_eq!(sources, destinations, "conservation broken: {p}");
            assert_eq!(p["conservation"], "ok", "{p}");
        }
        partitions
    }

    /// The one partition of `subject`/`route`, conserved.
    pub async fn partition(&self, subject: &str, route: &str) -> Value {
        self.assert_conserved()
            .await
            .into_iter()
            .find(|p| p["subject"] == subject && p["route"] == route)
            .unwrap_or_else(|| panic!("no partition {subject}/{route}"))
    }
}

pub const SOURCES: [&str; 5] = [
    "opening_units",
    "minted_units",
    "reminted_units",
    "moved_in_units",
    "overdraft_issued_units",
];
pub const DESTINATIONS: [&str; 6] = [
    "available_units",
    "reserved_units",
    "spent_units",
    "retired_for_emergency_units",
    "overdraft_repaid_units",
    "moved_out_units",
];

/// A policy for tests: `burst` units opening full, no refill to speak of (one
/// unit an hour), so every unit is accounted for by the test's own calls.
pub fn policy(subject: &str, route: &str, burst: u64) -> Value {
    json!({
        "subject": subject, "route": route, "region": "test-1", "capacity_unit": "tokens",
        "refill": {"units": 1, "interval_ms": 3_600_000}, "burst_units": burst,
        "opening_units": burst, "estimator_digest": "", "max_reservation_units": burst,
        "hold_ttl_ms": 180_000, "hard_execution_limit_ms": 600_000,
        "max_overdraft_units": burst, "priority": 0, "emergency_mode": "disabled",
        "shadow_mode": false, "generation": 1
    })
}

/// An estimator whose route default `max_tokens` is `default_max_tokens`.
pub fn estimator(default_max_tokens: u64) -> Value {
    json!({"quantile_ppm": 900_000, "floor_units": 1, "ceiling_units": 4000,
           "min_samples": 100, "default_max_tokens": default_max_tokens})
}

/// A retry policy for tests: quick backoff, a generous deadline.
pub fn quick_retry(deadline: Duration) -> reservoir_client::RetryPolicy {
    reservoir_client::RetryPolicy {
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(100),
        deadline,
        attempt_timeout: Duration::from_secs(5),
        retry_refusals: false,
    }
}
