//! Sized reserves over HTTP: a reserve without `units` is sized from counted
//! input × drift + an output estimate (max_tokens, the route's default, the
//! route's digest when warm, a sibling's, or the ceiling when cold); the
//! `Reserved` event records the rule; the request digest covers the sizing
//! inputs.

use std::collections::BTreeMap;
use std::sync::Arc;

use reqwest::StatusCode;
use reservoir_core::{EventBody, SizingRule};
use reservoir_log::memory::MemoryLog;
use reservoir_log::{EventReader, LogEntry};
use serde_json::{json, Value};

use crate::support::*;

/// The sizing recorded in each `Reserved` event, by reservation id.
async fn sizings(log: &Arc<MemoryLog>) -> BTreeMap<String, (u64, Option<reservoir_core::Sizing>)> {
    let mut out = BTreeMap::new();
    for (_, entry) in log.read(0, 0, 100_000).await.unwrap() {
        if let LogEntry::Record(r) = entry {
            for e in r.events {
                if let EventBody::Reserved {
                    id,
                    reserved_units,
                    sizing,
                    ..
                } = e.body
                {
                    out.insert(id.to_string(), (reserved_units, sizing));
                }
            }
        }
    }
    out
}

async fn publish_with(s: &TestServer, route: &str, estimator: Value) -> (StatusCode, Value) {
    s.post(
        "/v1/policies",
        json!({"accounting_epoch": "e", "policy": policy("t", route, 1, 1_000_000, 0),
            "estimator": estimator}),
    )
    .await
}

