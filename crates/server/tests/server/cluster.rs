//! Cluster mode on a Kafka-protocol broker (Apache Kafka in `scripts/test`): three
//! `reservoir` processes on loopback share one topic through a consumer group.
//! One scenario, in steps: the nodes split the partitions and any node answers
//! for any partition; a SIGKILLed node's partitions are taken over with every
//! acknowledged reservation intact; a node paused with SIGSTOP past its session
//! is fenced when it wakes. After the whole run the topic is replayed through
//! `fence::valid_records` and crates/core: every acknowledged step is there, and
//! conservation holds in every partition. The raw topic is read too: every
//! record the rule skips was written under a claim that took effect and was
//! superseded; n2's are superseded by n1's claims and name nothing n2
//! acknowledged; and of the requests n2 got while paused, exactly the ones it
//! answered 2xx count. Also: `docker-compose.yml` parses and
//! its commands use the binary's real flags.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use reqwest::StatusCode;
use reservoir_core::{try_apply, Partition, PartitionKey};
use reservoir_log::fence::{read_valid, Validity, Verdict};
use reservoir_log::kafka::{log_partition_of_route, KafkaConfig, KafkaLog};
use reservoir_log::{Claim, EventReader, LogEntry, Position};
use reservoir_testkit::DeadPort;
use serde_json::{json, Value};

use crate::kafka::brokers;
use crate::support::*;

const SESSION_TIMEOUT_MS: &str = "6000";
pub(super) const PARTITIONS: u32 = 6;

pub(super) struct Node {
    child: Child,
    port: u16,
    /// The node's own data dir (its projection database), removed after it.
    _data: tempfile::TempDir,
}

