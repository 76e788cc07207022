//! Test harness: an in-process server on 127.0.0.1:0 over any `EventLog`, a
//! small JSON client, policies, and the conservation check every test ends with.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reservoir_core::Policy;
use reservoir_log::memory::MemoryLog;
use reservoir_log::{Claim, EventLog};
use reservoir_server::config::Config;
use serde_json::{json, Value};
use tokio::sync::oneshot;

pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<Result<(), String>>>,
}

/// A fresh directory for one test's data, inside this process's own
/// directory under the system's temporary one, which is removed when the
/// process exits. The `TempDir` removes itself when the test ends, but an
/// in-process server the test did not stop is dropped only with the test's
/// runtime, after the test's locals: its projector may still be closing its
/// database while the directory is being removed, and the removal then
/// leaves it behind. At exit every projector has closed (see
/// `reservoir_server::queries::ProjectorTask`'s `Drop`). A process killed
/// before its exit handlers ran leaves its directory: the next one removes
/// it ([`remove_orphans`]).
pub fn tempdir() -> std::io::Result<tempfile::TempDir> {
    let parent = TESTS_DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        remove_orphans(&tmp);
        let parent = tmp.join(format!("{TESTS_DIR_PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&parent).expect("the tests' temporary directory");
        // SAFETY: registers a function without arguments, run once at exit.
        unsafe { libc::atexit(remove_tests_dir) };
        parent
    });
    tempfile::tempdir_in(parent)
}

/// A new file at `path` holding `text`, created with `mode` (a key file).
pub fn write_new_file(path: &std::path::Path, text: &str, mode: u32) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// This process's directory of test data (see [`tempdir`]).
static TESTS_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// The name of a test process's directory, before its process id.
const TESTS_DIR_PREFIX: &str = "reservoir-server-tests.";

