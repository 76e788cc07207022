//! Emergency shards through the real server: issue moves `available` into
//! `retiredForEmergency` and answers a signed `emergencyShard.v1`; a tampered
//! shard, another gateway or another boot epoch is refused; reconcile remints
//! the confirmed-unused units into the active generation once (also across a
//! generation switch), keeps used and UNKNOWN units retired, records spend
//! above the allocation as debt, and remints nothing after expiry + grace.
//! Conservation on every partition, and across a subject/route's partitions,
//! after every state-changing step.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use reqwest::StatusCode;
use reservoir_core::{EmergencyMode, Policy};
use reservoir_server::clock::ManualClock;
use reservoir_server::shards::{outcome_units, ReceiptTotals, ShardSigner};
use serde_json::{json, Value};

use crate::generations::{assert_moves_pair, sum};
use crate::support::*;

const T0: u64 = 1_784_469_600_000;

/// An emergency-enabled policy, no refill (balances move only by the test).
fn shard_policy(generation: u64, burst: u64) -> Policy {
    let mut p = policy("t", "r", generation, burst, 0);
    p.emergency_mode = EmergencyMode::Enabled;
    p
}

/// Conservation per partition and across t/r's partitions: every move
/// arrived, and no more was reminted than was retired for shards.
async fn conserved(s: &TestServer) -> Vec<Value> {
    let parts = s.assert_conserved().await;
    assert_moves_pair(&parts, "t", "r");
    assert!(
        sum(&parts, "t", "r", "reminted_units")
            <= sum(&parts, "t", "r", "retired_for_emergency_units"),
        "{parts:?}"
    );
    parts
}

fn issue_body(id: &str, units: u64, gateway: &str, boot: u64) -> Value {
    json!({"subject": "t", "route": "r", "units": units, "gateway_id": gateway,
           "gateway_boot_epoch": boot, "ttl_ms": 60_000, "shard_id": id})
}

fn receipt(id: &str, state: &str, used: u64) -> Value {
    json!({"reservation_id": id, "state": state, "used_units": used})
}

fn reconcile_body(shard: &Value, gateway: &str, boot: u64, receipts: Vec<Value>) -> Value {
    json!({"shard": shard, "gateway_id": gateway, "gateway_boot_epoch": boot, "receipts": receipts})
}

async fn reconcile(s: &TestServer, shard: &Value, receipts: Vec<Value>) -> (StatusCode, Value) {
    let path = format!(
        "/v1/shards/{}/reconcile",
        shard["shard_id"].as_str().unwrap()
    );
    s.post(&path, reconcile_body(shard, "gw-1", 7, receipts))
        .await
}

async fn issue(s: &TestServer, id: &str, units: u64) -> Value {
    let (status, doc) = s.post("/v1/shards", issue_body(id, units, "gw-1", 7)).await;
    assert_eq!(status, StatusCode::CREATED, "{doc}");
    doc
}

fn generation(parts: &[Value], g: u64) -> &Value {
    parts
        .iter()
        .find(|p| p["policy_generation"] == g)
        .unwrap_or_else(|| panic!("no generation {g} in {parts:?}"))
}

/// The bytes the signature covers, spelled out here from the contract
/// (README, emergency shards), not taken from the server's code.
fn canonical(d: &Value) -> String {
    let k = &d["partition_key"];
    format!(
        "reservoir.emergencyShard.v1\nshard_id={}\nsubject={}\nroute={}\naccounting_epoch={}\npolicy_generation={}\nunits={}\ngateway_id={}\nboot_epoch={}\nfence_epoch={}\nissued_at_ms={}\nexpires_at_ms={}",
        d["shard_id"].as_str().unwrap(),
        k["subject"].as_str().unwrap(),
        k["route"].as_str().unwrap(),
        k["accounting_epoch"].as_str().unwrap(),
        k["policy_generation"],
        d["units"],
        d["gateway_id"].as_str().unwrap(),
        d["gateway_boot_epoch"],
        d["fence_epoch"],
        d["issued_at_ms"],
        d["expires_at_ms"],
    )
}

