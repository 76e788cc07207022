//! Restart on the same log: state, receipts and positions come back from the
//! log alone, and idempotent retries still answer the original receipts.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_recovers_every_receipt_and_balance() {
    let (s, log, dir) = TestServer::memory().await;
    s.publish(&policy("t", "r", 1, 10_000, 0), "e").await;
    s.publish(&policy("u", "r", 1, 10_000, 0), "e").await;
    let mut receipts = Vec::new();
    for i in 0..20 {
        let subject = if i % 2 == 0 { "t" } else { "u" };
        let id = format!("id-{i}");
        let (status, r) = s.reserve(&id, subject, "r", 100 + i).await;
        assert_eq!(status, StatusCode::CREATED);
        let r = match i % 4 {
            0 => {
                s.post(&format!("/v1/reservations/{id}/release"), json!({}))
                    .await
                    .1
            }
            1 => {
                s.post(
                    &format!("/v1/reservations/{id}/start"),
                    json!({"operation_id": "op"}),
                )
                .await
                .1
            }
            2 => {
                s.post(
                    &format!("/v1/reservations/{id}/start"),
                    json!({"operation_id": "op"}),
                )
                .await;
                s.post(
                    &format!("/v1/reservations/{id}/settle"),
                    json!({"actual_units": 2 * i}),
                )
                .await
                .1
            }
            _ => r,
        };
        receipts.push((id, subject, 100 + i, r));
    }
    let before = s.assert_conserved().await;
    s.stop().await;

    let s = TestServer::start(log, test_config(dir.path())).await;
    assert_eq!(s.assert_conserved().await, before);
    for (id, subject, units, r) in &receipts {
        let (status, got) = s.get(&format!("/v1/reservations/{id}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&got, r, "{id}");
        let (status, again) = s.reserve(id, subject, "r", *units).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&again, r);
    }
    let (_, active) = s.get("/v1/policies/t/r").await;
    assert_eq!(active["policy"]["generation"], 1);
    s.stop().await;
}