impl Node {
    /// SIGKILL, reaped, and its port held while the answer lives: the
    /// clients and the other nodes find no one there ([`DeadPort`]).
    pub(super) fn kill(self) -> DeadPort {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        drop(self);
        DeadPort::hold(addr)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Milliseconds n2 waits before acting on a lost assignment (fault injection,
/// see `reservoir_server::cluster::membership::REVOKE_DELAY_ENV`): long enough
/// for the requests it received while paused to reach its writers and the log.
const N2_LOST_REVOKE_DELAY_MS: &str = "3000";

/// The `reservoir` binary the nodes run: cargo's, or `RESERVOIR_TEST_SERVER_BIN`
/// when set. Checkouts that share one target directory (worktrees of this
/// repository) share its `release/reservoir` too, and the last build wins; a
/// repeated run pins its own copy with the variable.
pub(super) fn server_bin() -> String {
    std::env::var("RESERVOIR_TEST_SERVER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_reservoir").to_string())
}

/// Starts a cluster node on `brokers` with `extra` arguments, which must
/// make it exit at start: its stderr.
pub(super) fn refused_at_start(brokers: &str, topic: &str, extra: &[std::ffi::OsString]) -> String {
    let dir = tempdir().unwrap();
    let mut child = Command::new(server_bin())
        .args([
            "serve",
            "--log",
            "kafka",
            "--brokers",
            brokers,
            "--topic",
            topic,
        ])
        .args([
            "--cluster-group",
            "g",
            "--node-id",
            "k1",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{extra:?}: the node was still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{extra:?}: {stderr}");
    stderr
}

fn spawn_node(
    brokers: &str,
    topic: &str,
    id: &str,
    port: u16,
    peers: &str,
    extra: &[String],
) -> Node {
    let data = crate::support::tempdir().unwrap();
    let delay = if id == "n2" {
        N2_LOST_REVOKE_DELAY_MS
    } else {
        "0"
    };
    let child = Command::new(server_bin())
        .args([
            "serve",
            "--log",
            "kafka",
            "--brokers",
            brokers,
            "--topic",
            topic,
        ])
        .args([
            "--cluster-group",
            &format!("{topic}.group"),
            "--node-id",
            id,
        ])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--peers", peers])
        .args(["--session-timeout-ms", SESSION_TIMEOUT_MS])
        .args(["--topic-partitions", &PARTITIONS.to_string()])
        .args(["--writer-shards", "2", "--sweep-interval-ms", "200"])
        .args(extra)
        .arg("--data-dir")
        .arg(data.path())
        .env(
            reservoir_server::cluster::membership::REVOKE_DELAY_ENV,
            delay,
        )
        .env("RESERVOIR_LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("RESERVOIR_TEST_VERBOSE").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("spawn reservoir");
    Node {
        child,
        port,
        _data: data,
    }
}

pub(super) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(40))
        .build()
        .unwrap()
}

/// Waits until `base` sees every partition served, by the nodes in `owners` only.
/// Waits until every partition is served by one of `owners`; with `every_owner_serves`, also
/// until each of them serves at least one (a member that joins late would
/// otherwise be seen owning nothing).
pub(super) async fn wait_served(
    http: &reqwest::Client,
    base: &str,
    owners: &[&str],
    every_owner_serves: bool,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let mut last = Value::Null;
    while Instant::now() < deadline {
        if let Ok(r) = http.get(format!("{base}/v1/cluster")).send().await {
            if let Ok(view) = r.json::<Value>().await {
                let parts = view["partitions"].as_array().cloned().unwrap_or_default();
                let ok = parts.len() == PARTITIONS as usize
                    && parts.iter().all(|p| {
                        p["state"] == "serving"
                            && owners.contains(&p["node_id"].as_str().unwrap_or(""))
                    })
                    && (!every_owner_serves
                        || owners
                            .iter()
                            .all(|o| parts.iter().any(|p| p["node_id"] == *o)));
                if ok {
                    return;
                }
                last = view;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("partitions not served by {owners:?} in {timeout:?}: {last:#}");
}

/// `GET /v1/cluster` as `base` sees it.
pub(super) async fn cluster_view(http: &reqwest::Client, base: &str) -> Value {
    http.get(format!("{base}/v1/cluster"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// [`wait_served`] as seen by every node in `bases`: a node routes by its own
/// view, so a test that reads through a node waits for that node's view, not
/// only another's.
async fn wait_served_by_all(
    http: &reqwest::Client,
    bases: &[String],
    owners: &[&str],
    every_owner_serves: bool,
    timeout: Duration,
) {
    for base in bases {
        wait_served(http, base, owners, every_owner_serves, timeout).await;
    }
}

/// Posts with retries on 503 and connection errors (same id, as a client would).
pub(super) async fn post(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match http.post(format!("{base}{path}")).json(&body).send().await {
            Ok(r) if r.status() != StatusCode::SERVICE_UNAVAILABLE => return split(r).await,
            Ok(_) | Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Ok(r) => return split(r).await,
            Err(e) => panic!("{base}{path}: {e}"),
        }
    }
}

/// The log partitions `node` serves in a `GET /v1/cluster` view.
pub(super) fn served_by(view: &Value, node: &str) -> BTreeSet<u32> {
    view["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .filter(|v| v["node_id"] == node)
        .map(|v| v["log_partition"].as_u64().expect("log_partition") as u32)
        .collect()
}

/// The first `tenant-N` for which `wanted` holds of the log partition each
/// route is placed in (`placed(route)`).
pub(super) fn subject_where(wanted: impl Fn(&dyn Fn(&str) -> u32) -> bool) -> String {
    (0..10_000)
        .map(|i| format!("tenant-{i}"))
        .find(|s| wanted(&|route| log_partition_of_route(s, route, PARTITIONS)))
        .expect("a subject placed as wanted")
}

/// `GET base path`, split into status and JSON.
pub(super) async fn get(http: &reqwest::Client, base: &str, path: &str) -> (StatusCode, Value) {
    split(http.get(format!("{base}{path}")).send().await.unwrap()).await
}

/// Publishes `policy` for accounting epoch `e` through `base`.
pub(super) async fn publish(http: &reqwest::Client, base: &str, policy: &reservoir_core::Policy) {
    let body = json!({"accounting_epoch": "e", "policy": policy});
    let (s, r) = post(http, base, "/v1/policies", body).await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
}

/// `GET base/metrics`.
pub(super) async fn metrics_text(http: &reqwest::Client, base: &str) -> String {
    let answer = http.get(format!("{base}/metrics")).send().await.unwrap();
    answer.text().await.unwrap()
}

/// The value of the metric `series` (its name and labels, as exposed) on the
/// node at `base`; 0 while it has none.
pub(super) async fn metric(http: &reqwest::Client, base: &str, series: &str) -> u64 {
    let text = metrics_text(http, base).await;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

/// The sum of every series of the metric `name` on the node at `base`.
pub(super) async fn metric_sum(http: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = metrics_text(http, base).await;
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Waits until `read` gives `want`, then reads it five times more, a
/// quarter of a second apart: a gauge that flips between writers fails.
pub(super) async fn steadily<F: std::future::Future<Output = f64>>(
    what: &str,
    want: f64,
    read: impl Fn() -> F,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut got = read().await;
    while got != want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = read().await;
    }
    for _ in 0..5 {
        assert_eq!(got, want, "{what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
        got = read().await;
    }
    assert_eq!(got, want, "{what}");
}

/// What clients were told: id → (state, actual units).
pub(super) type Acked = BTreeMap<String, (String, Option<u64>)>;

/// reserve → start → settle for `ids`, each step through a different node.
async fn cycles(http: &reqwest::Client, bases: &[String], ids: &[String], acked: &mut Acked) {
    for (i, id) in ids.iter().enumerate() {
        let subject = format!("tenant-{}", i % 12);
        let node = |k: usize| bases[(i + k) % bases.len()].clone();
        let (s, r) = post(
            http,
            &node(0),
            "/v1/reservations",
            json!({"id": id, "subject": subject, "route": "chat", "units": 10}),
        )
        .await;
        assert!(s.is_success(), "reserve {id}: {s} {r}");
        acked.insert(id.clone(), ("RESERVED".into(), None));
        if i % 3 == 0 {
            continue;
        }
        let (s, r) = post(
            http,
            &node(1),
            &format!("/v1/reservations/{id}/start"),
            json!({"operation_id": format!("op-{id}")}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "start {id}: {r}");
        acked.insert(id.clone(), ("STARTED".into(), None));
        let (s, r) = post(
            http,
            &node(2),
            &format!("/v1/reservations/{id}/settle"),
            json!({"actual_units": 4}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "settle {id}: {r}");
        assert_eq!(r["state"], "SETTLED");
        acked.insert(id.clone(), ("SETTLED".into(), Some(4)));
    }
}

/// A record the validity rule skipped, and the claim that superseded its own.
struct Fenced {
    position: Position,
    writer_id: String,
    claim_epoch: u64,
    superseded_by: Claim,
    /// Reservations its events name.
    ids: Vec<String>,
}

/// What the topic says after the run.
pub(super) struct Replay {
    /// Reservation id → (state, actual units), from the records that count.
    pub(super) found: HashMap<String, (String, Option<u64>)>,
    /// Entries the rule skipped: claims and fenced records.
    skipped: u64,
    /// Every record the rule skipped, read from the raw topic.
    fenced: Vec<Fenced>,
    /// Reservation id → the first record that counts and names it.
    written_at: HashMap<String, Position>,
}

/// Reads every entry of log partition `p` (claims and all records, valid or
/// not) and feeds it through the validity rule. Returns the offsets of the
/// records that count and every record it skips, after checking that each
/// skipped record was written under a claim that took effect in `p` and was
/// superseded by a later one (the rule skips nothing else: no record without a
/// claim, none of the claim holder's).
async fn read_raw(log: &KafkaLog, p: u32) -> (Vec<u64>, Vec<Fenced>, HashMap<String, Position>) {
    let end = log.end_offset(p).await.unwrap();
    let mut validity = Validity::default();
    let mut accepted: Vec<Claim> = Vec::new();
    let (mut counts, mut fenced) = (Vec::new(), Vec::new());
    let mut written_at = HashMap::new();
    let mut next = 0;
    while next < end {
        let entries = log.read(p, next, 1024).await.expect("raw read");
        assert!(
            !entries.is_empty(),
            "partition {p}: nothing at {next} < end {end}"
        );
        for (position, entry) in entries {
            next = position.offset + 1;
            let verdict = validity.observe(&entry);
            let record = match entry {
                LogEntry::Claim(claim) => {
                    if verdict == Verdict::ClaimAccepted {
                        accepted.push(claim);
                    }
                    continue;
                }
                LogEntry::Record(record) => record,
            };
            let holder = accepted.last();
            let holds = holder
                .is_some_and(|c| c.writer_id == record.writer_id && c.epoch == record.claim_epoch);
            assert_eq!(
                verdict == Verdict::Counts,
                holds,
                "{position:?}: {verdict:?} for a record of {}@{} under {holder:?}",
                record.writer_id,
                record.claim_epoch
            );
            if holds {
                counts.push(position.offset);
                for id in record.events.iter().filter_map(|e| e.body.reservation_id()) {
                    written_at.entry(id.to_string()).or_insert(position);
                }
                continue;
            }
            let own = accepted
                .iter()
                .position(|c| c.writer_id == record.writer_id && c.epoch == record.claim_epoch)
                .unwrap_or_else(|| {
                    panic!(
                        "{position:?}: skipped record of {}@{} whose claim never took effect",
                        record.writer_id, record.claim_epoch
                    )
                });
            let superseded_by = accepted.last().unwrap().clone();
            assert!(
                own + 1 < accepted.len() && superseded_by.epoch > record.claim_epoch,
                "{position:?}: skipped record of {}@{} not superseded (latest {superseded_by:?})",
                record.writer_id,
                record.claim_epoch
            );
            let ids = record
                .events
                .iter()
                .filter_map(|e| e.body.reservation_id().map(|id| id.to_string()))
                .collect();
            fenced.push(Fenced {
                position,
                writer_id: record.writer_id,
                claim_epoch: record.claim_epoch,
                superseded_by,
                ids,
            });
        }
    }
    (counts, fenced, written_at)
}

/// Replays the whole topic through the one validity rule and crates/core;
/// checks conservation everywhere and that every acknowledged step counts.
/// Also reads the raw topic, to find (and check) what the rule skipped.
pub(super) async fn replay_and_check(brokers: &str, topic: &str, acked: &Acked) -> Replay {
    let mut config = KafkaConfig::new(brokers, "cluster-test-reader");
    config.topic = topic.to_string();
    let log = KafkaLog::connect(config).await.expect("reader");
    let mut partitions: HashMap<PartitionKey, Partition> = HashMap::new();
    let mut skipped = 0u64;
    let mut fenced = Vec::new();
    let mut written_at = HashMap::new();
    for p in 0..log.log_partitions() {
        let everything = log.end_offset(p).await.unwrap();
        let (records, _validity) = read_valid(&log, p).await.expect("read_valid");
        let claims_and_fenced = everything - records.len() as u64;
        skipped += claims_and_fenced;
        let (raw_counts, raw_fenced, raw_written_at) = read_raw(&log, p).await;
        assert_eq!(
            records.iter().map(|(at, _)| at.offset).collect::<Vec<_>>(),
            raw_counts,
            "partition {p}: read_valid and the raw read disagree on what counts"
        );
        fenced.extend(raw_fenced);
        written_at.extend(raw_written_at);
        for (position, record) in records {
            assert_eq!(log.log_partition_for(&record.key), p, "placement");
            let partition = partitions.entry(record.key.clone()).or_default();
            for event in &record.events {
                try_apply(partition, event)
                    .unwrap_or_else(|e| panic!("{position:?} {}: {e}", record.key));
            }
        }
    }
    let mut found: HashMap<String, (String, Option<u64>)> = HashMap::new();
    for (key, partition) in &partitions {
        partition
            .check_invariants()
            .unwrap_or_else(|e| panic!("conservation broken in {key}: {e}"));
        for (id, r) in &partition.reservations {
            let state = format!("{:?}", r.state).to_uppercase();
            found.insert(id.to_string(), (state, r.actual_units));
        }
    }
    for (id, (state, actual)) in acked {
        let (got_state, got_actual) = found
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged {id} does not count in the log"));
        // A later step may have been decided but not acknowledged (a retry
        // answered 503): the log may be ahead of what the client was told.
        let rank = |s: &str| match s {
            "RESERVED" => 0,
            "STARTED" => 1,
            "SETTLED" => 2,
            _ => 3,
        };
        assert!(
            rank(got_state) >= rank(state),
            "{id}: acknowledged {state}, log says {got_state}"
        );
        if state == "SETTLED" {
            assert_eq!(got_actual, actual, "{id}");
        }
    }
    Replay {
        found,
        skipped,
        fenced,
        written_at,
    }
}

/// A topic no earlier run used (`reservoir.<name>.…`), and a node per id on
/// it, each other's peers on free ports, once every node sees every one of
/// them serving. Returns the topic, the nodes' URLs and the nodes.
pub(super) async fn start_cluster(
    brokers: &str,
    name: &str,
    ids: &[&str],
) -> (String, Vec<String>, Vec<Option<Node>>) {
    start_cluster_with(brokers, name, ids, &[]).await
}

/// [`start_cluster`], every node given the flags `extra` as well.
pub(super) async fn start_cluster_with(
    brokers: &str,
    name: &str,
    ids: &[&str],
    extra: &[String],
) -> (String, Vec<String>, Vec<Option<Node>>) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("reservoir.{name}.{}.{nanos}", std::process::id());
    let ports: Vec<u16> = ids.iter().map(|_| free_port()).collect();
    let bases: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let peers = bases.join(",");
    let nodes = ids
        .iter()
        .zip(ports)
        .map(|(id, port)| Some(spawn_node(brokers, &topic, id, port, &peers, extra)))
        .collect();
    wait_served_by_all(&client(), &bases, ids, true, Duration::from_secs(60)).await;
    (topic, bases, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_split_route_fail_over_and_fence() {
    let Some(brokers) = brokers() else { return };
    let (topic, bases, mut nodes) =
        start_cluster(&brokers, "cluster-test", &["n1", "n2", "n3"]).await;
    let http = client();
    // Every node holds some partitions.
    let view = cluster_view(&http, &bases[1]).await;
    for id in ["n1", "n2", "n3"] {
        assert!(
            view["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["node_id"] == id),
            "{id} owns nothing: {view:#}"
        );
    }

    // Policies published through one node, reservations through all: the
    // answer is the owner's whichever node is asked.
    for t in 0..12 {
        let p = policy(&format!("tenant-{t}"), "chat", 1, 100_000, 0);
        let (s, r) = post(
            &http,
            &bases[t % 3],
            "/v1/policies",
            json!({"accounting_epoch": "e", "policy": p}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
    }
    let mut acked = Acked::new();
    let ids: Vec<String> = (0..36).map(|i| format!("a-{i}")).collect();
    cycles(&http, &bases, &ids, &mut acked).await;
    for (i, base) in bases.iter().enumerate() {
        let (s, r) = split(
            http.get(format!("{base}/v1/reservations/a-{}", i + 1))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{r}");
    }

    // SIGKILL n3: n1 and n2 take its partitions; everything acknowledged is there.
    // The reads below go through n2, so wait until n2 (not only n1) sees every
    // partition served: right after the takeover n1 served a partition n2 still
    // thought had no owner (a 503 to a read, once in a full run on tansu).
    let killed = nodes[2].take().unwrap();
    let kill_started = Instant::now();
    let _n3_port = killed.kill();
    let live = vec![bases[0].clone(), bases[1].clone()];
    wait_served_by_all(&http, &live, &["n1", "n2"], false, Duration::from_secs(60)).await;
    eprintln!(
        "cluster: takeover after SIGKILL of n3 took {:.1} s (session timeout {SESSION_TIMEOUT_MS} ms)",
        kill_started.elapsed().as_secs_f64()
    );
    for (id, (state, _)) in &acked {
        let (s, r) = split(
            http.get(format!("{}/v1/reservations/{id}", bases[1]))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{id} after the kill: {r}");
        assert_eq!(&r["state"], state.as_str(), "{id}");
    }
    let ids: Vec<String> = (0..12).map(|i| format!("b-{i}")).collect();
    cycles(&http, &live, &ids, &mut acked).await;

    // SIGSTOP n2 past its session: n1 claims everything. Requests sent to n2
    // meanwhile wait in its socket. They name subjects of the partitions n2
    // serves, so when it wakes its writers decide them under claims n1 has
    // superseded; whatever it answers 2xx must count, and whatever it wrote
    // under a lost claim must not (checked on the raw topic below).
    let view = cluster_view(&http, &bases[0]).await;
    let n2_partitions: Vec<u32> = view["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["node_id"] == "n2" && p["state"] == "serving")
        .map(|p| p["log_partition"].as_u64().unwrap() as u32)
        .collect();
    assert!(!n2_partitions.is_empty(), "n2 serves nothing: {view:#}");
    let zombie_subjects: Vec<String> = n2_partitions
        .iter()
        .map(|&p| {
            (0..)
                .map(|k| format!("zombie-{k}"))
                .find(|s| log_partition_of_route(s, "chat", PARTITIONS) == p)
                .unwrap()
        })
        .collect();
    for subject in &zombie_subjects {
        let (s, r) = post(
            &http,
            &bases[0],
            "/v1/policies",
            json!({"accounting_epoch": "e", "policy": policy(subject, "chat", 1, 100_000, 0)}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
    }
    // Outlives the pause: a request given up on by the client could still be
    // decided by n2 after it answered nothing.
    let patient = reqwest::Client::builder()
        .timeout(Duration::from_secs(180))
        .build()
        .unwrap();
    // One idle keep-alive connection per request to come: the requests then
    // wait in sockets n2 already polls, not in its accept backlog, and reach
    // its writers after SIGCONT, while its group consumer (delayed by the
    // injected fault, see N2_LOST_REVOKE_DELAY_MS) has not yet acted on the
    // lost assignment. Without the delay n2 wrote in about one run of five.
    let warm: Vec<_> = (0..6)
        .map(|_| {
            let http = patient.clone();
            let base = bases[1].clone();
            tokio::spawn(async move { http.get(format!("{base}/healthz")).send().await })
        })
        .collect();
    for w in warm {
        let r = w.await.unwrap().expect("n2 answers /healthz");
        assert!(r.status().is_success(), "n2 /healthz: {}", r.status());
        let _ = r.bytes().await;
    }
    let n2_pid = nodes[1].as_ref().unwrap().child.id() as i32;
    unsafe { libc::kill(n2_pid, libc::SIGSTOP) };
    let stalled: Vec<_> = (0..6)
        .map(|i| {
            let http = patient.clone();
            let base = bases[1].clone();
            let subject = zombie_subjects[i % zombie_subjects.len()].clone();
            tokio::spawn(async move {
                let id = format!("z-{i}");
                let request = json!({"id": id, "subject": subject, "route": "chat", "units": 10});
                let answer = http
                    .post(format!("{base}/v1/reservations"))
                    .json(&request)
                    .send()
                    .await;
                let (status, body) = match answer {
                    Ok(r) => (Some(r.status()), r.text().await.unwrap_or_default()),
                    Err(e) => (None, e.to_string()),
                };
                (id, request, status, body)
            })
        })
        .collect();
    wait_served(&http, &bases[0], &["n1"], false, Duration::from_secs(60)).await;
    let ids: Vec<String> = (0..6).map(|i| format!("c-{i}")).collect();
    cycles(&http, &bases[..1], &ids, &mut acked).await;
    unsafe { libc::kill(n2_pid, libc::SIGCONT) };
    // (id, request, n2's status, n2's body)
    let mut zombie_answers: Vec<(String, Value, Option<StatusCode>, String)> = Vec::new();
    for task in stalled {
        let (id, request, status, body) = task.await.unwrap();
        if status.is_some_and(|s| s.is_success()) {
            acked.insert(id.clone(), ("RESERVED".into(), None));
        }
        zombie_answers.push((id, request, status, body));
    }
    // n2 rejoins and gets partitions again; the cluster serves everything.
    wait_served_by_all(&http, &live, &["n1", "n2"], false, Duration::from_secs(60)).await;
    let ids: Vec<String> = (0..12).map(|i| format!("d-{i}")).collect();
    cycles(&http, &live, &ids, &mut acked).await;
    // What n2 did not acknowledge is in doubt for its client, which retries
    // it with the same id: the retry must succeed, and its receipt must name
    // the one record that counts (written now, or earlier by n2 under a claim
    // it still held, before it could answer).
    let mut retried: BTreeMap<String, Position> = BTreeMap::new();
    for (id, request, status, body) in &zombie_answers {
        if status.is_some_and(|s| s.is_success()) {
            continue;
        }
        let problem: Value = serde_json::from_str(body).unwrap_or_default();
        assert!(
            status.is_none() || problem["retryable"] == true,
            "{id}: n2 answered {status:?} ({body}), which does not say to retry"
        );
        let (s, receipt) = post(&http, &bases[0], "/v1/reservations", request.clone()).await;
        assert!(s.is_success(), "{id}: the retry answered {s}: {receipt}");
        let at = &receipt["log_position"];
        retried.insert(
            id.clone(),
            Position {
                log_partition: at["log_partition"].as_u64().unwrap() as u32,
                offset: at["offset"].as_u64().unwrap(),
            },
        );
        acked.insert(id.clone(), ("RESERVED".into(), None));
    }

    drop(nodes);
    let replay = replay_and_check(&brokers, &topic, &acked).await;
    // n2's records that its lost claims make not count: written after n1's
    // claims, never acknowledged, absent from the replayed state.
    let zombie: Vec<&Fenced> = replay
        .fenced
        .iter()
        .filter(|f| f.writer_id.starts_with("n2@"))
        .collect();
    for f in &zombie {
        assert!(
            f.superseded_by.writer_id.starts_with("n1@"),
            "{:?}: n2's record under epoch {} superseded by {:?}, not by n1",
            f.position,
            f.claim_epoch,
            f.superseded_by
        );
        eprintln!(
            "cluster: fenced record of n2 at {}:{} under epoch {} (n1 holds epoch {}): {:?}",
            f.position.log_partition,
            f.position.offset,
            f.claim_epoch,
            f.superseded_by.epoch,
            f.ids
        );
    }
    let zombie_ids: BTreeSet<&str> = zombie
        .iter()
        .flat_map(|f| f.ids.iter().map(String::as_str))
        .collect();
    for (id, _, status, body) in &zombie_answers {
        let acknowledged = status.is_some_and(|s| s.is_success());
        assert!(
            replay.found.contains_key(id),
            "{id}: n2 answered {status:?} ({body}); it does not count even after the retry"
        );
        assert!(
            !(acknowledged && zombie_ids.contains(id.as_str())),
            "{id}: n2 acknowledged it and wrote it under a lost claim"
        );
        if let Some(receipt) = retried.get(id) {
            assert_eq!(
                replay.written_at.get(id),
                Some(receipt),
                "{id}: the retry's receipt names another record than the one that counts"
            );
        }
    }
    eprintln!(
        "cluster: {} acknowledged reservations all count; {} claims or fenced records skipped; \
         {} fenced records ({} of n2, naming {zombie_ids:?}); n2 answered {zombie_answers:?}",
        acked.len(),
        replay.skipped,
        replay.fenced.len(),
        zombie.len()
    );
    // n2 acts on a lost assignment only N2_LOST_REVOKE_DELAY_MS after waking,
    // so the requests it received while paused usually reach its writers and
    // the log under its superseded claims (3 runs of 4 here; without the delay
    // 1 of 5). Sometimes its HTTP layer already routes them to n1 (they are
    // then acknowledged by n1 and count): the zombie writes are checked when
    // they happen, and their absence is reported, not failed.
    if zombie.is_empty() {
        eprintln!(
            "cluster: NOTE n2 wrote no record under its lost claims this run: \
             the fence was not exercised here"
        );
    }
}

/// `docker-compose.yml` parses, has Kafka in KRaft mode (the test broker's
/// version and settings) and two nodes whose commands the real `reservoir`
/// command line accepts in cluster mode.
#[test]
fn docker_compose_uses_the_real_flags() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docker-compose.yml");
    let text = std::fs::read_to_string(path).expect("docker-compose.yml at the repository root");
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("valid YAML");
    let services = doc["services"].as_mapping().expect("services");
    let kafka = &doc["services"]["kafka"];
    assert!(kafka["image"].as_str().unwrap().starts_with("apache/kafka"));
    assert_eq!(
        kafka["environment"]["KAFKA_PROCESS_ROLES"].as_str(),
        Some("broker,controller"),
        "KRaft mode"
    );
    // The same broker as the tests: version from scripts/kafka-broker/pom.xml,
    // and every setting scripts/kafka gives the test broker (except the ones
    // naming its ports and directories).
    let scripts = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts");
    let pom = std::fs::read_to_string(format!("{scripts}/kafka-broker/pom.xml")).unwrap();
    let version = pom
        .split_once("<kafka.version>")
        .and_then(|(_, rest)| rest.split_once("</kafka.version>"))
        .expect("kafka.version in the pom")
        .0;
    assert_eq!(
        kafka["image"].as_str(),
        Some(format!("apache/kafka:{version}").as_str()),
        "the Kafka the tests run"
    );
    let script = std::fs::read_to_string(format!("{scripts}/kafka")).unwrap();
    let settings = script
        .split_once("<<PROPS\n")
        .and_then(|(_, rest)| rest.split_once("\nPROPS\n"))
        .expect("the broker settings in scripts/kafka")
        .0;
    let mut compared = 0;
    for line in settings.lines().filter(|line| !line.contains('$')) {
        let (key, value) = line.split_once('=').expect("key=value");
        let variable = format!("KAFKA_{}", key.replace('.', "_").to_uppercase());
        assert_eq!(
            kafka["environment"][variable.as_str()].as_str(),
            Some(value),
            "docker-compose.yml sets {variable} as scripts/kafka sets {key}"
        );
        compared += 1;
    }
    assert!(
        compared >= 10,
        "read the settings of scripts/kafka ({compared})"
    );
    let mut nodes = 0;
    let mut shard_keys = BTreeSet::new();
    for (name, service) in services {
        let Some(command) = service["command"].as_sequence() else {
            continue;
        };
        let args: Vec<String> = command
            .iter()
            .map(|a| a.as_str().expect("string args").to_string())
            .collect();
        if args.first().map(String::as_str) != Some("serve") {
            continue;
        }
        nodes += 1;
        let cli = reservoir_server::config::Cli::try_parse_from(
            std::iter::once("reservoir".to_string()).chain(args.clone()),
        )
        .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        let reservoir_server::config::CliCommand::Serve(serve) = cli.command else {
            panic!("{name:?} is not serve");
        };
        let config = serve.resolve().unwrap_or_else(|e| panic!("{name:?}: {e}"));
        let cluster = config.cluster.expect("cluster mode");
        assert_eq!(config.brokers.as_deref(), Some("kafka:9092"), "{name:?}");
        assert_eq!(cluster.group, "reservoir", "{name:?}");
        assert!(!cluster.peers.is_empty(), "{name:?}");
        // Beyond loopback a node must authenticate callers and its peers.
        assert!(
            config.auth.tokens_file.is_some(),
            "{name:?} has a tokens file"
        );
        assert!(
            config.auth.node_token_file.is_some(),
            "{name:?} has a node credential"
        );
        // Shards verify on every node only with one key for all of them.
        shard_keys.insert(
            config
                .shard_key_file
                .unwrap_or_else(|| panic!("{name:?} names no --shard-key-file")),
        );
        assert!(
            service["depends_on"].as_mapping().is_some()
                || service["depends_on"].as_sequence().is_some(),
            "{name:?} waits for kafka"
        );
    }
    assert_eq!(nodes, 2, "two reservoir nodes");
    assert_eq!(shard_keys.len(), 1, "one shard key: {shard_keys:?}");
    let secrets = format!("{:?}", doc["services"]["secrets"]["entrypoint"]);
    let key = shard_keys.first().unwrap().file_name().unwrap();
    assert!(
        secrets.contains(&format!("> {}", key.to_str().unwrap())),
        "the secrets service writes {key:?}: {secrets}"
    );
}
