//! The OpenAPI 3 document is generated from the code; this checks it describes
//! the contract: every route, the receipt's exact fields, and a policy schema
//! whose fields are exactly the core `Policy`'s serde fields.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use reservoir_core::Policy;
use serde_json::Value;

use crate::support::*;

fn props(doc: &Value, schema: &str) -> BTreeSet<String> {
    doc["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("schema {schema} missing"))
        .keys()
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_matches_the_contract() {
    let (s, _dir) = TestServer::embedded().await;
    let (status, doc) = s.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    for (path, method) in [
        ("/v1/policies", "post"),
        ("/v1/policies/{subject}/{route}", "get"),
        ("/v1/reservations", "post"),
        ("/v1/reservations/{id}", "get"),
        ("/v1/reservations/{id}/start", "post"),
        ("/v1/reservations/{id}/settle", "post"),
        ("/v1/reservations/{id}/release", "post"),
        ("/v1/partitions", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/v1/shards", "post"),
        ("/v1/shards", "get"),
        ("/v1/shards/public-key", "get"),
        ("/v1/shards/{id}/reconcile", "post"),
    ] {
        assert!(paths.contains(path), "{path} missing from {paths:?}");
        assert!(doc["paths"][path][method].is_object(), "{method} {path}");
    }
    assert!(doc["paths"]["/v1/reservations"]["post"]["responses"]["429"].is_object());

    let receipt: BTreeSet<String> = [
        "id",
        "subject",
        "route",
        "accounting_epoch",
        "policy_generation",
        "state",
        "reserved_units",
        "held_units",
        "actual_units",
        "operation_id",
        "expires_at_ms",
        "sizing",
        "dimensions",
        "mode",
        "would_refuse",
        "log_position",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(props(&doc, "Receipt"), receipt);
    assert_eq!(
        props(&doc, "LogPosition"),
        ["log_partition", "offset"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert_eq!(
        props(&doc, "ReserveBody"),
        [
            "id",
            "subject",
            "route",
            "units",
            "counted_input_tokens",
            "max_tokens"
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    );

    // The documented policy is the core's wire form, field for field.
    // With every optional part set, so serde writes every field.
    let core = serde_json::to_value(Policy {
        exclude_cache_read_input_tokens: true,
        estimator: Some(Box::new(reservoir_core::default_estimator(
            &Policy::example("t", "r", 1),
        ))),
        epoch_length: reservoir_core::EpochLength::Daily,
        rollout: Some(reservoir_core::Rollout {
            enforced_per_million: 1,
            salt: "s".into(),
        }),
        ..Policy::example_three_dimensions("t", "r", 1)
    })
    .unwrap();
    let core_fields: BTreeSet<String> = core.as_object().unwrap().keys().cloned().collect();
    assert_eq!(props(&doc, "PolicyDoc"), core_fields);
    let refill: BTreeSet<String> = core["refill"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(props(&doc, "RefillRuleDoc"), refill);

    // Problem details carry the RFC 9457 members.
    let problem = props(&doc, "Problem");
    for member in ["type", "title", "status", "detail"] {
        assert!(problem.contains(member), "{member}");
    }

    // And a live receipt has exactly the documented fields.
    s.publish(&policy("t", "r", 1, 100, 0), "e").await;
    let (_, r) = s.reserve("a", "t", "r", 1).await;
    let live: BTreeSet<String> = r.as_object().unwrap().keys().cloned().collect();
    // `sizing` appears only on reservations the server sized (no units
    // given), `dimensions` only under a policy with further dimensions,
    // `would_refuse` only on a shadow verdict enforcement would refuse.
    let mut explicit = receipt.clone();
    explicit.remove("sizing");
    explicit.remove("dimensions");
    explicit.remove("would_refuse");
    assert_eq!(live, explicit);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    let (s, _dir) = TestServer::embedded().await;
    assert_eq!(s.get("/healthz").await.0, StatusCode::OK);
    assert_eq!(s.get("/readyz").await.0, StatusCode::OK);
    s.publish(&policy("t", "chat", 1, 1_000, 0), "e").await;
    s.reserve("a", "t", "chat", 500).await;
    s.post(
        "/v1/reservations/a/start",
        serde_json::json!({"operation_id": "op"}),
    )
    .await;
    s.post(
        "/v1/reservations/a/settle",
        serde_json::json!({"actual_units": 250}),
    )
    .await;
    let text = s.metrics().await;
    for needle in [
        "reservoir_admissions_total{route=\"chat\"}",
        "reservoir_batch_commands_bucket",
        "reservoir_batch_records_bucket",
        "reservoir_append_seconds_bucket",
        "reservoir_reservation_efficiency_bucket{route=\"chat\",le=\"0.5\"}",
    ] {
        assert!(
            text.contains(needle),
            "{needle} missing from metrics:\n{text}"
        );
    }
    s.stop().await;
}

/// The bounds the document states are the ones the server enforces: each is
/// read back from core's constants, so neither can move alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_bounds_are_the_enforced_ones() {
    use reservoir_core::policy::{MAX_GENERATION, MAX_SPAN_MS, MAX_UNITS};
    let (s, _dir) = TestServer::embedded().await;
    let (_, doc) = s.get("/openapi.json").await;
    let schema = |name: &str| doc["components"]["schemas"][name]["properties"].clone();
    let policy = schema("PolicyDoc");
    for field in [
        "burst_units",
        "opening_units",
        "max_reservation_units",
        "max_overdraft_units",
    ] {
        assert_eq!(policy[field]["maximum"], MAX_UNITS, "{field}");
    }
    for field in [
        "hold_ttl_ms",
        "hard_execution_limit_ms",
        "idempotency_window_ms",
    ] {
        assert_eq!(policy[field]["maximum"], MAX_SPAN_MS, "{field}");
        assert_eq!(policy[field]["minimum"], 1, "{field}");
    }
    assert_eq!(policy["generation"]["maximum"], MAX_GENERATION);
    let refill = schema("RefillRuleDoc");
    assert_eq!(refill["units"]["maximum"], MAX_UNITS);
    assert_eq!(refill["interval_ms"]["maximum"], MAX_SPAN_MS);
    let limit = schema("DimensionLimitDoc");
    assert_eq!(limit["burst_units"]["maximum"], MAX_UNITS);
    let issue = schema("IssueShardBody");
    assert_eq!(issue["units"]["maximum"], MAX_UNITS);
    assert_eq!(
        issue["ttl_ms"]["maximum"],
        reservoir_server::shards::MAX_SHARD_TTL_MS
    );
    assert_eq!(
        issue["gateway_boot_epoch"]["maximum"],
        reservoir_server::shards::http::MAX_BOOT_EPOCH
    );
    // Every identifier takes core's rule, in paths and in bodies.
    let id_rule = format!(
        "^[A-Za-z0-9._:/@-]{{1,{}}}$",
        reservoir_core::types::MAX_ID_BYTES
    );
    let reserve = schema("ReserveBody");
    for field in ["id", "subject", "route"] {
        assert_eq!(reserve[field]["pattern"], id_rule.as_str(), "{field}");
    }
    let get = &doc["paths"]["/v1/reservations/{id}"]["get"];
    assert_eq!(get["parameters"][0]["schema"]["pattern"], id_rule.as_str());
    assert!(
        get["responses"]["422"].is_object(),
        "a bad id is documented"
    );
    // Bodies: malformed, too large, not JSON, breaking a rule.
    let post = &doc["paths"]["/v1/reservations"]["post"]["responses"];
    for status in ["400", "413", "415", "422"] {
        assert!(post[status].is_object(), "{status}");
    }
    // Positions past the log are 409 on every query.
    let balances = &doc["paths"]["/v1/tenants/{tenant}/balances"]["get"]["responses"];
    assert!(balances["409"].is_object());
    s.stop().await;
}
