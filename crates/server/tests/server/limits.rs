//! Limit refusals: 429 with a conservative Retry-After and nothing about anyone
//! else; request-too-large refused unconditionally; debt freezes admission until
//! refills repay it.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insufficient_capacity_is_429_with_retry_after() {
    let (s, _dir) = TestServer::embedded().await;
    // 1,000-unit bucket refilling 10 units a second.
    s.publish(&policy("t", "r", 7, 1_000, 10), "e").await;
    let (status, _) = s.reserve("a", "t", "r", 900).await;
    assert_eq!(status, StatusCode::CREATED);
    let resp = s
        .client
        .post(format!("{}/v1/reservations", s.base))
        .json(&json!({"id": "b", "subject": "t", "route": "r", "units": 500}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let retry_after: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // 400 more units, but "a" holds 900 of the 1,000 burst, so refill cannot
    // add them while it does: not before its lease (the 180 s hold TTL), by
    // which an unstarted hold is gone. (Refill alone, 40 s, would be too early.)
    assert_eq!(retry_after, 180, "Retry-After {retry_after}");
    let (_, body) = split(resp).await;
    assert_eq!(problem_type(&body), "insufficient_capacity");
    assert_eq!(body["status"], 429);
    assert_eq!(body["policy_generation"], 7);
    assert_eq!(body["limiting_dimension"], "tokens");
    assert!(body["title"].is_string() && body["detail"].is_string());
    let text = body.to_string();
    assert!(
        !text.contains("available") && !text.contains("100"),
        "no balances in a refusal: {text}"
    );
    // The refusal was logged (AdmissionRefused) and counted; no reservation exists.
    let (status, _) = s.get("/v1/reservations/b").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["refusals"], 1);
    assert!(s
        .metrics()
        .await
        .contains("reservoir_refusals_total{reason=\"insufficient_capacity\",route=\"r\"}"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_too_large_has_its_own_type_even_with_a_full_bucket() {
    let (s, _dir) = TestServer::embedded().await;
    let mut p = policy("t", "r", 1, 1_000, 10);
    p.max_reservation_units = 500;
    s.publish(&p, "e").await;
    let resp = s
        .client
        .post(format!("{}/v1/reservations", s.base))
        .json(&json!({"id": "big", "subject": "t", "route": "r", "units": 501}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        resp.headers().get("retry-after").is_none(),
        "retrying cannot help"
    );
    let (_, body) = split(resp).await;
    assert_eq!(problem_type(&body), "request_too_large");
    assert_eq!(body["policy_generation"], 1);
    assert_eq!(body["retryable"], false);
    let (status, _) = s.reserve("fits", "t", "r", 500).await;
    assert_eq!(status, StatusCode::CREATED);
    s.assert_conserved().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdraft_freezes_admission_until_refill_repays_the_debt() {
    let (s, _dir) = TestServer::embedded().await;
    // 1,000-unit bucket, 300 units a second of refill.
    s.publish(&policy("t", "r", 1, 1_000, 300), "e").await;
    s.reserve("a", "t", "r", 1_000).await;
    s.post("/v1/reservations/a/start", json!({"operation_id": "op"}))
        .await;
    // Uses 1,900: 1,000 held, what refilled meanwhile from available, the rest is debt.
    let (status, r) = s
        .post("/v1/reservations/a/settle", json!({"actual_units": 1_900}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["state"], "SETTLED_WITH_DEBT");
    let parts = s.assert_conserved().await;
    assert!(
        parts[0]["debt_units"].as_u64().unwrap() > 500,
        "{}",
        parts[0]
    );
    // While debt is outstanding, admission is 0, however small the request.
    let (status, body) = s.reserve("b", "t", "r", 1).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(problem_type(&body), "debt_outstanding");
    // Refill (sweeper and lazy) repays the debt, then admission resumes.
    eventually(Duration::from_secs(10), || async {
        let parts = s.partitions().await;
        let available = parts[0]["available_units"].as_u64().unwrap();
        (parts[0]["debt_units"] == 0 && available >= 100).then_some(())
    })
    .await;
    let (status, body) = s.reserve("c", "t", "r", 100).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let parts = s.assert_conserved().await;
    assert_eq!(
        parts[0]["overdraft_repaid_units"],
        parts[0]["overdraft_issued_units"]
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debt_outstanding_is_a_429_with_its_type() {
    let (s, _dir) = TestServer::embedded().await;
    // Slow refill: 1 unit a second, so the debt stays while we look.
    s.publish(&policy("t", "r", 3, 1_000, 1), "e").await;
    s.reserve("a", "t", "r", 1_000).await;
    s.post("/v1/reservations/a/start", json!({"operation_id": "op"}))
        .await;
    let (status, r) = s
        .post("/v1/reservations/a/settle", json!({"actual_units": 1_500}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["state"], "SETTLED_WITH_DEBT");
    let resp = s
        .client
        .post(format!("{}/v1/reservations", s.base))
        .json(&json!({"id": "b", "subject": "t", "route": "r", "units": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry_after >= 490,
        "about 500 s to repay 500 units at 1/s, got {retry_after}"
    );
    let (_, body) = split(resp).await;
    assert_eq!(problem_type(&body), "debt_outstanding");
    assert_eq!(body["policy_generation"], 3);
    let parts = s.assert_conserved().await;
    assert!(parts[0]["debt_units"].as_u64().unwrap() > 0);
    s.stop().await;
}

/// A partition with a million open reservations answers a retryable 429
/// whose Retry-After is the hold TTL (by then every unstarted one has been
/// released, started or expired). Hitting it takes a million open
/// reservations (core's `reservation_and_move_limits_are_hit` does); here the
/// answer the refusal becomes.
#[test]
fn the_open_reservations_limit_is_a_retryable_429() {
    use axum::response::IntoResponse;
    use reservoir_core::retention::MAX_OPEN_RESERVATIONS_PER_PARTITION;
    use reservoir_core::{CapacityUnit, Rejection};
    use reservoir_server::problem::ApiError;
    use reservoir_server::writer::Failure;
    let error = ApiError::from(Failure::Rejected {
        limits: None,
        rejection: Rejection::OpenReservationsLimit {
            limit: MAX_OPEN_RESERVATIONS_PER_PARTITION,
            retry_after_ms: 180_000,
        },
        policy_generation: Some(3),
        capacity_unit: Some(CapacityUnit::Tokens),
    });
    assert_eq!(error.code(), "open_reservations_limit");
    assert!(error.problem.retryable);
    assert_eq!(error.problem.retry_after_ms, Some(180_000));
    let response = error.into_response();
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(response.headers()["retry-after"], "180");
}
