//! The sweepers act by sending commands: an unstarted lease expires and its
//! units come back; a started call past its hard execution limit becomes
//! USAGE_UNKNOWN, which only an operation receipt resolves.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unstarted_lease_expires_and_refunds() {
    let (s, _dir) = TestServer::embedded().await;
    let mut p = policy("t", "r", 1, 1_000, 0);
    p.hold_ttl_ms = 200;
    s.publish(&p, "e").await;
    let (status, r) = s.reserve("lease", "t", "r", 700).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(r["state"], "RESERVED");
    let expired = eventually(Duration::from_secs(5), || async {
        let (_, r) = s.get("/v1/reservations/lease").await;
        (r["state"] == "EXPIRED").then_some(r)
    })
    .await;
    assert!(expired["log_position"]["offset"].as_u64() > r["log_position"]["offset"].as_u64());
    // Too late to start it.
    let (status, body) = s
        .post(
            "/v1/reservations/lease/start",
            json!({"operation_id": "op"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&body), "wrong_state");
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["available_units"], 1_000);
    assert_eq!(parts[0]["reserved_units"], 0);
    assert!(s.metrics().await.contains("reservoir_expired_total"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_call_past_its_limit_becomes_usage_unknown() {
    let (s, _dir) = TestServer::embedded().await;
    let mut p = policy("t", "r", 1, 1_000, 0);
    p.hard_execution_limit_ms = 200;
    s.publish(&p, "e").await;
    s.reserve("slow", "t", "r", 600).await;
    let (status, _) = s
        .post(
            "/v1/reservations/slow/start",
            json!({"operation_id": "op-9"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    eventually(Duration::from_secs(5), || async {
        let (_, r) = s.get("/v1/reservations/slow").await;
        (r["state"] == "USAGE_UNKNOWN").then_some(())
    })
    .await;
    // UNKNOWN is never treated as unused: the units stay reserved.
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["reserved_units"], 600);
    assert_eq!(parts[0]["available_units"], 400);
    // Only an operation receipt (naming the operation) resolves it.
    let (status, body) = s
        .post("/v1/reservations/slow/settle", json!({"actual_units": 250}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(problem_type(&body), "wrong_state");
    let (status, body) = s
        .post(
            "/v1/reservations/slow/settle",
            json!({"actual_units": 250, "operation_id": "op-other"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&body), "exists_with_different_operation_id");
    let (status, r) = s
        .post(
            "/v1/reservations/slow/settle",
            json!({"actual_units": 250, "operation_id": "op-9"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["state"], "SETTLED");
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["spent_units"], 250);
    assert_eq!(parts[0]["available_units"], 750);
    s.stop().await;
}
