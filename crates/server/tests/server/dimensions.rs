//! Limits in several dimensions over HTTP (issue 15): a three-dimension policy
//! (requests, input tokens, output tokens) through the real server, the
//! rate-limit headers against the partition's balances, settles derived from
//! usage, and a 429 naming each dimension.

use std::time::Duration;

use reqwest::StatusCode;
use reservoir_core::Policy;
use serde_json::{json, Value};

use crate::support::*;

/// 60 requests, 100,000 input and 20,000 output tokens a minute, full at start.
fn three(subject: &str) -> Policy {
    Policy::example_three_dimensions(subject, "chat.generate", 1)
}

async fn publish(server: &TestServer, policy: &Policy) {
    let (status, body) = server.publish(policy, "2026-12").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// A sized reserve, with its response headers.
async fn reserve(
    server: &TestServer,
    id: &str,
    subject: &str,
    input: u64,
    max_tokens: u64,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let r = server
        .client
        .post(format!("{}/v1/reservations", server.base))
        .json(
            &json!({"id": id, "subject": subject, "route": "chat.generate",
            "counted_input_tokens": input, "max_tokens": max_tokens}),
        )
        .send()
        .await
        .unwrap();
    let headers = r.headers().clone();
    let (status, body) = split(r).await;
    (status, headers, body)
}

fn header<'h>(headers: &'h reqwest::header::HeaderMap, name: &str) -> &'h str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
        .to_str()
        .unwrap()
}

/// The partition of `subject`, checked for conservation in every dimension.
async fn partition(server: &TestServer, subject: &str) -> Value {
    server
        .assert_conserved()
        .await
        .into_iter()
        .find(|p| p["subject"] == subject)
        .expect("the subject's partition")
}

