//! The real `reservoir` binary on the embedded log, as a child process.
//!
//! `sigkill_mid_batch_loses_nothing_acknowledged`: concurrent clients run
//! reserve → start → settle cycles, retrying each step with the same ids across
//! restarts, while the server is SIGKILLed several times and restarted on the
//! same data directory. Afterwards every acknowledged step is still there (the
//! same or a later state), each reservation was reserved and settled exactly
//! once in the log, `spent` equals the sum of settled units, and conservation
//! holds for every partition, both as the server reports it and as a replay of
//! the log with `reservoir_core` finds it.
//!
//! `sigterm_finishes_the_batch_in_flight`: SIGTERM under load exits 0, and every
//! acknowledged reservation is in the log after a restart.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reservoir_core::{EventBody, Partition};
use reservoir_testkit::StderrTail;
use serde_json::{json, Value};

use crate::support::*;

/// Restarts (in this test binary) that recovered from a snapshot plus the log after it.
static SNAPSHOT_RECOVERIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub struct ServerProcess {
    pub child: Child,
    pub base: String,
    stderr: StderrTail,
}

impl ServerProcess {
    /// SIGTERM, then its exit status: a bounded wait, so a server that does
    /// not stop fails the test with its stacks and last log lines.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        reservoir_testkit::terminate(&mut self.child, "reservoir serve", Some(&self.stderr))
    }
}

/// Starts `reservoir serve` on `data_dir` and a free port; returns once `/readyz` is 200.
async fn spawn_server(data_dir: &Path) -> ServerProcess {
    spawn_server_with(data_dir, &[]).await
}

/// Lines a server of this test binary logged on stopping at a failpoint.
pub static FAILPOINT_PAUSES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Same, with extra `reservoir serve` arguments.
pub async fn spawn_server_with(data_dir: &Path, extra: &[&str]) -> ServerProcess {
    spawn_server_env(data_dir, extra, &[]).await
}