async fn sized(s: &TestServer, id: &str, route: &str, extra: Value) -> (StatusCode, Value) {
    let mut body = json!({"id": id, "subject": "t", "route": route});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    s.post("/v1/reservations", body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserves_without_units_are_sized_and_the_rule_recorded() {
    let (s, log, _dir) = TestServer::memory().await;
    let estimator = json!({"quantile_ppm": 900_000, "floor_units": 100,
        "ceiling_units": 4_000, "min_samples": 5});
    let (status, body) = publish_with(&s, "chat", estimator.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, active) = s.get("/v1/policies/t/chat").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(active["estimator"]["ceiling_units"], 4_000, "{active}");
    let digest = active["policy"]["estimator_digest"].as_str().unwrap();
    assert!(digest.starts_with("sha256:"), "{digest}");
    // Publishing the same again is idempotent (the digest is deterministic).
    assert_eq!(
        publish_with(&s, "chat", estimator.clone()).await.0,
        StatusCode::OK
    );

    // max_tokens: input + max_tokens.
    let (status, r) = sized(
        &s,
        "m",
        "chat",
        json!({"counted_input_tokens": 500, "max_tokens": 1_000}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reserved_units"], 1_500);
    // The receipt says how: rule and parts.
    assert_eq!(
        r["sizing"],
        json!({"rule": "max_tokens", "units": 1_500, "input_units": 500, "output_units": 1_000}),
        "{r}"
    );
    // Cold route, no sibling: the ceiling.
    let (status, r) = sized(&s, "cold", "chat", json!({"counted_input_tokens": 500})).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reserved_units"], 4_500);

    // Warm the route: output 2,000 tokens each, input counted 500 vs billed 550.
    let mut last = Value::Null;
    for i in 0..6 {
        let id = format!("w{i}");
        let (status, r) = s.reserve(&id, "t", "chat", 3_000).await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        assert!(r.get("sizing").is_none(), "explicit units: no sizing {r}");
        s.post(
            &format!("/v1/reservations/{id}/start"),
            json!({"operation_id": "op"}),
        )
        .await;
        let (status, r) = s
            .post(
                &format!("/v1/reservations/{id}/settle"),
                json!({"actual_units": 2_550, "usage": {"model": "m", "output_tokens": 2_000,
                    "counted_input_tokens": 500, "reported_input_tokens": 550}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        last = r;
    }
    let p = &last["log_position"];
    let (status, e) = s
        .get(&format!(
            "/v1/routes/chat/estimate?min_samples=5&min_position={}:{}",
            p["log_partition"], p["offset"]
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{e}");
    assert_eq!(e["warm"], true, "{e}");
    // Warm digest: 500 × 1.1 + p90 (2,000).
    let (status, r) = sized(&s, "warm", "chat", json!({"counted_input_tokens": 500})).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reserved_units"], 2_550, "{r}");
    assert_eq!(r["sizing"]["rule"], "route_quantile", "{r}");
    // A later read of the reservation shows the same sizing.
    let (status, read) = s.get("/v1/reservations/warm").await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read["sizing"], r["sizing"], "{read}");

    // A retry with the same inputs is the same reservation; other inputs conflict.
    let (status, again) = sized(&s, "cold", "chat", json!({"counted_input_tokens": 500})).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["reserved_units"], 4_500);
    assert_eq!(again["sizing"]["rule"], "cold_ceiling", "{again}");
    let (status, other) = sized(&s, "cold", "chat", json!({"counted_input_tokens": 501})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{other}");
    assert_eq!(problem_type(&other), "exists_with_different_digest");
    let (status, other) = s.reserve("cold", "t", "chat", 4_500).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{other}");

    // Route default max_tokens; a cold route sized by its warm sibling.
    let (status, body) = publish_with(
        &s,
        "summarize",
        json!({"quantile_ppm": 750_000, "floor_units": 10, "ceiling_units": 8_000,
            "min_samples": 5, "default_max_tokens": 800}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, r) = sized(&s, "d", "summarize", json!({"counted_input_tokens": 100})).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reserved_units"], 900);
    let (status, body) = publish_with(
        &s,
        "chat-v2",
        json!({"quantile_ppm": 900_000, "floor_units": 100, "ceiling_units": 4_000,
            "min_samples": 5, "sibling_route": "chat"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, r) = sized(&s, "sib", "chat-v2", json!({"counted_input_tokens": 100})).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reserved_units"], 2_100);

    // The log records how each reservation was sized.
    let recorded = sizings(&log).await;
    let rule = |id: &str| {
        let (units, sizing) = recorded[id];
        let sizing = sizing.unwrap_or_else(|| panic!("{id} has no sizing"));
        assert_eq!(sizing.units, units, "{id}");
        sizing.rule
    };
    assert_eq!(rule("m"), SizingRule::MaxTokens);
    assert_eq!(rule("cold"), SizingRule::ColdCeiling);
    assert_eq!(rule("warm"), SizingRule::RouteQuantile);
    assert_eq!(rule("d"), SizingRule::RouteDefaultMaxTokens);
    assert_eq!(rule("sib"), SizingRule::SiblingQuantile);
    let warm = recorded["warm"].1.unwrap();
    assert_eq!((warm.input_units, warm.output_units), (550, 2_000));
    assert!(
        recorded["w0"].1.is_none(),
        "explicit units record no sizing"
    );
    s.assert_conserved().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizing_inputs_and_estimators_are_validated() {
    let (s, _log, _dir) = TestServer::memory().await;
    // A policy without an estimator sizes with the defaults, written into
    // the policy: the ceiling is the policy's largest reservation less the
    // typical input (500), as input lands in the same dimension.
    s.publish(&policy("t", "plain", 1, 10_000, 0), "e").await;
    let (status, r) = sized(&s, "a", "plain", json!({"counted_input_tokens": 500})).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reserved_units"], 10_000);
    let (_, active) = s.get("/v1/policies/t/plain").await;
    assert_eq!(
        active["policy"]["estimator"]["ceiling_units"], 9_500,
        "{active}"
    );
    assert_eq!(active["estimator"]["ceiling_units"], 9_500, "{active}");

    for (body, why) in [
        (
            json!({"units": 5, "max_tokens": 10}),
            "units and max_tokens",
        ),
        (
            json!({"units": 5, "counted_input_tokens": 10}),
            "units and counted",
        ),
        (json!({}), "nothing"),
        (json!({"max_tokens": 10}), "max_tokens alone"),
        (
            json!({"counted_input_tokens": 1, "max_tokens": 0}),
            "max_tokens 0",
        ),
    ] {
        let (status, p) = sized(&s, "x", "plain", body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{why}: {p}");
    }
    let (status, p) = sized(&s, "x", "nowhere", json!({"counted_input_tokens": 1})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{p}");

    for estimator in [
        json!({"quantile_ppm": 0, "floor_units": 1, "ceiling_units": 10, "min_samples": 1}),
        json!({"quantile_ppm": 900_000, "floor_units": 11, "ceiling_units": 10, "min_samples": 1}),
        json!({"quantile_ppm": 900_000, "floor_units": 1, "ceiling_units": 10, "min_samples": 1,
            "sibling_route": "bad route"}),
        json!({"quantile_ppm": 900_000, "floor_units": 1, "ceiling_units": 10, "min_samples": 1,
            "surprise": true}),
    ] {
        let (status, p) = publish_with(&s, "r2", estimator.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{estimator}: {p}");
    }
    let mut p = policy("t", "r3", 1, 1_000, 0);
    p.estimator_digest = "sha256:00".into();
    let (status, body) = s
        .post(
            "/v1/policies",
            json!({"accounting_epoch": "e", "policy": p, "estimator":
                {"quantile_ppm": 900_000, "floor_units": 1, "ceiling_units": 10, "min_samples": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    s.assert_conserved().await;
    s.stop().await;
}

/// Sizing settings are in the log: a server that never saw the publish (its
/// own, empty data directory, on the same log) sizes a reserve exactly as the
/// one that took the publish did; none writes an estimator file any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_saw_the_publish_sizes_from_the_log_alone() {
    let (first, log, first_dir) = TestServer::memory().await;
    let estimator = json!({"quantile_ppm": 900_000, "floor_units": 100,
        "ceiling_units": 4_000, "min_samples": 5, "default_max_tokens": null,
        "sibling_route": "chat-v0"});
    let (status, body) = publish_with(&first, "chat", estimator.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, a) = sized(&first, "a", "chat", json!({"counted_input_tokens": 500})).await;
    assert_eq!(status, StatusCode::CREATED, "{a}");
    assert_eq!(a["reserved_units"], 4_500);
    first.assert_conserved().await;
    first.stop().await;
    assert!(
        !first_dir.path().join("estimators").exists(),
        "nothing kept beside the log"
    );

    let second_dir = crate::support::tempdir().unwrap();
    let second = TestServer::start(log.clone(), test_config(second_dir.path())).await;
    let (status, active) = second.get("/v1/policies/t/chat").await;
    assert_eq!(status, StatusCode::OK, "{active}");
    assert_eq!(active["estimator"], estimator, "{active}");
    let (status, b) = sized(&second, "b", "chat", json!({"counted_input_tokens": 500})).await;
    assert_eq!(status, StatusCode::CREATED, "{b}");
    assert_eq!(b["sizing"], a["sizing"], "{b}");
    assert_eq!(b["sizing"]["rule"], "cold_ceiling", "{b}");
    // The logged events agree: both sized by the same rule to the same units.
    let recorded = sizings(&log).await;
    assert_eq!(recorded["a"], recorded["b"]);
    second.assert_conserved().await;
    second.stop().await;
}

/// Publishing refuses sizing settings under which a cold route's reserve for
/// a typical input exceeds what some dimension admits (the route could never
/// settle a sized call, so never warm), naming the dimension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_refuses_settings_under_which_a_cold_route_never_warms() {
    let (s, _log, _dir) = TestServer::memory().await;
    let readme = reservoir_core::Policy::example("t", "readme", 1); // max_reservation 8,000
    let three = reservoir_core::Policy::example_three_dimensions("t", "three", 1);
    let est = |ceiling: u64| {
        json!({"quantile_ppm": 900_000, "floor_units": 1,
        "ceiling_units": ceiling, "min_samples": 100})
    };
    // (route, policy, estimator, typical input) -> (status, refusing dimension)
    let rows = [
        // The new user: an 8,192-token ceiling + 500 input > 8,000.
        ("a", &readme, Some(est(8_192)), None, 422, Some("tokens")),
        ("b", &readme, Some(est(7_900)), Some(100), 201, None),
        ("c", &readme, Some(est(7_500)), None, 201, None),
        (
            "d",
            &readme,
            Some(est(7_500)),
            Some(501),
            422,
            Some("tokens"),
        ),
        // The defaults leave room for a typical input.
        ("e", &readme, None, Some(500), 201, None),
        ("f", &readme, None, None, 201, None),
        (
            "g",
            &three,
            Some(est(20_001)),
            None,
            422,
            Some("output_tokens"),
        ),
        ("h", &three, None, Some(100_001), 422, Some("input_tokens")),
        ("i", &three, None, Some(100_000), 201, None),
    ];
    for (route, policy, estimator, typical, status, dimension) in rows {
        let policy = reservoir_core::Policy {
            route: route.to_string(),
            ..policy.clone()
        };
        let mut body = json!({"accounting_epoch": "e", "policy": policy});
        if let Some(estimator) = estimator {
            body["estimator"] = estimator;
        }
        if let Some(typical) = typical {
            body["typical_input_tokens"] = json!(typical);
        }
        let (got, answer) = s.post("/v1/policies", body).await;
        assert_eq!(got.as_u16(), status, "{route}: {answer}");
        if let Some(dimension) = dimension {
            assert_eq!(
                problem_type(&answer),
                "cold_route_never_warms",
                "{route}: {answer}"
            );
            assert_eq!(answer["limiting_dimension"], dimension, "{route}: {answer}");
            let (status, _) = s.get(&format!("/v1/policies/t/{route}")).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{route}: nothing published");
        }
    }
    // A route published with the defaults admits a cold sized reserve of a
    // typical request, so it can settle and warm.
    let (status, r) = sized(&s, "cold", "f", json!({"counted_input_tokens": 500})).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reserved_units"], 8_000, "{r}");
    s.assert_conserved().await;
    s.stop().await;
}