/// `(dimension, available, reserved, debt)` for every dimension, primary first.
fn books(p: &Value) -> Vec<(String, u64, u64, u64)> {
    let row = |d: &Value, name: String| {
        let u = |k: &str| d[k].as_u64().unwrap();
        (
            name,
            u("available_units"),
            u("reserved_units"),
            u("debt_units"),
        )
    };
    std::iter::once(row(p, "requests".into()))
        .chain(
            p["dimensions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| row(d, d["dimension"].as_str().unwrap().to_string())),
        )
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reservation_holds_every_dimension_and_the_headers_say_what_is_left() {
    // Time stands still unless the test moves it, so no refill lands between
    // an answer and the balances it is compared with.
    let dir = crate::support::tempdir().unwrap();
    let clock = reservoir_server::clock::ManualClock::new(1_784_469_600_000);
    let server =
        TestServer::embedded_on_clock(dir.path(), std::sync::Arc::new(clock.clone())).await;
    publish(&server, &three("t-dims")).await;

    let (status, headers, receipt) = reserve(&server, "d-1", "t-dims", 1_000, 2_000).await;
    assert_eq!(status, StatusCode::CREATED, "{receipt}");
    assert_eq!(
        receipt["reserved_units"], 1,
        "the primary dimension: one request"
    );
    assert_eq!(
        receipt["dimensions"],
        json!([
            {"dimension": "input_tokens", "reserved_units": 1000, "held_units": 1000, "actual_units": null, "overdraft_units": 0},
            {"dimension": "output_tokens", "reserved_units": 2000, "held_units": 2000, "actual_units": null, "overdraft_units": 0},
        ])
    );
    let p = partition(&server, "t-dims").await;
    assert_eq!(
        books(&p),
        vec![
            ("requests".into(), 59, 1, 0),
            ("input_tokens".into(), 99_000, 1_000, 0),
            ("output_tokens".into(), 18_000, 2_000, 0),
        ]
    );
    // The headers are those balances.
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        r#""requests";q=60;w=60, "input_tokens";q=100000;w=60, "output_tokens";q=20000;w=60"#
    );
    let ratelimit = header(&headers, "ratelimit");
    for (name, available, reserved, _) in books(&p) {
        assert!(
            ratelimit.contains(&format!("\"{name}\";r={available};")),
            "{ratelimit} lacks {name}={available}"
        );
        let suffix = name.replace('_', "-");
        assert_eq!(
            header(&headers, &format!("x-ratelimit-remaining-{suffix}")),
            available.to_string()
        );
        assert_eq!(
            header(&headers, &format!("x-ratelimit-limit-{suffix}")),
            (available + reserved).to_string(),
            "a full bucket minus nothing spent"
        );
    }
    assert_eq!(header(&headers, "x-ratelimit-reset-requests"), "0ms");

    // Settled from usage alone: input as reported, output 23,000 against the
    // 2,000 held and 18,000 available: 3,000 of debt in output only.
    let (status, _) = server
        .post(
            "/v1/reservations/d-1/start",
            json!({"operation_id": "op-1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, settled) = server
        .post(
            "/v1/reservations/d-1/settle",
            json!({"usage": {"reported_input_tokens": 800, "cache_read_input_tokens": 50,
                "output_tokens": 23_000, "model": "claude-sonnet-4"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{settled}");
    assert_eq!(settled["state"], "SETTLED_WITH_DEBT");
    assert_eq!(settled["actual_units"], 1);
    assert_eq!(
        settled["dimensions"][0]["actual_units"], 850,
        "cache reads count"
    );
    assert_eq!(settled["dimensions"][1]["overdraft_units"], 3_000);
    // The route's efficiency in output tokens alone, once projected.
    let at = format!(
        "{}:{}",
        settled["log_position"]["log_partition"], settled["log_position"]["offset"]
    );
    let (status, eff) = server
        .get(&format!(
            "/v1/routes/chat.generate/efficiency?dimension=output_tokens&min_position={at}"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{eff}");
    assert_eq!(
        (
            &eff["samples"],
            &eff["settled_units"],
            &eff["reserved_units"]
        ),
        (&json!(1), &json!(23_000), &json!(2_000))
    );
    let (status, problem) = server
        .get("/v1/routes/chat.generate/efficiency?dimension=cached_tokens")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    let p = partition(&server, "t-dims").await;
    assert_eq!(
        books(&p),
        vec![
            ("requests".into(), 59, 0, 0),
            ("input_tokens".into(), 99_150, 0, 0),
            ("output_tokens".into(), 0, 0, 3_000),
        ]
    );

    // Admission is frozen while output owes: the 429 names it, and its
    // headers show nothing left there.
    let (status, headers, problem) = reserve(&server, "d-2", "t-dims", 10, 10).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{problem}");
    assert_eq!(problem_type(&problem), "debt_outstanding");
    assert_eq!(problem["limiting_dimension"], "output_tokens");
    assert!(header(&headers, "retry-after").parse::<u64>().unwrap() >= 9);
    assert_eq!(header(&headers, "x-ratelimit-remaining-output-tokens"), "0");
    assert_eq!(
        header(&headers, "x-ratelimit-remaining-input-tokens"),
        "99150"
    );
    // A settle retried with the same usage is the same answer, not a second debit.
    let (status, again) = server
        .post(
            "/v1/reservations/d-1/settle",
            json!({"usage": {"reported_input_tokens": 800, "cache_read_input_tokens": 50,
                "output_tokens": 23_000, "model": "claude-sonnet-4"}}),
        )
        .await;
    assert_eq!(
        (status, &again["state"]),
        (StatusCode::OK, &settled["state"])
    );
    assert_eq!(
        books(&partition(&server, "t-dims").await)[2],
        ("output_tokens".into(), 0, 0, 3_000)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_names_each_dimension_that_refuses() {
    let dir = crate::support::tempdir().unwrap();
    let clock = reservoir_server::clock::ManualClock::new(1_784_469_600_000);
    let server =
        TestServer::embedded_on_clock(dir.path(), std::sync::Arc::new(clock.clone())).await;
    // requests: a bucket of one request; input and output: small buckets.
    let mut requests = three("t-req");
    (requests.burst_units, requests.opening_units) = (1, 1);
    let mut input = three("t-in");
    input.dimensions[0].opening_units = 500;
    let mut output = three("t-out");
    output.dimensions[1].opening_units = 500;
    for p in [&requests, &input, &output] {
        publish(&server, p).await;
    }
    let (status, _, _) = reserve(&server, "r-1", "t-req", 10, 10).await;
    assert_eq!(status, StatusCode::CREATED);
    for (id, subject, counted, max, dimension) in [
        ("r-2", "t-req", 10, 10, "requests"),
        ("i-1", "t-in", 1_000, 10, "input_tokens"),
        ("o-1", "t-out", 10, 1_000, "output_tokens"),
    ] {
        let (status, headers, problem) = reserve(&server, id, subject, counted, max).await;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "{subject}: {problem}"
        );
        assert_eq!(problem_type(&problem), "insufficient_capacity");
        assert_eq!(problem["limiting_dimension"], dimension, "{subject}");
        assert!(headers.contains_key("retry-after"));
        assert!(headers.contains_key("ratelimit"));
    }
    // Too large in one dimension is 422 and names it too.
    let (status, _, problem) = reserve(&server, "i-2", "t-in", 100_001, 10).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem_type(&problem), "request_too_large");
    // Explicit units name one dimension: a three-dimension policy refuses them.
    let (status, problem) = server.reserve("u-1", "t-in", "chat.generate", 5).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem_type(&problem), "invalid_input");
    // A settle without the usage a token dimension needs is refused, typed.
    let (status, _, receipt) = reserve(&server, "r-ok", "t-out", 10, 10).await;
    assert_eq!(status, StatusCode::CREATED);
    // Diagnosis per dimension: t-in was refused in input tokens only (i-1
    // for capacity, i-2 as too large).
    let at = log_position(&receipt);
    for (dimension, refusals) in [
        ("", 2),
        ("input_tokens", 2),
        ("output_tokens", 0),
        ("requests", 0),
    ] {
        let query = match dimension {
            "" => format!("/v1/tenants/t-in/diagnosis?min_position={at}"),
            d => format!("/v1/tenants/t-in/diagnosis?dimension={d}&min_position={at}"),
        };
        let (status, d) = server.get(&query).await;
        assert_eq!(status, StatusCode::OK, "{query}: {d}");
        assert_eq!(d["refusals"], refusals, "{query}: {d}");
        let named = (!dimension.is_empty()).then_some(dimension);
        assert_eq!(d["dimension"].as_str(), named, "{d}");
    }
    let (status, d) = server
        .get("/v1/tenants/t-in/diagnosis?dimension=cached")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{d}");
    server
        .post(
            "/v1/reservations/r-ok/start",
            json!({"operation_id": "op-ok"}),
        )
        .await;
    let (status, problem) = server
        .post("/v1/reservations/r-ok/settle", json!({"actual_units": 1}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem_type(&problem), "invalid_input");
    partition(&server, "t-out").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_dimension_policy_answers_with_its_own_headers() {
    let dir = crate::support::tempdir().unwrap();
    let clock = reservoir_server::clock::ManualClock::new(1_784_469_600_000);
    let server =
        TestServer::embedded_on_clock(dir.path(), std::sync::Arc::new(clock.clone())).await;
    let (status, _) = server
        .publish(&Policy::example("t-one", "chat.generate", 1), "2026-12")
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let r = server
        .client
        .post(format!("{}/v1/reservations", server.base))
        .json(&json!({"id": "o-1", "subject": "t-one", "route": "chat.generate", "units": 600}))
        .send()
        .await
        .unwrap();
    let headers = r.headers().clone();
    let (status, receipt) = split(r).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(receipt.get("dimensions").is_none(), "{receipt}");
    assert_eq!(header(&headers, "x-ratelimit-remaining-tokens"), "9400");
    assert_eq!(header(&headers, "x-ratelimit-limit-tokens"), "10000");
    assert_eq!(header(&headers, "ratelimit"), r#""tokens";r=9400;t=0"#);
    // Settled with `actual_units` alone, as before dimensions.
    server
        .post("/v1/reservations/o-1/start", json!({"operation_id": "op"}))
        .await;
    let (status, settled) = server
        .post("/v1/reservations/o-1/settle", json!({"actual_units": 200}))
        .await;
    assert_eq!(
        (status, &settled["actual_units"]),
        (StatusCode::OK, &json!(200))
    );
    partition(&server, "t-one").await;
    server.stop().await;
}

/// The sweepers refill a partition while any of its dimensions has room below
/// its burst (or owes): the output-token bucket refills while the requests
/// bucket beside it is full. They looked at the primary dimension alone, so a
/// token bucket stood still in the books, the projections and the rate-limit
/// headers until a reserve came by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweepers_refill_a_token_bucket_beside_a_full_requests_bucket() {
    let (s, _dir) = TestServer::embedded().await;
    let mut p = Policy::example_three_dimensions("fill", "chat.generate", 1);
    // Requests back within milliseconds; output tokens at 2 a millisecond.
    p.refill.interval_ms = 1_000;
    p.dimensions[1].refill.interval_ms = 10_000;
    publish(&s, &p).await;
    let (status, _, body) = reserve(&s, "big", "fill", 100, 15_000).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = s
        .post("/v1/reservations/big/start", json!({"operation_id": "op"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = s
        .post(
            "/v1/reservations/big/settle",
            json!({"usage": {"reported_input_tokens": 100, "output_tokens": 15_000}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let output_available = |p: &Value| p["dimensions"][1]["available_units"].as_u64().unwrap();
    let after_settle = output_available(&partition(&s, "fill").await);
    assert!(after_settle < 6_000, "{after_settle}");
    // Requests full again long before; output tokens keep coming back.
    let refilled = eventually(Duration::from_secs(10), || async {
        let p = partition(&s, "fill").await;
        let requests_full = p["available_units"] == 60;
        (requests_full && output_available(&p) >= after_settle + 2_000).then_some(p)
    })
    .await;
    assert_eq!(books(&refilled)[0].1, 60);
    s.stop().await;
}