extern "C" fn remove_tests_dir() {
    if let Some(dir) = TESTS_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Removes the directories in `tmp` of test processes that are gone (killed
/// by a signal, say, so their exit handler never ran). A directory whose
/// process id is in use again is left alone: the next run removes it.
fn remove_orphans(tmp: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(TESTS_DIR_PREFIX))
            .and_then(|p| p.parse::<libc::pid_t>().ok());
        let Some(pid) = pid.filter(|&p| p > 0) else {
            continue;
        };
        // SAFETY: signal 0 sends nothing; it only asks whether `pid` exists.
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Settings for tests: two shards, fast sweeps and refills.
pub fn test_config(data_dir: &std::path::Path) -> Config {
    Config {
        data_dir: data_dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        writer_shards: 2,
        sweep_interval: Duration::from_millis(50),
        refill_interval: Duration::from_millis(100),
        snapshot_interval: None,
        ..Config::default()
    }
}

impl TestServer {
    /// Claims the memory log (a new epoch on every start, as the binary does) and serves it.
    pub async fn start(log: Arc<MemoryLog>, config: Config) -> TestServer {
        let claim = log.claim("test-writer");
        TestServer::start_as(log, config, claim.writer_id, vec![claim.epoch]).await
    }

    /// Starts without waiting for `/readyz`, under an existing claim.
    pub async fn start_unready<L: EventLog>(
        log: Arc<L>,
        config: Config,
        claim: Claim,
    ) -> TestServer {
        TestServer::launch(log, config, claim.writer_id, vec![claim.epoch]).await
    }

    pub async fn start_as<L: EventLog>(
        log: Arc<L>,
        config: Config,
        writer_id: String,
        epochs: Vec<u64>,
    ) -> TestServer {
        let t = TestServer::launch(log, config, writer_id, epochs).await;
        t.wait_ready().await;
        t
    }

    async fn launch<L: EventLog>(
        log: Arc<L>,
        config: Config,
        writer_id: String,
        epochs: Vec<u64>,
    ) -> TestServer {
        TestServer::launch_on(
            log,
            config,
            writer_id,
            epochs,
            reservoir_server::clock::system(),
        )
        .await
    }

    async fn launch_on<L: EventLog>(
        log: Arc<L>,
        config: Config,
        writer_id: String,
        epochs: Vec<u64>,
        clock: reservoir_server::clock::SharedClock,
    ) -> TestServer {
        let (tx, rx) = oneshot::channel::<()>();
        let server =
            reservoir_server::start_with_clock(config, log, writer_id, epochs, clock, async move {
                let _ = rx.await;
            })
            .await
            .expect("server starts");
        TestServer {
            base: format!("http://{}", server.addr),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
            stop: Some(tx),
            done: Some(server.done),
        }
    }

    /// An in-process server on a fresh in-memory log.
    pub async fn memory() -> (
        TestServer,
        Arc<reservoir_log::memory::MemoryLog>,
        tempfile::TempDir,
    ) {
        let dir = tempdir().unwrap();
        let log = Arc::new(reservoir_log::memory::MemoryLog::new());
        let server = TestServer::start(log.clone(), test_config(dir.path())).await;
        (server, log, dir)
    }

    /// An in-process server on the embedded log in `dir` (claimed first, as the binary does).
    pub async fn embedded_in(dir: &std::path::Path) -> TestServer {
        TestServer::embedded_with(test_config(dir)).await
    }

    /// The same with settings of the caller's (the log is in `config.data_dir`).
    pub async fn embedded_with(config: Config) -> TestServer {
        let log =
            reservoir_log::embedded::EmbeddedLog::open(config.data_dir.join("log"), "test-writer")
                .expect("open log");
        let claim = log.claim(0).await.expect("claim");
        TestServer::start_as(Arc::new(log), config, claim.writer_id, vec![claim.epoch]).await
    }

    /// An in-process server on the embedded log in `dir` whose writer and
    /// sweepers read time from `clock` only.
    pub async fn embedded_on_clock(
        dir: &std::path::Path,
        clock: reservoir_server::clock::SharedClock,
    ) -> TestServer {
        let config = test_config(dir);
        let log =
            reservoir_log::embedded::EmbeddedLog::open(config.data_dir.join("log"), "test-writer")
                .expect("open log");
        let claim = log.claim(0).await.expect("claim");
        let t = TestServer::launch_on(
            Arc::new(log),
            config,
            claim.writer_id,
            vec![claim.epoch],
            clock,
        )
        .await;
        t.wait_ready().await;
        t
    }

    /// An in-process server on a fresh embedded log in a temporary directory.
    pub async fn embedded() -> (TestServer, tempfile::TempDir) {
        let dir = tempdir().unwrap();
        let server = TestServer::embedded_in(dir.path()).await;
        (server, dir)
    }

    pub async fn wait_ready(&self) {
        for _ in 0..500 {
            if let Ok(r) = self
                .client
                .get(format!("{}/readyz", self.base))
                .send()
                .await
            {
                if r.status() == StatusCode::OK {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("server never became ready");
    }

    /// Waits for the server to stop by itself (a fatal log error) and returns why.
    pub async fn stopped_by_itself(mut self) -> Result<(), String> {
        let done = self.done.take().unwrap();
        tokio::time::timeout(Duration::from_secs(10), done)
            .await
            .expect("server stopped")
            .unwrap()
    }

    /// Graceful stop, as on SIGTERM.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.done
            .take()
            .unwrap()
            .await
            .unwrap()
            .expect("clean stop");
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        split(self.post_response(path, &body).await).await
    }

    /// The whole answer to a JSON POST, headers included.
    pub async fn post_response(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        split(r).await
    }

    pub async fn publish(&self, policy: &Policy, epoch: &str) -> (StatusCode, Value) {
        self.post(
            "/v1/policies",
            json!({"accounting_epoch": epoch, "policy": policy}),
        )
        .await
    }

    pub async fn reserve(
        &self,
        id: &str,
        subject: &str,
        route: &str,
        units: u64,
    ) -> (StatusCode, Value) {
        self.post(
            "/v1/reservations",
            json!({"id": id, "subject": subject, "route": route, "units": units}),
        )
        .await
    }

    pub async fn partitions(&self) -> Vec<Value> {
        let (status, body) = self.get("/v1/partitions").await;
        assert_eq!(status, StatusCode::OK);
        body.as_array().unwrap().clone()
    }

    /// Conservation on every partition (see [`assert_conserved_at`]).
    pub async fn assert_conserved(&self) -> Vec<Value> {
        assert_conserved_at(&self.client, &self.base).await
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub async fn split(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    let text = r.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, body)
}

/// A policy for tests: `burst` units, opening full, refilling `refill_per_s` per second.
pub fn policy(
    subject: &str,
    route: &str,
    generation: u64,
    burst: u64,
    refill_per_s: u64,
) -> Policy {
    let mut p = Policy::example(subject, route, generation);
    p.burst_units = burst;
    p.opening_units = burst;
    p.max_reservation_units = burst;
    p.refill.units = refill_per_s;
    p.refill.interval_ms = 1_000;
    p.max_overdraft_units = burst;
    p
}

/// A receipt's `log_position` as `?min_position=` takes it (`LP:OFFSET`).
pub fn log_position(receipt: &Value) -> String {
    let p = &receipt["log_position"];
    format!(
        "{}:{}",
        p["log_partition"].as_u64().unwrap(),
        p["offset"].as_u64().unwrap()
    )
}

pub fn problem_type(body: &Value) -> &str {
    body["type"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches("https://reservoir.dev/problems/")
}

/// Polls `f` until it returns `Some`, for at most `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached in {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Conservation and reserved = Σ held, on every partition of the server at
/// `base`, recomputed here too from every term the view shows (all of core's
/// `Term::ALL`).
pub async fn assert_conserved_at(client: &reqwest::Client, base: &str) -> Vec<Value> {
    use reservoir_core::{Side, Term};
    let r = client
        .get(format!("{base}/v1/partitions"))
        .send()
        .await
        .unwrap();
    let (status, body) = split(r).await;
    assert_eq!(status, StatusCode::OK);
    let parts = body.as_array().unwrap().clone();
    // The primary dimension's terms, then every further dimension's.
    let ledgers = parts.iter().flat_map(|p| {
        let further = p["dimensions"].as_array().cloned().unwrap_or_default();
        std::iter::once(p.clone()).chain(further)
    });
    for p in ledgers {
        let p = &p;
        assert_eq!(p["conservation"], "ok", "{p}");
        let side = |side: Side| -> u128 {
            Term::ALL
                .iter()
                .filter(|t| t.side() == side)
                .map(|t| {
                    let v = p[t.name()].as_u64();
                    u128::from(v.unwrap_or_else(|| panic!("{} missing in {p}", t.name())))
                })
                .sum()
        };
        assert_eq!(side(Side::Source), side(Side::Destination), "{p}");
        let u = |k: &str| u128::from(p[k].as_u64().unwrap());
        assert_eq!(
            u("debt_units"),
            u("overdraft_issued_units") + u("debt_moved_in_units")
                - u("overdraft_repaid_units")
                - u("debt_moved_out_units"),
            "{p}"
        );
    }
    parts
}

/// A directory left by a test process that is gone is removed; the
/// directories of live processes, and anything else, are not.
#[test]
fn the_directory_of_a_killed_test_process_is_removed_by_the_next() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("runs `true`");
    let gone = child.id();
    child.wait().expect("`true` exits");
    let orphan = tmp.path().join(format!("{TESTS_DIR_PREFIX}{gone}"));
    let alive = tmp
        .path()
        .join(format!("{TESTS_DIR_PREFIX}{}", std::process::id()));
    let other = tmp.path().join(format!("{TESTS_DIR_PREFIX}x"));
    for dir in [&orphan, &alive, &other] {
        std::fs::create_dir_all(dir.join("data/projections")).expect("a directory");
    }
    remove_orphans(tmp.path());
    assert!(!orphan.exists(), "the gone process's directory stays");
    assert!(alive.exists(), "a live process's directory was removed");
    assert!(
        other.exists(),
        "a directory not named by a process id was removed"
    );
}
