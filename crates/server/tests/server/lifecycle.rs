//! The full reserve → start → settle lifecycle, release, and the policy endpoints.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_start_settle_refunds_the_difference() {
    let (s, _dir) = TestServer::embedded().await;
    let (status, body) = s
        .publish(
            &policy("tenant-7", "chat.generate", 1, 10_000, 0),
            "2026-11",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["partition_key"]["policy_generation"], 1);
    assert_eq!(body["partition_key"]["accounting_epoch"], "2026-11");

    let (status, policy) = s.get("/v1/policies/tenant-7/chat.generate").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(policy["accounting_epoch"], "2026-11");
    assert_eq!(policy["policy"]["burst_units"], 10_000);

    let (status, r) = s.reserve("rl-1", "tenant-7", "chat.generate", 600).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["state"], "RESERVED");
    assert_eq!(r["reserved_units"], 600);
    assert_eq!(r["held_units"], 600);
    assert_eq!(r["policy_generation"], 1);
    assert_eq!(r["accounting_epoch"], "2026-11");
    assert!(r["actual_units"].is_null() && r["operation_id"].is_null());
    let reserved_at = r["log_position"]["offset"].as_u64().unwrap();

    let (status, r) = s
        .post(
            "/v1/reservations/rl-1/start",
            json!({"operation_id": "op-1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["state"], "STARTED");
    assert_eq!(r["operation_id"], "op-1");
    let started_at = r["log_position"]["offset"].as_u64().unwrap();
    assert!(started_at > reserved_at);

    let (status, r) = s
        .post(
            "/v1/reservations/rl-1/settle",
            json!({"actual_units": 180, "operation_id": "op-1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["state"], "SETTLED");
    assert_eq!(r["actual_units"], 180);
    assert!(r["log_position"]["offset"].as_u64().unwrap() > started_at);

    let (status, got) = s.get("/v1/reservations/rl-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        got, r,
        "GET answers the committed receipt, with its position"
    );

    let parts = s.assert_conserved().await;
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["spent_units"], 180);
    assert_eq!(parts[0]["available_units"], 10_000 - 180);
    assert_eq!(parts[0]["reserved_units"], 0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_returns_everything_and_idempotency_key_header_names_the_id() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    let resp = s
        .client
        .post(format!("{}/v1/reservations", s.base))
        .header("Idempotency-Key", "from-header")
        .json(&json!({"subject": "t", "route": "r", "units": 400}))
        .send()
        .await
        .unwrap();
    let (status, r) = split(resp).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["id"], "from-header");
    let (status, r) = s
        .post("/v1/reservations/from-header/release", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["state"], "RELEASED");
    // An empty body is accepted for release.
    let resp = s
        .client
        .post(format!("{}/v1/reservations/from-header/release", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let (status, r) = s
        .post(
            "/v1/reservations/from-header/start",
            json!({"operation_id": "op"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&r), "wrong_state");
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["available_units"], 1_000);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_generation_becomes_active_and_the_old_one_closes_but_still_settles() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    let (status, _) = s.reserve("old", "t", "r", 100).await;
    assert_eq!(status, StatusCode::CREATED);
    s.post("/v1/reservations/old/start", json!({"operation_id": "op"}))
        .await;
    let (status, body) = s.publish(&policy("t", "r", 2, 2_000, 0), "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Publishing the same generation again is a no-op.
    let (status, _) = s.publish(&policy("t", "r", 2, 2_000, 0), "e").await;
    assert_eq!(status, StatusCode::OK);
    // Same key, different policy: refused.
    let (status, body) = s.publish(&policy("t", "r", 2, 3_000, 0), "e").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (_, active) = s.get("/v1/policies/t/r").await;
    assert_eq!(active["policy"]["generation"], 2);
    let (status, r) = s.reserve("new", "t", "r", 100).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(r["policy_generation"], 2);
    // The in-flight reservation of generation 1 still settles there.
    let (status, r) = s
        .post("/v1/reservations/old/settle", json!({"actual_units": 50}))
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["policy_generation"], 1);
    let parts = s.assert_conserved().await;
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0]["closed"], true);
    assert_eq!(parts[1]["closed"], false);
    s.stop().await;
}

/// A settle may carry the call's usage breakdown (recorded for the read side,
/// never moved); its fields are checked like the rest of the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_accepts_a_usage_breakdown() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&policy("tenant-7", "chat", 1, 10_000, 0), "e")
        .await;
    for id in ["u-1", "u-2", "u-3"] {
        let (status, r) = s.reserve(id, "tenant-7", "chat", 2_000).await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        let (status, r) = s
            .post(
                &format!("/v1/reservations/{id}/start"),
                json!({"operation_id": format!("op-{id}")}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
    }
    // (usage, expected status)
    let rows = [
        (
            "u-1",
            json!({"model": "model-a", "output_tokens": 1_200, "counted_input_tokens": 500, "reported_input_tokens": 517}),
            StatusCode::OK,
        ),
        ("u-2", json!({}), StatusCode::OK),
        (
            "u-3",
            json!({"model": "a b"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "u-3",
            json!({"output_tokens": -1}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "u-3",
            json!({"input_tokens": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (id, usage, expected) in rows {
        let (status, r) = s
            .post(
                &format!("/v1/reservations/{id}/settle"),
                json!({"actual_units": 1_717, "usage": usage}),
            )
            .await;
        assert_eq!(status, expected, "{usage} {r}");
    }
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["spent_units"], 2 * 1_717);
    s.stop().await;
}

/// A receipt is answered as `application/json`, on a create and on a repeat
/// (it is written into a presized buffer, not through axum's `Json`), and the
/// body is the whole receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_is_answered_as_json() {
    let (s, _dir) = TestServer::embedded().await;
    let (status, body) = s
        .publish(&policy("tenant-j", "chat", 1, 1_000, 0), "2026-11")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let reserve = json!({"id": "rj-1", "subject": "tenant-j", "route": "chat", "units": 40});
    for expected in [StatusCode::CREATED, StatusCode::OK] {
        let response = s.post_response("/v1/reservations", &reserve).await;
        assert_eq!(response.status(), expected);
        assert_eq!(response.headers()["content-type"], "application/json");
        let receipt: serde_json::Value = response.json().await.unwrap();
        assert_eq!(receipt["id"], "rj-1");
        assert_eq!(receipt["state"], "RESERVED");
        assert_eq!(receipt["held_units"], 40);
        assert_eq!(receipt["mode"], "enforce");
        assert!(receipt["log_position"]["offset"].is_u64(), "{receipt}");
    }
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["reserved_units"], 40);
    s.stop().await;
}