/// Same, with extra environment variables (test failpoints).
pub async fn spawn_server_env(
    data_dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> ServerProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(["serve", "--listen", "127.0.0.1:0", "--writer-shards", "2"])
        .args([
            "--sweep-interval-ms",
            "100",
            "--snapshot-interval-secs",
            "1",
        ])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .env("RESERVOIR_LOG_LEVEL", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn reservoir");
    let (tx, rx) = std::sync::mpsc::channel();
    let mut tx = Some(tx);
    let verbose = std::env::var_os("RESERVOIR_TEST_VERBOSE").is_some();
    let stderr = StderrTail::follow(child.stderr.take().unwrap(), move |line| {
        if let Some(addr) = line.split("addr=").nth(1) {
            if let Some(tx) = tx.take() {
                let _ = tx.send(addr.split_whitespace().next().unwrap_or("").to_string());
            }
        }
        if line.contains("failpoint: paused") {
            FAILPOINT_PAUSES.fetch_add(1, Ordering::SeqCst);
        }
        if line.contains("recovered from the log") && line.contains("from_snapshot=true") {
            SNAPSHOT_RECOVERIES.fetch_add(1, Ordering::SeqCst);
        }
        if verbose {
            eprintln!("[reservoir] {line}");
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server printed its address");
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await {
            if r.status() == StatusCode::OK {
                break;
            }
        }
        assert!(Instant::now() < deadline, "not ready in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ServerProcess {
        child,
        base,
        stderr,
    }
}

/// What a client was told, per reservation.
#[derive(Clone, Debug, Default)]
struct Acked {
    reserved: bool,
    started: bool,
    settled_units: Option<u64>,
}

/// Sends one step until the server answers 2xx, across kills and restarts.
async fn until_ok(
    client: &reqwest::Client,
    base: &RwLock<String>,
    path: &str,
    body: &Value,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let url = format!("{}{path}", base.read().unwrap());
        if let Ok(resp) = client.post(url).json(body).send().await {
            let status = resp.status();
            let (_, value) = split(resp).await;
            if status.is_success() {
                return value;
            }
            assert!(
                status == StatusCode::SERVICE_UNAVAILABLE,
                "{path} {body}: unexpected {status} {value}"
            );
        }
        assert!(Instant::now() < deadline, "{path} never succeeded");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Replays the log in `data_dir` with the core and checks it: every partition
/// conserves, each reservation is reserved and settled at most once, and spent
/// is the sum of settled units. Returns the replayed partitions.
async fn replay_and_check(data_dir: &Path) -> BTreeMap<String, Partition> {
    let log = reservoir_log::embedded::EmbeddedLog::open(data_dir.join("log"), "replay-check")
        .expect("open log");
    let (records, _) = reservoir_log::fence::read_valid(&log, 0)
        .await
        .expect("read log");
    let mut partitions: BTreeMap<String, Partition> = BTreeMap::new();
    let mut reserved: HashMap<String, u32> = HashMap::new();
    let mut settled: HashMap<String, u32> = HashMap::new();
    let mut settled_units: BTreeMap<String, u64> = BTreeMap::new();
    for (_, record) in records {
        let p = partitions.entry(record.key.to_string()).or_default();
        for event in &record.events {
            reservoir_core::try_apply(p, event)
                .unwrap_or_else(|e| panic!("replay of {}: {e}", record.key));
            p.check_invariants()
                .expect("conservation after every event");
            match &event.body {
                EventBody::Reserved { id, .. } => *reserved.entry(id.to_string()).or_default() += 1,
                EventBody::Settled {
                    id, actual_units, ..
                } => {
                    *settled.entry(id.to_string()).or_default() += 1;
                    *settled_units.entry(record.key.to_string()).or_default() += actual_units;
                }
                _ => {}
            }
        }
    }
    assert!(
        reserved.values().all(|&n| n == 1),
        "a reservation was created twice"
    );
    assert!(
        settled.values().all(|&n| n == 1),
        "a reservation was settled twice"
    );
    for (key, p) in &partitions {
        assert_eq!(
            p.ledger.spent_units,
            settled_units.get(key).copied().unwrap_or(0),
            "{key}"
        );
    }
    partitions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_batch_loses_nothing_acknowledged() {
    const CLIENTS: usize = 12;
    /// Upper bound per client; clients stop once the kills are done.
    const CYCLES_MAX: usize = 20_000;
    const KILLS: usize = 5;
    let dir = crate::support::tempdir().unwrap();
    let server = spawn_server(dir.path()).await;
    let base = Arc::new(RwLock::new(server.base.clone()));
    let server = Arc::new(Mutex::new(server));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for subject in ["t0", "t1", "t2"] {
        let p = policy(subject, "chat", 1, 1_000_000_000, 0);
        until_ok(
            &client,
            &base,
            "/v1/policies",
            &json!({"accounting_epoch": "e", "policy": p}),
        )
        .await;
    }

    let acked: Arc<Mutex<HashMap<String, Acked>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (client, base, acked, done) =
            (client.clone(), base.clone(), acked.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..CYCLES_MAX {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                let id = format!("c{c}-{i}");
                let subject = format!("t{}", c % 3);
                let units = 100 + (i as u64 % 7) * 10;
                let body = json!({"id": id, "subject": subject, "route": "chat", "units": units});
                let r = until_ok(&client, &base, "/v1/reservations", &body).await;
                assert_eq!(r["reserved_units"], units);
                acked
                    .lock()
                    .unwrap()
                    .entry(id.clone())
                    .or_default()
                    .reserved = true;
                let path = format!("/v1/reservations/{id}/start");
                until_ok(
                    &client,
                    &base,
                    &path,
                    &json!({"operation_id": format!("op-{id}")}),
                )
                .await;
                acked.lock().unwrap().get_mut(&id).unwrap().started = true;
                let actual = units / 2 + (i as u64 % 50);
                let path = format!("/v1/reservations/{id}/settle");
                let r = until_ok(&client, &base, &path, &json!({"actual_units": actual})).await;
                assert_eq!(r["actual_units"], actual);
                acked.lock().unwrap().get_mut(&id).unwrap().settled_units = Some(actual);
            }
        }));
    }

    // The killer decides when the load stops: after KILLS kills and restarts.
    let kills = {
        let (server, base, dir) = (server.clone(), base.clone(), dir.path().to_path_buf());
        let acked = acked.clone();
        let mut kills = 0;
        for k in 0..KILLS {
            // Some runs outlive the 1 s snapshot interval, so some restarts
            // recover from a periodic snapshot plus the log after its cut.
            tokio::time::sleep(Duration::from_millis([1_400, 300, 1_700, 450, 600][k % 5])).await;
            let in_progress = acked.lock().unwrap().len();
            let mut old = std::mem::replace(&mut *server.lock().unwrap(), placeholder());
            old.child.kill().expect("SIGKILL");
            old.child.wait().unwrap();
            kills += 1;
            eprintln!("kill {kills}: {in_progress} reservations acknowledged so far");
            let fresh = spawn_server(&dir).await;
            *base.write().unwrap() = fresh.base.clone();
            *server.lock().unwrap() = fresh;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        kills
    };
    done.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(kills, KILLS);
    assert!(
        SNAPSHOT_RECOVERIES.load(Ordering::SeqCst) >= 1,
        "some restart used a periodic snapshot"
    );

    // One more restart, then check every acknowledged step.
    let mut last = std::mem::replace(&mut *server.lock().unwrap(), placeholder());
    last.child.kill().unwrap();
    last.child.wait().unwrap();
    let fresh = spawn_server(dir.path()).await;
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > CLIENTS * 10,
        "load ran through the kills ({} cycles)",
        acked.len()
    );
    for (id, a) in &acked {
        let r: Value = client
            .get(format!("{}/v1/reservations/{id}", fresh.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(a.reserved);
        match a.settled_units {
            Some(units) => {
                assert_eq!(r["state"], "SETTLED", "{id}: {r}");
                assert_eq!(r["actual_units"], units);
            }
            None => panic!("every cycle finished, {id} was not settled"),
        }
    }
    let views: Vec<Value> = client
        .get(format!("{}/v1/partitions", fresh.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(views.len(), 3);
    for v in &views {
        assert_eq!(v["conservation"], "ok", "{v}");
        assert_eq!(v["reserved_units"], 0);
    }
    let mut fresh = fresh;
    assert!(fresh.terminate().success());

    let partitions = replay_and_check(dir.path()).await;
    assert_eq!(partitions.len(), 3);
    let total_spent: u64 = partitions.values().map(|p| p.ledger.spent_units).sum();
    let acked_spent: u64 = acked.values().filter_map(|a| a.settled_units).sum();
    assert_eq!(
        total_spent, acked_spent,
        "nothing debited twice, nothing lost"
    );
}

async fn post(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    body: &Value,
) -> (StatusCode, Value) {
    split(
        client
            .post(format!("{base}{path}"))
            .json(body)
            .send()
            .await
            .unwrap(),
    )
    .await
}

fn placeholder() -> ServerProcess {
    // A finished process standing in while the real one restarts.
    let child = Command::new("true").spawn().unwrap();
    ServerProcess {
        child,
        base: String::new(),
        stderr: StderrTail::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_batch_in_flight() {
    let dir = crate::support::tempdir().unwrap();
    let mut server = spawn_server(dir.path()).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let p = policy("t", "r", 1, 1_000_000_000, 0);
    let body = json!({"accounting_epoch": "e", "policy": p});
    let (status, _) = post(&client, &server.base, "/v1/policies", &body).await;
    assert_eq!(status, StatusCode::CREATED);
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..16 {
        let (client, base, acked) = (client.clone(), server.base.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..1_000 {
                let id = format!("s{c}-{i}");
                let body = json!({"id": id, "subject": "t", "route": "r", "units": 1});
                match client
                    .post(format!("{base}/v1/reservations"))
                    .json(&body)
                    .send()
                    .await
                {
                    Ok(r) if r.status() == StatusCode::CREATED => acked.lock().unwrap().push(id),
                    _ => return,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let status = server.terminate();
    assert!(status.success(), "graceful exit, got {status}");
    for t in tasks {
        t.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(!acked.is_empty());
    let partitions = replay_and_check(dir.path()).await;
    let p = partitions.values().next().unwrap();
    for id in &acked {
        let id = reservoir_core::ReservationId::new(id.clone()).unwrap();
        assert!(
            p.reservation(&id).is_some(),
            "acknowledged {id} is in the log"
        );
    }
}

/// A client that never finishes its request cannot hold a SIGTERM open: after
/// `--shutdown-grace-ms` the server closes what is still open and exits 0,
/// with every acknowledged reservation in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_not_held_open_by_a_request_never_finished() {
    use tokio::io::AsyncWriteExt;

    let dir = crate::support::tempdir().unwrap();
    let mut server = spawn_server_with(dir.path(), &["--shutdown-grace-ms", "300"]).await;
    let client = reqwest::Client::new();
    let p = policy("t", "r", 1, 1_000, 0);
    let body = json!({"accounting_epoch": "e", "policy": p});
    let (status, _) = post(&client, &server.base, "/v1/policies", &body).await;
    assert_eq!(status, StatusCode::CREATED);
    let body = json!({"id": "kept", "subject": "t", "route": "r", "units": 10});
    let (status, _) = post(&client, &server.base, "/v1/reservations", &body).await;
    assert_eq!(status, StatusCode::CREATED);
    // Headers complete, a body of 100 bytes announced, 10 sent: the request
    // is in flight for as long as this client keeps the connection.
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stalled
        .write_all(
            b"POST /v1/reservations HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\": \"st",
        )
        .await
        .unwrap();
    stalled.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // `client` keeps its idle keep-alive connection open too.
    let status = server.terminate();
    assert!(status.success(), "graceful exit, got {status}");
    drop(stalled);
    let partitions = replay_and_check(dir.path()).await;
    let p = partitions.values().next().unwrap();
    let kept = reservoir_core::ReservationId::new("kept".to_string()).unwrap();
    assert!(
        p.reservation(&kept).is_some(),
        "the acknowledged reserve is in the log"
    );
    assert_eq!(
        p.ledger.reserved_units, 10,
        "the unfinished request reserved nothing"
    );
}
