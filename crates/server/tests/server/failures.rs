//! A failed append discards the batch's speculative state: every client of the
//! batch gets a retryable 503, nothing of it is visible, and retrying with the
//! same ids succeeds exactly once. Driven by the in-memory log's fault injection.

use std::sync::Arc;

use reqwest::StatusCode;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_answers_503_and_leaves_no_trace() {
    let (s, log, _dir) = TestServer::memory().await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    let before = log.len();
    log.fail_next_appends(1);
    let resp = s
        .client
        .post(format!("{}/v1/reservations", s.base))
        .json(&serde_json::json!({"id": "x", "subject": "t", "route": "r", "units": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    let (_, body) = split(resp).await;
    assert_eq!(problem_type(&body), "unavailable");
    assert_eq!(body["retryable"], true);
    assert_eq!(log.len(), before, "nothing appended");
    assert_eq!(s.get("/v1/reservations/x").await.0, StatusCode::NOT_FOUND);
    let parts = s.assert_conserved().await;
    assert_eq!(
        parts[0]["available_units"], 1_000,
        "speculative debit undone"
    );
    assert_eq!(parts[0]["last_sequence"], 1);

    let (status, r) = s.reserve("x", "t", "r", 300).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["reserved_units"], 300);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_retry_through_failed_batches_and_debit_once() {
    let (s, log, _dir) = TestServer::memory().await;
    s.publish(&policy("t", "r", 1, 1_000_000, 0), "e").await;
    let s = Arc::new(s);
    log.fail_next_appends(3);
    let mut tasks = Vec::new();
    for i in 0..40 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut unavailable = 0;
            for _ in 0..20 {
                let (status, body) = s.reserve(&format!("c-{i}"), "t", "r", 10).await;
                match status {
                    StatusCode::CREATED | StatusCode::OK => return (unavailable, body),
                    StatusCode::SERVICE_UNAVAILABLE => unavailable += 1,
                    other => panic!("unexpected {other}: {body}"),
                }
            }
            panic!("never succeeded");
        }));
    }
    let mut saw_503 = 0;
    for t in tasks {
        let (unavailable, body) = t.await.unwrap();
        assert_eq!(body["state"], "RESERVED");
        saw_503 += unavailable;
    }
    assert!(
        saw_503 >= 3,
        "three failed batches answered 503 ({saw_503})"
    );
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["reserved_units"], 400);
    assert_eq!(parts[0]["reservations"], 40);
    // Each reservation is in the log exactly once.
    let reserved_events = log
        .records()
        .iter()
        .flat_map(|r| r.events.iter())
        .filter(|e| matches!(e.body, reservoir_core::EventBody::Reserved { .. }))
        .count();
    assert_eq!(reserved_events, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_log_error_answers_503_and_stops_the_server_for_a_restart() {
    let (s, log, dir) = TestServer::memory().await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    s.reserve("before", "t", "r", 100).await;
    log.fail_next_append_fatally();
    let (status, body) = s.reserve("lost", "t", "r", 100).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let why = s.stopped_by_itself().await.unwrap_err();
    assert!(why.contains("log failed"), "{why}");
    // A restart recovers from the log: the failed batch is not there, the rest is.
    let s = TestServer::start(log, test_config(dir.path())).await;
    assert_eq!(s.get("/v1/reservations/before").await.0, StatusCode::OK);
    assert_eq!(
        s.get("/v1/reservations/lost").await.0,
        StatusCode::NOT_FOUND
    );
    let (status, _) = s.reserve("lost", "t", "r", 100).await;
    assert_eq!(status, StatusCode::CREATED);
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["reserved_units"], 200);
    s.stop().await;
}