fn verifies(key_hex: &str, d: &Value) -> bool {
    let key: [u8; 32] = hex_bytes(key_hex).try_into().unwrap();
    let key = VerifyingKey::from_bytes(&key).unwrap();
    let sig = d["signature"]
        .as_str()
        .unwrap()
        .strip_prefix("ed25519:")
        .unwrap();
    let sig: [u8; 64] = hex_bytes(sig).try_into().unwrap();
    key.verify(canonical(d).as_bytes(), &Signature::from_bytes(&sig))
        .is_ok()
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_moves_available_to_retired_and_signs_the_document() {
    let dir = crate::support::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    assert_eq!(
        s.publish(&shard_policy(1, 1_000), "e").await.0,
        StatusCode::CREATED
    );

    let doc = issue(&s, "sh-1", 300).await;
    assert_eq!(doc["schema"], "emergencyShard.v1");
    assert_eq!(doc["units"], 300);
    assert_eq!(doc["gateway_id"], "gw-1");
    assert_eq!(doc["gateway_boot_epoch"], 7);
    assert_eq!(doc["issued_at_ms"], T0, "writer time");
    assert_eq!(doc["expires_at_ms"], T0 + 60_000);
    assert!(
        doc["fence_epoch"].as_u64().unwrap() >= 1,
        "the claim epoch: {doc}"
    );
    assert_eq!(doc["partition_key"]["policy_generation"], 1);
    let parts = conserved(&s).await;
    let g1 = generation(&parts, 1);
    assert_eq!(
        (
            g1["available_units"].as_u64(),
            g1["retired_for_emergency_units"].as_u64()
        ),
        (Some(700), Some(300))
    );
    assert_eq!(g1["shards_issued"], 1);

    // The public key verifies it offline; the key file is owner-only.
    let (status, key) = s.get("/v1/shards/public-key").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(key["algorithm"], "ed25519");
    let key_hex = key["public_key"].as_str().unwrap();
    assert!(verifies(key_hex, &doc));
    let mode = std::fs::metadata(dir.path().join("shard-signing.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // A retry with the same id and fields: the same document, nothing moves.
    clock.advance(5);
    let (status, again) = s
        .post("/v1/shards", issue_body("sh-1", 300, "gw-1", 7))
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, doc);
    #[rustfmt::skip]
    let table = [
        // body                                          status                              problem
        (issue_body("sh-1", 299, "gw-1", 7),  StatusCode::CONFLICT,             "exists_with_different_fields"),
        (issue_body("sh-1", 300, "gw-2", 7),  StatusCode::CONFLICT,             "exists_with_different_fields"),
        (issue_body("sh-2", 701, "gw-1", 7),  StatusCode::TOO_MANY_REQUESTS,    "insufficient_capacity"),
        (issue_body("sh-2", 0, "gw-1", 7),    StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        (issue_body("sh 2", 1, "gw-1", 7),    StatusCode::UNPROCESSABLE_ENTITY, "invalid_id"),
        (issue_body("sh-2", 1, "gw 1", 7),    StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        (json!({"subject": "t", "route": "r", "units": 1, "gateway_id": "g",
                "gateway_boot_epoch": 1, "ttl_ms": 0}),
                                              StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        (json!({"subject": "t", "route": "r", "units": 1, "gateway_id": "g",
                "gateway_boot_epoch": 1, "ttl_ms": 86_400_001}),
                                              StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        (json!({"subject": "t", "route": "r", "units": 1}),
                                              StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        (json!({"subject": "t", "route": "nope", "units": 1, "gateway_id": "g",
                "gateway_boot_epoch": 1, "ttl_ms": 10}),
                                              StatusCode::NOT_FOUND,            "no_policy"),
    ];
    for (body, status, problem) in table {
        let (got, answer) = s.post("/v1/shards", body.clone()).await;
        assert_eq!(
            (got, problem_type(&answer)),
            (status, problem),
            "{body} -> {answer}"
        );
    }
    // A second shard of the partition takes the next units, never the same ones.
    let other = issue(&s, "sh-2", 700).await;
    assert_ne!(other["shard_id"], doc["shard_id"]);
    let parts = conserved(&s).await;
    let g1 = generation(&parts, 1);
    assert_eq!(
        (
            g1["available_units"].as_u64(),
            g1["retired_for_emergency_units"].as_u64()
        ),
        (Some(0), Some(1_000))
    );

    // Without emergency mode, no shard.
    let mut off = policy("t", "plain", 1, 1_000, 0);
    off.emergency_mode = EmergencyMode::Disabled;
    s.publish(&off, "e").await;
    let mut body = issue_body("sh-3", 1, "gw-1", 7);
    body["route"] = json!("plain");
    let (status, answer) = s.post("/v1/shards", body).await;
    assert_eq!(
        (status, problem_type(&answer)),
        (StatusCode::CONFLICT, "emergency_disabled")
    );
    conserved(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_or_foreign_shard_is_refused() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&shard_policy(1, 1_000), "e").await;
    let doc = issue(&s, "sh-1", 300).await;
    let path = "/v1/shards/sh-1/reconcile";
    let mut more = doc.clone();
    more["units"] = json!(900);
    let mut other_gateway = doc.clone();
    other_gateway["gateway_id"] = json!("gw-2");
    let mut other_boot = doc.clone();
    other_boot["gateway_boot_epoch"] = json!(8);
    let mut later = doc.clone();
    later["expires_at_ms"] = json!(doc["expires_at_ms"].as_u64().unwrap() + 1);
    let mut unsigned = doc.clone();
    unsigned["signature"] = json!("ed25519:00");
    #[rustfmt::skip]
    let table = [
        // presented shard, presenter, boot           status                              problem
        (more,          "gw-1", 7, StatusCode::UNPROCESSABLE_ENTITY, "shard_signature_invalid"),
        (other_gateway, "gw-2", 7, StatusCode::UNPROCESSABLE_ENTITY, "shard_signature_invalid"),
        (other_boot,    "gw-1", 8, StatusCode::UNPROCESSABLE_ENTITY, "shard_signature_invalid"),
        (later,         "gw-1", 7, StatusCode::UNPROCESSABLE_ENTITY, "shard_signature_invalid"),
        (unsigned,      "gw-1", 7, StatusCode::UNPROCESSABLE_ENTITY, "shard_signature_invalid"),
        // Intact, but presented by another gateway (two gateways, one shard),
        // or by a restarted process of the right one.
        (doc.clone(),   "gw-2", 7, StatusCode::CONFLICT,             "shard_binding_mismatch"),
        (doc.clone(),   "gw-1", 8, StatusCode::CONFLICT,             "shard_binding_mismatch"),
    ];
    for (shard, gateway, boot, status, problem) in table {
        let body = reconcile_body(&shard, gateway, boot, vec![]);
        let (got, answer) = s.post(path, body).await;
        assert_eq!(
            (got, problem_type(&answer)),
            (status, problem),
            "{shard} -> {answer}"
        );
    }
    // Nothing was reminted by any of them.
    let parts = conserved(&s).await;
    assert_eq!(sum(&parts, "t", "r", "reminted_units"), 0);
    assert_eq!(sum(&parts, "t", "r", "available_units"), 700);

    // Receipts the ledger cannot take.
    #[rustfmt::skip]
    let bad = [
        (vec![receipt("a", "SETTLED", 1), receipt("a", "SETTLED", 1)], "invalid_receipt"),
        (vec![receipt("a", "RELEASED", 5)],                            "invalid_receipt"),
        (vec![receipt("a b", "SETTLED", 1)],                           "invalid_receipt"),
        (vec![json!({"reservation_id": "a", "state": "STARTED", "used_units": 1})], "invalid_request"),
    ];
    for (receipts, problem) in bad {
        let (got, answer) = reconcile(&s, &doc, receipts.clone()).await;
        assert_eq!(
            (got, problem_type(&answer)),
            (StatusCode::UNPROCESSABLE_ENTITY, problem),
            "{receipts:?}"
        );
    }
    let (got, answer) = s
        .post(
            "/v1/shards/sh-9/reconcile",
            reconcile_body(&doc, "gw-1", 7, vec![]),
        )
        .await;
    assert_eq!(
        (got, problem_type(&answer)),
        (StatusCode::UNPROCESSABLE_ENTITY, "shard_id_mismatch")
    );
    let (got, answer) = s.post(path, json!({"shard": 1})).await;
    assert_eq!(
        (got, problem_type(&answer)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
    );
    let parts = conserved(&s).await;
    assert_eq!(sum(&parts, "t", "r", "reminted_units"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_remints_the_unused_units_once() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&shard_policy(1, 1_000), "e").await;
    let doc = issue(&s, "sh-1", 300).await;
    // 100 spent, 50 unknown (stay retired), the rest unused: 150 come back.
    let receipts = vec![
        receipt("l-1", "SETTLED", 100),
        receipt("l-2", "RELEASED", 0),
        receipt("l-3", "USAGE_UNKNOWN", 50),
        receipt("l-4", "EXPIRED", 0),
    ];
    let (status, first) = reconcile(&s, &doc, receipts.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    #[rustfmt::skip]
    let want = [("outcome", json!("reminted")), ("issued_units", json!(300)), ("spent_units", json!(100)),
        ("unknown_units", json!(50)), ("reminted_units", json!(150)), ("retired_units", json!(150)),
        ("excess_units", json!(0)), ("created", json!(true))];
    for (field, value) in want {
        assert_eq!(first[field], value, "{field}: {first}");
    }
    let parts = conserved(&s).await;
    let g1 = generation(&parts, 1);
    assert_eq!(g1["available_units"], 850);
    assert_eq!(g1["reminted_units"], 150);
    assert_eq!(g1["retired_for_emergency_units"], 300);

    // The same reconcile again (a lost answer retried): same record, nothing more.
    let (status, again) = reconcile(&s, &doc, receipts.clone()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["reminted_units"], 150);
    assert_eq!(again["created"], false);
    let parts = conserved(&s).await;
    assert_eq!(generation(&parts, 1)["available_units"], 850);
    // Other receipts for a reconciled shard are refused, not reminted.
    let (status, answer) = reconcile(&s, &doc, vec![receipt("l-1", "SETTLED", 10)]).await;
    assert_eq!(
        (status, problem_type(&answer)),
        (StatusCode::CONFLICT, "exists_with_different_fields")
    );
    let parts = conserved(&s).await;
    assert_eq!(generation(&parts, 1)["available_units"], 850);

    // The list shows it reconciled.
    let (status, list) = s.get("/v1/shards?subject=t").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["shards"][0]["state"], "reconciled", "{list}");
    assert_eq!(list["shards"][0]["reconcile"]["reminted_units"], 150);
    assert_eq!(list["outstanding_units"], 0);
}

/// A long outage leaves thousands of local receipts: their reconcile is
/// above the general 64 KiB body limit and is still taken (a shard is
/// reconciled once; refused, it would stay unreconciled for good). A
/// receipt above the most one amount may carry is refused, not recorded as
/// a debt no refill repays; other bodies keep the general limit.
#[tokio::test]
async fn a_reconcile_takes_thousands_of_receipts_and_refuses_impossible_ones() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&shard_policy(1, 10_000), "e").await;
    let doc = issue(&s, "sh-big", 5_000).await;

    let impossible = vec![receipt("l-0", "SETTLED", (1u64 << 53) + 1)];
    let (status, answer) = reconcile(&s, &doc, impossible).await;
    assert_eq!(
        (status, problem_type(&answer)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_receipt"),
        "{answer}"
    );

    // 3,000 calls of one unit each, over 200 KB of receipts.
    let receipts: Vec<Value> = (0..3_000)
        .map(|i| receipt(&format!("local-call-{i:06}"), "SETTLED", 1))
        .collect();
    let size = reconcile_body(&doc, "gw-1", 7, receipts.clone())
        .to_string()
        .len();
    assert!(size > 3 * 64 * 1024, "{size} bytes");
    let (status, outcome) = reconcile(&s, &doc, receipts).await;
    assert_eq!(status, StatusCode::CREATED, "{outcome}");
    assert_eq!(outcome["spent_units"], 3_000);
    assert_eq!(outcome["reminted_units"], 2_000);
    let parts = conserved(&s).await;
    assert_eq!(generation(&parts, 1)["available_units"], 10_000 - 3_000);

    // Anything else still meets the general limit.
    let mut big = issue_body("sh-2", 1, "gw-1", 7);
    big["padding"] = json!("x".repeat(100 * 1024));
    let (status, answer) = s.post("/v1/shards", big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    conserved(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_remints_into_the_active_generation_once_across_switches() {
    let (s, _dir) = TestServer::embedded().await;
    s.publish(&shard_policy(1, 1_000), "e").await;
    let doc = issue(&s, "sh-1", 400).await;
    let (status, list) = s.get("/v1/shards?subject=t&route=r").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["shards"][0]["state"], "outstanding");
    assert_eq!(list["outstanding_units"], 400);
    // A new generation takes the 600 still available; the shard stays out.
    assert_eq!(
        s.publish(&shard_policy(2, 1_000), "e").await.0,
        StatusCode::CREATED
    );
    let parts = conserved(&s).await;
    let before = sum(&parts, "t", "r", "available_units");
    assert_eq!(before, 600);

    let (status, r) = reconcile(&s, &doc, vec![receipt("l-1", "SETTLED", 150)]).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reminted_units"], 250);
    assert_eq!(
        r["target"]["policy_generation"], 2,
        "into the active generation"
    );
    assert_eq!(r["source"]["policy_generation"], 1);
    let parts = conserved(&s).await;
    assert_eq!(generation(&parts, 2)["reminted_units"], 250);
    assert_eq!(generation(&parts, 2)["available_units"], 850);
    assert_eq!(generation(&parts, 1)["retired_for_emergency_units"], 400);
    assert_eq!(sum(&parts, "t", "r", "available_units"), before + 250);

    // Another switch, then the same reconcile: found in generation 2, nothing more.
    assert_eq!(
        s.publish(&shard_policy(3, 1_000), "e").await.0,
        StatusCode::CREATED
    );
    let before = sum(&conserved(&s).await, "t", "r", "available_units");
    let (status, again) = reconcile(&s, &doc, vec![receipt("l-1", "SETTLED", 150)]).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        (again["reminted_units"].as_u64(), again["created"].as_bool()),
        (Some(250), Some(false))
    );
    assert_eq!(again["target"]["policy_generation"], 2);
    let parts = conserved(&s).await;
    assert_eq!(sum(&parts, "t", "r", "available_units"), before);
    assert_eq!(sum(&parts, "t", "r", "reminted_units"), 250);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_above_the_allocation_is_debt_and_late_reconciles_remint_nothing() {
    let dir = crate::support::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    s.publish(&shard_policy(1, 1_000), "e").await;
    let over = issue(&s, "sh-over", 300).await;
    let late = issue(&s, "sh-late", 200).await;

    // 350 reported on a 300 shard: nothing reminted, the 50 beyond is debt.
    let (status, r) = reconcile(
        &s,
        &over,
        vec![
            receipt("l-1", "SETTLED", 250),
            receipt("l-2", "USAGE_UNKNOWN", 100),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(
        (
            r["outcome"].as_str(),
            r["reminted_units"].as_u64(),
            r["excess_units"].as_u64()
        ),
        (Some("overspent"), Some(0), Some(50))
    );
    let parts = conserved(&s).await;
    let g1 = generation(&parts, 1);
    assert_eq!(
        (
            g1["debt_units"].as_u64(),
            g1["overdraft_issued_units"].as_u64()
        ),
        (Some(50), Some(50))
    );
    // Debt freezes admission.
    let (status, answer) = s.reserve("after-debt", "t", "r", 1).await;
    assert_eq!(
        (status, problem_type(&answer)),
        (StatusCode::TOO_MANY_REQUESTS, "debt_outstanding")
    );
    conserved(&s).await;

    // Past expiry plus the grace (1 h by default): the receipts may be
    // incomplete, so nothing is reminted; the spend is still recorded.
    clock.advance(60_000 + 3_600_000 + 1);
    let (status, r) = reconcile(&s, &late, vec![receipt("l-9", "SETTLED", 20)]).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(
        (
            r["outcome"].as_str(),
            r["reminted_units"].as_u64(),
            r["spent_units"].as_u64(),
            r["retired_units"].as_u64()
        ),
        (Some("retired"), Some(0), Some(20), Some(200))
    );
    let parts = conserved(&s).await;
    assert_eq!(sum(&parts, "t", "r", "reminted_units"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_outlive_a_restart_with_the_same_key_and_show_in_metrics() {
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_in(dir.path()).await;
    s.publish(&shard_policy(1, 1_000), "e").await;
    let doc = issue(&s, "sh-1", 300).await;
    let key = s.get("/v1/shards/public-key").await.1;
    // The gauges are set on every sweep. Their values are not compared: the
    // metrics recorder is one per process, shared by the servers of this
    // test binary's other tests (GET /v1/shards has this server's numbers).
    let metrics = eventually(std::time::Duration::from_secs(10), || {
        let s = &s;
        async move {
            let m = s.metrics().await;
            m.contains("reservoir_shard_units_outstanding").then_some(m)
        }
    })
    .await;
    assert!(
        metrics.contains("reservoir_shards_unreconciled"),
        "{metrics}"
    );
    assert!(
        metrics.contains("reservoir_shard_oldest_unreconciled_age_seconds"),
        "{metrics}"
    );
    let (_, list) = s.get("/v1/shards?subject=t").await;
    assert_eq!(list["outstanding_units"], 300);
    s.stop().await;

    let s = TestServer::embedded_in(dir.path()).await;
    assert_eq!(
        s.get("/v1/shards/public-key").await.1,
        key,
        "the key is generated once"
    );
    let (_, list) = s.get("/v1/shards?subject=t").await;
    assert_eq!(
        list["shards"][0]["shard"], doc,
        "the document comes back from the log"
    );
    let (status, r) = reconcile(&s, &doc, vec![]).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["reminted_units"], 300);
    let parts = conserved(&s).await;
    assert_eq!(generation(&parts, 1)["available_units"], 1_000);
    let (status, answer) = s.get("/v1/shards").await;
    assert_eq!(
        (status, problem_type(&answer)),
        (StatusCode::BAD_REQUEST, "invalid_query")
    );
}

#[test]
fn reconcile_outcomes_as_a_table() {
    let t = |spent, unknown| ReceiptTotals {
        spent_units: spent,
        unknown_units: unknown,
        receipts: 1,
    };
    #[rustfmt::skip]
    let table = [
        // issued, spent, unknown, late => (unused, spent, unknown, excess)
        (100, 0,   0,  false, (100, 0,   0,  0)),
        (100, 30,  10, false, (60,  30,  10, 0)),
        (100, 30,  10, true,  (0,   30,  10, 0)),
        (100, 100, 0,  false, (0,   100, 0,  0)),
        (100, 90,  20, false, (0,   90,  20, 10)),
        (100, 90,  20, true,  (0,   90,  20, 10)),
    ];
    for (issued, spent, unknown, late, want) in table {
        assert_eq!(outcome_units(issued, t(spent, unknown), late), want);
    }
}

#[test]
fn the_signing_key_is_made_once_and_refused_when_others_can_read_it() {
    let dir = crate::support::tempdir().unwrap();
    let first = ShardSigner::load_or_create(dir.path(), None).unwrap();
    let again = ShardSigner::load_or_create(dir.path(), None).unwrap();
    assert_eq!(first.public_key_hex(), again.public_key_hex());
    let path = dir.path().join("shard-signing.key");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = ShardSigner::load_or_create(dir.path(), None).unwrap_err();
    assert!(err.contains("readable by group or others"), "{err}");
    // A configured key is read, never generated; it must be 32 hex bytes.
    let missing = dir.path().join("missing.key");
    assert!(ShardSigner::load_or_create(dir.path(), Some(&missing)).is_err());
    assert!(!missing.exists());
    let bad = dir.path().join("bad.key");
    write_new_file(&bad, "not hex", 0o600);
    let err = ShardSigner::load_or_create(dir.path(), Some(&bad)).unwrap_err();
    assert!(err.contains("not hex"), "{err}");
}
