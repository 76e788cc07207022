//! The projection queries served by `reservoir serve`: after a lifecycle over
//! HTTP, every endpoint agrees with `GET /v1/partitions`; `min_position` from a
//! write's `log_position` answers with that write included; a position the log
//! has not reached times out with 503 and `Retry-After`; bad parameters are 400.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use reservoir_core::Term;
use serde_json::{json, Value};

use crate::support::*;

/// Reserve, optionally start and settle; returns the last receipt.
async fn call(s: &TestServer, id: &str, units: u64, settle: Option<Value>) -> Value {
    let (status, r) = s.reserve(id, "acme", "chat", units).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let Some(body) = settle else { return r };
    let (status, r) = s
        .post(
            &format!("/v1/reservations/{id}/start"),
            json!({"operation_id": format!("op-{id}")}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let (status, r) = s.post(&format!("/v1/reservations/{id}/settle"), body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r
}

/// A projected reservation, no older than `receipt`'s write.
async fn projected(s: &TestServer, id: &str, receipt: &Value) -> Value {
    let (status, body) = s
        .get(&format!(
            "/v1/projections/reservations/{id}?min_position={}",
            log_position(receipt)
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// The projection's terms equal the writer's (`/v1/partitions` shows every
/// term of core's list, as the projection does), and so does the debt.
fn ledger_matches(ledger: &Value, debt: &Value, partition: &Value) {
    for term in reservoir_core::Term::ALL {
        let name = term.name();
        assert!(partition[name].is_u64(), "{name} missing in {partition}");
        assert_eq!(
            ledger[name], partition[name],
            "{name}: {ledger} vs {partition}"
        );
    }
    assert_eq!(
        debt, &partition["debt_units"],
        "debt: {debt} vs {partition}"
    );
    assert_eq!(ledger["conservation"], "ok", "{ledger}");
    // Every term of the core list, and nothing else but the check.
    let names: BTreeSet<&str> = ledger
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    let expected: BTreeSet<&str> = Term::ALL
        .iter()
        .map(|t| t.name())
        .chain(["conservation"])
        .collect();
    assert_eq!(names, expected, "{ledger}");
    let u = |k: &str| ledger[k].as_u64().unwrap();
    assert_eq!(
        u("opening_units")
            + u("minted_units")
            + u("reminted_units")
            + u("moved_in_units")
            + u("overdraft_issued_units"),
        u("available_units")
            + u("reserved_units")
            + u("spent_units")
            + u("retired_for_emergency_units")
            + u("overdraft_repaid_units")
            + u("moved_out_units")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_follow_a_lifecycle() {
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_in(dir.path()).await;
    let (status, body) = s.publish(&policy("acme", "chat", 1, 10_000, 0), "e").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // Every write is visible at once through min_position.
    let r = call(&s, "a", 1_000, None).await;
    assert_eq!(projected(&s, "a", &r).await["state"], "RESERVED");
    let usage = json!({"model": "m1", "output_tokens": 700,
        "counted_input_tokens": 200, "reported_input_tokens": 220});
    let r = call(
        &s,
        "a2",
        1_000,
        Some(json!({"actual_units": 900, "usage": usage})),
    )
    .await;
    let a2 = projected(&s, "a2", &r).await;
    assert_eq!(a2["state"], "SETTLED", "{a2}");
    assert_eq!(a2["actual_units"], 900);
    assert_eq!(a2["operation_id"], "op-a2");
    let (status, r) = s.post("/v1/reservations/a/release", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(projected(&s, "a", &r).await["state"], "RELEASED");

    // Spend everything and overshoot: the excess becomes debt, then a refusal.
    let (_, parts) = s.get("/v1/partitions").await;
    let available = parts[0]["available_units"].as_u64().unwrap();
    let r = call(
        &s,
        "b",
        available,
        Some(json!({"actual_units": available + 400,
            "usage": {"model": "m2", "output_tokens": 3_000}})),
    )
    .await;
    let b = projected(&s, "b", &r).await;
    assert_eq!(b["actual_units"], available + 400, "{b}");
    let (status, refused) = s.reserve("c", "acme", "chat", 100).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    // A later write on another partition orders after the refusal.
    s.publish(&policy("other", "chat", 1, 1_000, 0), "e").await;
    let (status, r) = s
        .post(
            "/v1/reservations",
            json!({"id": "o1", "subject": "other", "route": "chat", "units": 10}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let last = log_position(&r);
    let at = |path: &str| format!("{path}?min_position={last}");

    let parts = s.assert_conserved().await;
    let acme = parts.iter().find(|p| p["subject"] == "acme").unwrap();
    assert!(acme["debt_units"].as_u64().unwrap() > 0, "{acme}");
    assert!(acme["refusals"].as_u64().unwrap() >= 1, "{acme}");

    // Tenant balances: the roll-up and the one partition equal /v1/partitions.
    let (status, t) = s.get(&at("/v1/tenants/acme/balances")).await;
    assert_eq!(status, StatusCode::OK, "{t}");
    assert_eq!(t["name"], "acme");
    assert_eq!(t["total"]["partitions"], 1);
    ledger_matches(&t["total"]["ledger"], &t["total"]["debt_units"], acme);
    assert_eq!(t["total"]["refusals"], acme["refusals"]);
    assert_eq!(t["total"]["open_reservations"], acme["open_reservations"]);
    let tp = &t["partitions"][0];
    assert_eq!(t["partitions"].as_array().unwrap().len(), 1);
    ledger_matches(&tp["ledger"], &tp["debt_units"], acme);
    assert_eq!(tp["frozen"], true, "{tp}");
    assert_eq!(tp["partition_key"]["subject"], "acme");
    assert_eq!(tp["partition_key"]["policy_generation"], 1);

    // Route balances: both tenants, summing to the route roll-up.
    let (status, r) = s.get(&at("/v1/routes/chat/balances")).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["total"]["partitions"], 2);
    let rp = r["partitions"].as_array().unwrap();
    assert_eq!(rp.len(), 2);
    for term in ["available_units", "reserved_units", "spent_units"] {
        let sum: u64 = parts.iter().map(|p| p[term].as_u64().unwrap()).sum();
        assert_eq!(r["total"]["ledger"][term], sum, "{term}");
    }
    for p in rp {
        let live = parts
            .iter()
            .find(|v| v["subject"] == p["partition_key"]["subject"])
            .unwrap();
        ledger_matches(&p["ledger"], &p["debt_units"], live);
    }

    // Estimates: per model, merged, warm/cold, input drift.
    let (status, e) = s.get(&at("/v1/routes/chat/estimate")).await;
    assert_eq!(status, StatusCode::OK, "{e}");
    assert_eq!(e["model"], "*");
    assert_eq!(e["samples"], 2, "{e}");
    assert_eq!(e["temperature"], "cold");
    assert_eq!(e["warm"], false);
    assert_eq!(e["input_drift"]["samples"], 1, "{e}");
    assert_eq!(e["input_drift"]["multiplier_ppm"], 1_100_000, "{e}");
    let (status, e) = s
        .get(&format!(
            "/v1/routes/chat/estimate?model=m1&min_samples=1&min_position={last}"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{e}");
    assert_eq!(
        (e["samples"].as_u64(), e["warm"].as_bool()),
        (Some(1), Some(true))
    );
    assert_eq!(e["temperature"], "warm");
    for q in ["p50_units", "p75_units", "p90_units", "p99_units"] {
        assert_eq!(e[q], 700, "{q}: {e}");
    }
    let (_, e) = s.get("/v1/routes/chat/estimate?model=nope").await;
    assert_eq!(e["samples"], 0);
    assert!(e["p50_units"].is_null());
    let (_, e) = s.get("/v1/routes/elsewhere/estimate").await;
    assert_eq!(
        (e["samples"].as_u64(), e["warm"].as_bool()),
        (Some(0), Some(false))
    );

    // Efficiency: settled ÷ reserved of the two settles, per route and tenant.
    let settled = 900 + available + 400;
    let reserved = 1_000 + available;
    for path in ["/v1/routes/chat/efficiency", "/v1/tenants/acme/efficiency"] {
        let (status, f) = s.get(&at(path)).await;
        assert_eq!(status, StatusCode::OK, "{f}");
        assert_eq!(f["samples"], 2, "{path}: {f}");
        assert_eq!(f["settled_units"], settled);
        assert_eq!(f["reserved_units"], reserved);
        assert_eq!(f["overall_permille"], settled * 1000 / reserved);
        let buckets: u64 = f["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .sum();
        assert_eq!(buckets, 2);
    }
    let (_, f) = s.get("/v1/tenants/other/efficiency").await;
    assert_eq!(f["samples"], 0);

    // Diagnosis: sees the refusal and the settles.
    let (status, d) = s.get(&at("/v1/tenants/acme/diagnosis")).await;
    assert_eq!(status, StatusCode::OK, "{d}");
    assert_eq!(d["tenant"], "acme");
    assert_eq!(d["refusals"], acme["refusals"], "{d}");
    assert_eq!(d["settled_samples"], 2);
    let verdicts = [
        "healthy",
        "over_reservation",
        "burst_capacity",
        "limit_too_low",
        "inconclusive",
    ];
    assert!(verdicts.contains(&d["verdict"].as_str().unwrap()), "{d}");
    assert!(!d["explanation"].as_str().unwrap().is_empty());

    // Unknown names.
    let (status, body) = s.get("/v1/tenants/nobody/balances").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(problem_type(&body), "not_found");
    let (status, body) = s.get("/v1/projections/reservations/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(problem_type(&body), "unknown_reservation");

    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_past_the_log_is_409_at_once_and_bad_params_are_400() {
    let (s, _log, _dir) = TestServer::memory().await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    let (_, r) = s.reserve("a", "t", "r", 10).await;
    let offset = r["log_position"]["offset"].as_u64().unwrap();

    // A bare offset means log partition 0.
    let (status, body) = s
        .get(&format!(
            "/v1/projections/reservations/a?min_position={offset}"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Past the end of the log no wait helps: answered without waiting out
    // the 10 s asked for (it would be a 503 `projection_behind` after it).
    let started = std::time::Instant::now();
    let response = s
        .client
        .get(format!(
            "{}/v1/tenants/t/balances?min_position=0:{}&wait_ms=10000",
            s.base,
            offset + 1_000
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let (_, body) = split(response).await;
    assert_eq!(problem_type(&body), "position_beyond_log", "{body}");
    assert_eq!(body["retryable"], false);
    // The log's own end is the bound: the next offset is past it, the last
    // written one is not.
    let (status, body) = s
        .get(&format!(
            "/v1/routes/r/efficiency?min_position={}&wait_ms=0",
            offset + 1
        ))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = s
        .get(&format!(
            "/v1/tenants/t/balances?min_position={offset}&wait_ms=0"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A log partition the log does not have is past its end too.
    let (status, body) = s.get("/v1/tenants/t/balances?min_position=7:1").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(problem_type(&body), "position_beyond_log", "{body}");

    for bad in [
        "/v1/tenants/t/balances?min_position=abc",
        "/v1/tenants/t/balances?min_position=0:",
        "/v1/tenants/t/balances?min_position=-1",
        "/v1/tenants/t/balances?wait_ms=10001",
        "/v1/tenants/t/balances?wait_ms=soon",
        "/v1/tenants/t/balances?unknown=1",
        "/v1/tenants/t/diagnosis?model=m",
        "/v1/routes/r/estimate?min_samples=many",
        "/v1/routes/r/estimate?model=",
        "/v1/routes/r%7Cx/balances",
    ] {
        let response = s
            .client
            .get(format!("{}{bad}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{bad}"
        );
        let (_, body) = split(response).await;
        assert!(
            ["invalid_query", "invalid_path"].contains(&problem_type(&body)),
            "{bad}: {body}"
        );
    }
    // An id outside the id rule names nothing: 400, as the OpenAPI document says.
    let (status, body) = s.get("/v1/projections/reservations/bad%20id").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(problem_type(&body), "invalid_path", "{body}");
    s.assert_conserved().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_projection_survives_a_restart_in_the_same_data_dir() {
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_in(dir.path()).await;
    s.publish(&policy("t", "r", 1, 1_000, 0), "e").await;
    let r = call_for(&s, "a", 100).await;
    let (status, before) = s
        .get(&format!(
            "/v1/tenants/t/balances?min_position={}",
            log_position(&r)
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{before}");
    s.stop().await;

    // Reopened: resumes from its stored positions, and follows new writes.
    let s = TestServer::embedded_in(dir.path()).await;
    let (status, after) = s
        .get(&format!(
            "/v1/tenants/t/balances?min_position={}",
            log_position(&r)
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(before["total"], after["total"]);
    let r = call_for(&s, "b", 200).await;
    let (_, after) = s
        .get(&format!(
            "/v1/tenants/t/balances?min_position={}",
            log_position(&r)
        ))
        .await;
    let parts = s.assert_conserved().await;
    ledger_matches(
        &after["total"]["ledger"],
        &after["total"]["debt_units"],
        &parts[0],
    );
    assert_eq!(after["total"]["ledger"]["spent_units"], 300);
    s.stop().await;
}

async fn call_for(s: &TestServer, id: &str, units: u64) -> Value {
    let (status, r) = s.reserve(id, "t", "r", units).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    s.post(
        &format!("/v1/reservations/{id}/start"),
        json!({"operation_id": "op"}),
    )
    .await;
    let (status, r) = s
        .post(
            &format!("/v1/reservations/{id}/settle"),
            json!({"actual_units": units}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_endpoints_are_in_the_openapi_document() {
    let (s, _log, _dir) = TestServer::memory().await;
    let (status, doc) = s.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    for path in [
        "/v1/tenants/{tenant}/balances",
        "/v1/tenants/{tenant}/efficiency",
        "/v1/tenants/{tenant}/diagnosis",
        "/v1/routes/{route}/balances",
        "/v1/routes/{route}/estimate",
        "/v1/routes/{route}/efficiency",
        "/v1/projections/reservations/{id}",
    ] {
        let get = &doc["paths"][path]["get"];
        assert!(get.is_object(), "{path} missing");
        for status in ["200", "400", "503"] {
            assert!(get["responses"][status].is_object(), "{path} {status}");
        }
        let params: BTreeSet<&str> = get["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(
            params.contains("min_position") && params.contains("wait_ms"),
            "{path}: {params:?}"
        );
    }
    for schema in [
        "BalancesView",
        "EstimateView",
        "EfficiencyView",
        "DiagnosisView",
        "ReservationRecordView",
        "LedgerView",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }
    let ledger = doc["components"]["schemas"]["LedgerView"]["properties"]
        .as_object()
        .unwrap();
    for name in Term::ALL.iter().map(|t| t.name()).chain(["conservation"]) {
        assert!(ledger.contains_key(name), "LedgerView: {name}");
    }
    assert_eq!(ledger.len(), Term::ALL.len() + 1);
    let estimate = doc["components"]["schemas"]["EstimateView"]["properties"]
        .as_object()
        .unwrap();
    for field in [
        "p50_units",
        "p75_units",
        "p90_units",
        "p99_units",
        "samples",
        "warm",
    ] {
        assert!(estimate.contains_key(field), "{field}");
    }
    s.stop().await;
}

/// One client's cycle for the rebuild test: reserve, then release (every
/// fifth), settle above the reservation (every seventh: debt), or settle
/// below it. Returns the last receipt.
async fn cycle(client: reqwest::Client, base: String, tenant: &str, i: u32) -> Value {
    let post = |path: String, body: Value| {
        let request = client.post(format!("{base}{path}")).json(&body);
        async move {
            let r = request.send().await.unwrap();
            let status = r.status();
            let body: Value = r.json().await.unwrap();
            assert!(status.is_success(), "{path}: {status} {body}");
            body
        }
    };
    let id = format!("{tenant}-{i}");
    let body = json!({"id": id, "subject": tenant, "route": "chat", "units": 300});
    let reserved = post("/v1/reservations".into(), body).await;
    if i.is_multiple_of(5) {
        return post(format!("/v1/reservations/{id}/release"), json!({})).await;
    }
    let start = json!({"operation_id": format!("op-{id}")});
    post(format!("/v1/reservations/{id}/start"), start).await;
    let actual = if i.is_multiple_of(7) {
        420
    } else {
        120 + u64::from(i)
    };
    let usage = json!({"model": "m1", "output_tokens": actual});
    let settled = post(
        format!("/v1/reservations/{id}/settle"),
        json!({"actual_units": actual, "usage": usage}),
    )
    .await;
    assert_ne!(reserved["log_position"], settled["log_position"]);
    settled
}

/// The projection `reservoir serve` builds while it writes (its projector
/// takes most entries from the embedded log's tail, the records as they were
/// appended, not read back from the disk) is byte for byte what a projector
/// rebuilds from the log on disk afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_projection_equals_a_rebuild_from_the_log() {
    use reservoir_log::embedded::EmbeddedLog;
    use reservoir_projections::{dump, store, Projector, ProjectorConfig};
    use reservoir_server::queries::PROJECTIONS_DIR;

    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_in(dir.path()).await;
    for tenant in ["acme", "globex"] {
        let (status, body) = s
            .publish(&policy(tenant, "chat", 1, 1_000_000, 0), "e")
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    // Sixteen clients at once, so the writer batches their commands.
    let mut clients = tokio::task::JoinSet::new();
    for client in 0..16u32 {
        let (http, base) = (s.client.clone(), s.base.clone());
        clients.spawn(async move {
            let tenant = if client % 2 == 0 { "acme" } else { "globex" };
            for i in 0..12 {
                cycle(http.clone(), base.clone(), tenant, client * 100 + i).await;
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    // A last write, and the projection caught up to it (to all before it).
    let last = cycle(s.client.clone(), s.base.clone(), "acme", 9_999).await;
    projected(&s, "acme-9999", &last).await;
    s.assert_conserved().await;
    s.stop().await;

    let served = dump(&store::open(dir.path().join(PROJECTIONS_DIR)).unwrap()).unwrap();
    let log = std::sync::Arc::new(EmbeddedLog::open(dir.path().join("log"), "rebuild").unwrap());
    let rebuilt_dir = crate::support::tempdir().unwrap();
    let db = store::open(rebuilt_dir.path()).unwrap();
    let mut projector = Projector::open(log, db.clone(), ProjectorConfig::default()).unwrap();
    let events = projector.catch_up().await.unwrap();
    assert!(events > 16 * 12 * 2, "{events} events");
    let rebuilt = dump(&db).unwrap();
    assert!(served.len() > 16 * 12, "{} rows", served.len());
    if let Some(diff) = store::first_difference(&served, &rebuilt) {
        panic!("served vs rebuilt: {diff}");
    }
    assert_eq!(served.len(), rebuilt.len());
}
