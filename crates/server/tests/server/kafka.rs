//! `reservoir serve --log kafka`: one node on a Kafka-protocol broker (Apache Kafka in
//! `scripts/test`). Runs when `RESERVOIR_TEST_BROKERS` names a broker; under
//! `CI=true` a missing broker is a failure, not a skip.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::crash::spawn_server_with;
use crate::support::*;

pub(crate) fn brokers() -> Option<String> {
    match std::env::var("RESERVOIR_TEST_BROKERS") {
        Ok(b) if !b.is_empty() => Some(b),
        _ if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true but RESERVOIR_TEST_BROKERS is not set")
        }
        _ => {
            eprintln!(
                "skipping: RESERVOIR_TEST_BROKERS not set (scripts/test starts Apache Kafka)"
            );
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_on_kafka_serves_and_recovers_from_the_topic() {
    let Some(brokers) = brokers() else { return };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("reservoir.server-test.{}.{nanos}", std::process::id());
    let dir = crate::support::tempdir().unwrap();
    let args = [
        "--log",
        "kafka",
        "--brokers",
        brokers.as_str(),
        "--topic",
        topic.as_str(),
    ];
    let mut server = spawn_server_with(dir.path(), &args).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let post = |base: String, path: &'static str, body: Value| {
        let client = client.clone();
        async move {
            split(
                client
                    .post(format!("{base}{path}"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    let p = policy("t", "r", 1, 1_000, 0);
    let (status, body) = post(
        server.base.clone(),
        "/v1/policies",
        json!({"accounting_epoch": "e", "policy": p}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, r) = post(
        server.base.clone(),
        "/v1/reservations",
        json!({"id": "k-1", "subject": "t", "route": "r", "units": 600}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    post(
        server.base.clone(),
        "/v1/reservations/k-1/start",
        json!({"operation_id": "op"}),
    )
    .await;
    let (status, settled) = post(
        server.base.clone(),
        "/v1/reservations/k-1/settle",
        json!({"actual_units": 200}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{settled}");
    assert!(server.terminate().success());

    // A new process claims every partition again and rebuilds from the topic.
    let mut server = spawn_server_with(dir.path(), &args).await;
    let (status, got) = split(
        client
            .get(format!("{}/v1/reservations/k-1", server.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got, settled);
    let (status, parts) = split(
        client
            .get(format!("{}/v1/partitions", server.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(parts[0]["conservation"], "ok");
    assert_eq!(parts[0]["spent_units"], 200);
    assert_eq!(parts[0]["available_units"], 800);
    let (status, _) = post(
        server.base.clone(),
        "/v1/reservations",
        json!({"id": "k-2", "subject": "t", "route": "r", "units": 100}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(server.terminate().success());
}
