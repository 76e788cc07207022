//! The read side outside `reservoir serve`'s own process: `reservoir project`
//! (the projector and the query API alone) following a Kafka topic or a
//! running server's embedded log, and cluster nodes answering the queries from
//! their own projection of the whole topic. Each answers with `?min_position=`
//! from a write's receipt, agrees with the writer's own projection, leaves the
//! writer unfenced (a projector never claims), and every state-changing test
//! ends by checking conservation on the balances the projections answer.
//! Also: the `projector` service of `docker-compose.yml` parses with the real
//! command line, and bad `reservoir project` input exits 2 with a message.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use reqwest::StatusCode;
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::EventReader;
use reservoir_server::config::{Cli, CliCommand, ProjectSource};
use serde_json::{json, Value};

use crate::kafka::brokers;
use crate::support::*;

/// A child process, killed (and reaped) on drop.
struct Process {
    child: Child,
    base: String,
}

impl Drop for Process {
    fn drop(&mut self) {
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

fn stderr() -> Stdio {
    if std::env::var_os("RESERVOIR_TEST_VERBOSE").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    }
}

fn spawn(args: &[&str], port: u16) -> Process {
    let child = Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RESERVOIR_LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(stderr())
        .spawn()
        .expect("spawn reservoir");
    Process {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

/// `reservoir project` on a fresh port, once `/readyz` says the projection is open.
async fn spawn_projector(args: &[&str]) -> Process {
    let mut all = vec!["project"];
    all.extend_from_slice(args);
    let mut p = spawn(&all, free_port());
    let http = client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = http.get(format!("{}/readyz", p.base)).send().await {
            if r.status() == StatusCode::OK {
                return p;
            }
        }
        if let Ok(Some(status)) = p.child.try_wait() {
            panic!("reservoir project exited: {status}");
        }
        assert!(Instant::now() < deadline, "projector not ready in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn get(base: &str, path: &str) -> (StatusCode, Value) {
    split(client().get(format!("{base}{path}")).send().await.unwrap()).await
}

fn unique_topic() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("reservoir.projector-test.{}.{nanos}", std::process::id())
}

/// Every term of a projected ledger balances (and says so).
fn assert_ledger_conserved(ledger: &Value) {
    assert_eq!(ledger["conservation"], "ok", "{ledger}");
    let u = |k: &str| ledger[k].as_u64().unwrap();
    assert_eq!(
        u("opening_units")
            + u("minted_units")
            + u("reminted_units")
            + u("moved_in_units")
            + u("overdraft_issued_units"),
        u("available_units")
            + u("reserved_units")
            + u("spent_units")
            + u("retired_for_emergency_units")
            + u("overdraft_repaid_units")
            + u("moved_out_units"),
        "{ledger}"
    );
}

/// A balances answer: conserved in total and in every partition.
fn assert_balances_conserved(balances: &Value) {
    assert_ledger_conserved(&balances["total"]["ledger"]);
    let parts = balances["partitions"].as_array().expect("partitions");
    assert!(!parts.is_empty(), "{balances}");
    for p in parts {
        assert_ledger_conserved(&p["ledger"]);
        let u = |k: &str| p["ledger"][k].as_u64().unwrap();
        assert_eq!(
            p["debt_units"].as_u64().unwrap(),
            u("overdraft_issued_units") - u("overdraft_repaid_units"),
            "{p}"
        );
    }
}

/// Balances of `tenant` at `base`, no older than `min_position`.
async fn balances(base: &str, tenant: &str, min_position: &str) -> Value {
    let (status, body) = get(
        base,
        &format!("/v1/tenants/{tenant}/balances?min_position={min_position}&wait_ms=10000"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{base}: {body}");
    body
}

/// Waits until both projections have consumed the same log prefix, then
/// requires the same balances from both (the writers' sweepers may still be
/// appending, so the prefixes are compared before the answers).
async fn assert_same_balances(a: &str, b: &str, tenant: &str, min_position: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let x = balances(a, tenant, min_position).await;
        let y = balances(b, tenant, min_position).await;
        if x["projected_to"] == y["projected_to"] {
            assert_eq!(x, y, "{a} and {b} disagree");
            return x;
        }
        assert!(
            Instant::now() < deadline,
            "{a} and {b} never at one log prefix: {} vs {}",
            x["projected_to"],
            y["projected_to"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publish, reserve, start and settle `id` (and a second reservation left
/// open) on `s`; returns the settle receipt.
async fn lifecycle(s: &TestServer, tenant: &str, id: &str) -> Value {
    let (status, body) = s.publish(&policy(tenant, "chat", 1, 10_000, 0), "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, r) = s.reserve(id, tenant, "chat", 1_000).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let (status, r) = s
        .post(
            &format!("/v1/reservations/{id}/start"),
            json!({"operation_id": format!("op-{id}")}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let (status, settled) = s
        .post(
            &format!("/v1/reservations/{id}/settle"),
            json!({"actual_units": 600}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{settled}");
    let (status, r) = s.reserve(&format!("{id}-open"), tenant, "chat", 500).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    settled
}

/// The projector's record of `id` at the settle's position, and the same
/// balances as the writer's own projection.
async fn check_projector(s: &TestServer, projector: &str, tenant: &str, id: &str, settled: &Value) {
    let at = log_position(settled);
    let (status, record) = get(
        projector,
        &format!("/v1/projections/reservations/{id}?min_position={at}&wait_ms=10000"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{record}");
    assert_eq!(record["state"], "SETTLED", "{record}");
    assert_eq!(record["actual_units"], 600, "{record}");
    assert_eq!(record["operation_id"], format!("op-{id}"), "{record}");
    let (status, body) = get(projector, "/v1/projections/reservations/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = get(projector, "/v1/reservations/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no write side: {body}");

    let b = assert_same_balances(&s.base, projector, tenant, &at).await;
    assert_balances_conserved(&b);
    let ledger = &b["total"]["ledger"];
    assert_eq!(ledger["spent_units"], 600, "{b}");
    assert_eq!(ledger["reserved_units"], 500, "{b}");

    // The projector never claimed: the writer still decides and appends.
    let (status, r) = s
        .post(&format!("/v1/reservations/{id}-open/release"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "writer fenced? {r}");
    let b = balances(projector, tenant, &log_position(&r)).await;
    assert_balances_conserved(&b);
    assert_eq!(b["total"]["ledger"]["reserved_units"], 0, "{b}");
    s.assert_conserved().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn project_follows_a_kafka_topic_read_only() {
    let Some(brokers) = brokers() else { return };
    let topic = unique_topic();
    let dir = crate::support::tempdir().unwrap();
    let mut kafka = KafkaConfig::new(brokers.clone(), "projector-test-writer");
    kafka.topic = topic.clone();
    kafka.partitions_for_new_topic = 3;
    let log = KafkaLog::connect(kafka).await.expect("kafka");
    let mut epochs = Vec::new();
    for p in 0..log.log_partitions() {
        epochs.push(log.claim(p).await.expect("claim").epoch);
    }
    let mut config = test_config(dir.path());
    config.log = reservoir_server::config::LogKind::Kafka;
    config.brokers = Some(brokers.clone());
    config.topic = topic.clone();
    let s = TestServer::start_as(
        Arc::new(log),
        config,
        "projector-test-writer".into(),
        epochs,
    )
    .await;
    let settled = lifecycle(&s, "acme", "k-1").await;

    let projector_dir = crate::support::tempdir().unwrap();
    let projector = spawn_projector(&[
        "--log",
        "kafka",
        "--brokers",
        &brokers,
        "--topic",
        &topic,
        "--data-dir",
        projector_dir.path().to_str().unwrap(),
    ])
    .await;
    check_projector(&s, &projector.base, "acme", "k-1", &settled).await;
    let (status, metrics) = get(&projector.base, "/metrics").await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn project_follows_a_running_servers_embedded_log() {
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_in(dir.path()).await;
    let settled = lifecycle(&s, "acme", "e-1").await;
    // The server holds its RocksDB lock throughout; the projector reads as a
    // secondary, given the server's data directory.
    let projector_dir = crate::support::tempdir().unwrap();
    let projector = spawn_projector(&[
        "--log",
        "embedded",
        "--log-dir",
        dir.path().to_str().unwrap(),
        "--data-dir",
        projector_dir.path().to_str().unwrap(),
    ])
    .await;
    check_projector(&s, &projector.base, "acme", "e-1", &settled).await;
}

/// Bad input: a clear message and exit code 2, never a panic.
#[test]
fn project_refuses_bad_input_with_exit_code_2() {
    let dir = crate::support::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    for (args, says) in [
        (vec!["--log", "kafka"], "--brokers"),
        (vec!["--log", "bogus"], "invalid value 'bogus'"),
        (vec!["--log", "memory"], "invalid value 'memory'"),
        (
            vec!["--log", "embedded", "--brokers", "h:9092"],
            "--log-dir",
        ),
        (vec!["--log-dir", data, "--data-dir", data], "--data-dir"),
        (vec!["--listen", "not-an-address"], "--listen"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_reservoir"))
            .arg("project")
            .args(&args)
            .env_remove("RESERVOIR_BROKERS")
            .env_remove("RESERVOIR_LOG")
            .output()
            .expect("run reservoir");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // Not a log directory: refused at start with the reason (exit 1).
    let out = Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args([
            "project",
            "--log-dir",
            "/nonexistent/log",
            "--data-dir",
            data,
        ])
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("run reservoir");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not an embedded log directory"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The `projector` service of `docker-compose.yml` runs `reservoir project`
/// on the nodes' Kafka topic, with the real command line.
#[test]
fn docker_compose_has_a_projector_service() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docker-compose.yml");
    let text = std::fs::read_to_string(path).expect("docker-compose.yml at the repository root");
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("valid YAML");
    let service = &doc["services"]["projector"];
    let args: Vec<String> = service["command"]
        .as_sequence()
        .expect("projector command")
        .iter()
        .map(|a| a.as_str().expect("string args").to_string())
        .collect();
    let cli = Cli::try_parse_from(std::iter::once("reservoir".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("projector: {e}"));
    let CliCommand::Project(project) = cli.command else {
        panic!("the projector service does not run `reservoir project`");
    };
    let config = project.resolve().expect("projector settings");
    let node_topic = doc["services"]["reservoir-1"]["command"]
        .as_sequence()
        .unwrap()
        .windows(2)
        .find(|w| w[0].as_str() == Some("--topic"))
        .map(|w| w[1].as_str().unwrap().to_string())
        .expect("the nodes name their topic");
    assert_eq!(
        config.log,
        ProjectSource::Kafka {
            brokers: "kafka:9092".into(),
            topic: node_topic
        }
    );
    assert!(
        service["depends_on"]["kafka"].is_mapping(),
        "the projector waits for kafka"
    );
    assert!(
        !text.contains("no standalone projector"),
        "stale comment in docker-compose.yml"
    );
}

/// Two cluster nodes: each projects the whole topic and answers queries
/// itself, at the position of a write made through either node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_nodes_answer_queries_from_their_own_projection() {
    let Some(brokers) = brokers() else { return };
    let topic = unique_topic();
    let ports = [free_port(), free_port()];
    let peers = format!(
        "http://127.0.0.1:{},http://127.0.0.1:{}",
        ports[0], ports[1]
    );
    let dirs = [
        crate::support::tempdir().unwrap(),
        crate::support::tempdir().unwrap(),
    ];
    let group = format!("{topic}.group");
    let nodes: Vec<Process> = (0..2)
        .map(|i| {
            let id = format!("n{i}");
            spawn(
                &[
                    "serve",
                    "--log",
                    "kafka",
                    "--brokers",
                    &brokers,
                    "--topic",
                    &topic,
                    "--topic-partitions",
                    "4",
                    "--cluster-group",
                    &group,
                    "--node-id",
                    &id,
                    "--peers",
                    &peers,
                    "--session-timeout-ms",
                    "6000",
                    "--writer-shards",
                    "2",
                    "--data-dir",
                    dirs[i].path().to_str().unwrap(),
                ],
                ports[i],
            )
        })
        .collect();
    let http = client();
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    // Every partition served, and each node serving some.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let view = match http.get(format!("{}/v1/cluster", bases[0])).send().await {
            Ok(r) => r.json::<Value>().await.unwrap_or_default(),
            Err(_) => Value::Null,
        };
        let parts = view["partitions"].as_array().cloned().unwrap_or_default();
        let owners: std::collections::BTreeSet<_> = parts
            .iter()
            .filter_map(|p| p["node_id"].as_str().map(str::to_string))
            .collect();
        if parts.len() == 4 && parts.iter().all(|p| p["state"] == "serving") && owners.len() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "cluster not serving: {view:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let post = |base: String, path: String, body: Value| {
        let http = http.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let r = http.post(format!("{base}{path}")).json(&body).send().await;
                if let Ok(r) = r {
                    let (status, body) = split(r).await;
                    if status != StatusCode::SERVICE_UNAVAILABLE || Instant::now() > deadline {
                        return (status, body);
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // Tenants spread over the partitions, written through alternating nodes.
    let tenants: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    let mut last = Vec::new();
    for (i, tenant) in tenants.iter().enumerate() {
        let via = bases[i % 2].clone();
        let p = policy(tenant, "chat", 1, 10_000, 0);
        let (status, body) = post(
            via.clone(),
            "/v1/policies".into(),
            json!({"accounting_epoch": "e", "policy": p}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let id = format!("c-{tenant}");
        let (status, r) = post(
            via.clone(),
            "/v1/reservations".into(),
            json!({"id": id, "subject": tenant, "route": "chat", "units": 800}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        let (status, r) = post(
            via.clone(),
            format!("/v1/reservations/{id}/start"),
            json!({"operation_id": "op"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        let (status, settled) = post(
            via,
            format!("/v1/reservations/{id}/settle"),
            json!({"actual_units": 300}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{settled}");
        last.push((tenant.clone(), id, log_position(&settled)));
    }
    // Each node answers every tenant at the write's position, from its own
    // projection (no forwarding: the answer names this node's prefix).
    for (tenant, id, at) in &last {
        for base in &bases {
            let (status, record) = get(
                base,
                &format!("/v1/projections/reservations/{id}?min_position={at}&wait_ms=10000"),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{base}: {record}");
            assert_eq!(record["state"], "SETTLED", "{base}: {record}");
            assert_eq!(record["actual_units"], 300, "{record}");
            assert_eq!(record["projected_to"].as_array().unwrap().len(), 4);
            let b = balances(base, tenant, at).await;
            assert_balances_conserved(&b);
            assert_eq!(b["total"]["ledger"]["spent_units"], 300, "{base}: {b}");
        }
        let b = assert_same_balances(&bases[0], &bases[1], tenant, at).await;
        assert_balances_conserved(&b);
    }
    // A position the topic has not reached: 409, from the topic's own end.
    let (status, body) = get(
        &bases[1],
        "/v1/tenants/t0/balances?min_position=0:999999999&wait_ms=50",
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(problem_type(&body), "position_beyond_log", "{body}");
    drop(nodes);
}
