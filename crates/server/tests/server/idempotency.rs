//! Retries: same id and body → the same receipt and no second debit; same id,
//! other body → 422; repeated start/settle/release are answered from the record.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_answer_the_same_receipt_and_debit_once() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    let (status, first) = s.reserve("id-1", "t", "r", 600).await;
    assert_eq!(status, StatusCode::CREATED);
    for _ in 0..3 {
        let (status, again) = s.reserve("id-1", "t", "r", 600).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(again, first, "same receipt, same log position");
    }
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["reserved_units"], 600, "debited once");

    // Same id, another body (units, route or subject): rejected.
    for (subject, route, units) in [("t", "r", 601), ("t", "r2", 600), ("t2", "r", 600)] {
        let (status, body) = s.reserve("id-1", subject, route, units).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{subject} {route} {units}: {body}"
        );
        assert_eq!(problem_type(&body), "exists_with_different_digest");
    }

    // Start and settle retries.
    let (_, started) = s
        .post("/v1/reservations/id-1/start", json!({"operation_id": "op"}))
        .await;
    let (status, again) = s
        .post("/v1/reservations/id-1/start", json!({"operation_id": "op"}))
        .await;
    assert_eq!((status, &again), (StatusCode::OK, &started));
    let (status, body) = s
        .post(
            "/v1/reservations/id-1/start",
            json!({"operation_id": "other"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&body), "exists_with_different_operation_id");
    let (_, settled) = s
        .post("/v1/reservations/id-1/settle", json!({"actual_units": 100}))
        .await;
    let (status, again) = s
        .post("/v1/reservations/id-1/settle", json!({"actual_units": 100}))
        .await;
    assert_eq!((status, &again), (StatusCode::OK, &settled));
    let (status, body) = s
        .post("/v1/reservations/id-1/settle", json!({"actual_units": 101}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&body), "exists_with_different_actual_units");

    // A reserve retry after settlement still answers the record, without a debit.
    let (status, again) = s.reserve("id-1", "t", "r", 600).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["state"], "SETTLED");
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["spent_units"], 100);
    assert_eq!(parts[0]["available_units"], 900);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_create_one_reservation() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&policy("t", "r", 1, 100_000, 0), "e").await;
    let s = std::sync::Arc::new(s);
    let mut tasks = Vec::new();
    for i in 0..64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.reserve(&format!("dup-{}", i % 8), "t", "r", 100).await
        }));
    }
    let mut created = 0;
    for t in tasks {
        let (status, _) = t.await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::OK,
            "{status}"
        );
        created += usize::from(status == StatusCode::CREATED);
    }
    assert_eq!(created, 8);
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["reserved_units"], 800);
    assert_eq!(parts[0]["reservations"], 8);
}
