//! Shadow mode someone can see, and staged rollout, through the real server:
//! a shadow policy admits everything and records what enforcement would
//! have said, in the receipt (`mode`, `would_refuse` with reason and
//! dimension), in `/metrics` and in the shadow queries of its route and its
//! tenant (and nobody else's); a rollout enforces exactly the routes its
//! stable hash picks, and raising its fraction only adds routes.

use reqwest::StatusCode;
use reservoir_core::Rollout;
use serde_json::{json, Value};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_verdicts_are_in_the_receipt_the_metrics_and_the_queries() {
    let (s, _dir) = TestServer::embedded().await;
    let mut p = policy("t", "r", 1, 100, 0);
    p.shadow_mode = true;
    s.publish(&p, "e").await;
    s.publish(&policy("other", "r", 1, 100, 0), "e").await;

    let (status, first) = s.reserve("a", "t", "r", 60).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["mode"], "shadow");
    assert!(first.get("would_refuse").is_none(), "{first}");
    assert_eq!(first["held_units"], 60);
    // Enforcement would refuse this one (40 left): admitted, holding nothing.
    let (status, second) = s.reserve("b", "t", "r", 60).await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    assert_eq!(second["mode"], "shadow");
    assert_eq!(
        second["would_refuse"],
        json!({"reason": "insufficient_capacity", "dimension": "tokens"})
    );
    assert_eq!(second["held_units"], 0);
    let (status, enforced) = s.reserve("c", "other", "r", 10).await;
    assert_eq!(status, StatusCode::CREATED, "{enforced}");
    assert_eq!(enforced["mode"], "enforce");
    s.assert_conserved().await;

    let metrics = s.metrics().await;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("reservoir_shadow_verdicts_total")
                && l.contains("would_refuse_insufficient_capacity")
        })
        .unwrap_or_else(|| panic!("no shadow verdict metric in\n{metrics}"));
    assert!(line.contains(r#"dimension="tokens""#), "{line}");
    assert!(line.contains(r#"route="r""#), "{line}");

    let at = log_position(&enforced);
    let server = &s;
    let query = |path: String| async move {
        let (status, body) = server.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        body
    };
    let expected = json!([{"reason": "insufficient_capacity", "dimension": "tokens", "count": 1}]);
    for path in [
        format!("/v1/routes/r/shadow?min_position={at}"),
        format!("/v1/tenants/t/shadow?min_position={at}"),
    ] {
        let body: Value = query(path).await;
        assert_eq!(
            (body["would_admit"].clone(), body["would_refuse"].clone()),
            (json!(1), json!(1)),
            "{body}"
        );
        assert_eq!(body["reasons"], expected);
    }
    // Another tenant's verdicts are not the enforcing tenant's to see.
    let other: Value = query(format!("/v1/tenants/other/shadow?min_position={at}")).await;
    assert_eq!(
        (other["would_admit"].clone(), other["would_refuse"].clone()),
        (json!(0), json!(0))
    );
    // A window before the verdicts holds none; a bad window is a 400.
    let before: Value = query(format!("/v1/routes/r/shadow?to_ms=1&min_position={at}")).await;
    assert_eq!(before["would_refuse"], 0);
    let (status, body) = s.get("/v1/routes/r/shadow?from_ms=5&to_ms=1").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(problem_type(&body), "invalid_query");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_enforces_the_routes_its_hash_picks_and_raising_it_only_adds() {
    let (s, _dir) = TestServer::embedded().await;
    let routes: Vec<String> = (0..60).map(|i| format!("route-{i}")).collect();
    let mut enforced_before = Vec::new();
    for (generation, per_million) in [(1, 250_000), (2, 500_000)] {
        let rollout = Rollout {
            enforced_per_million: per_million,
            salt: "rollout-1".into(),
        };
        let mut enforced = Vec::new();
        for route in &routes {
            let mut p = policy("t", route, generation, 100, 0);
            p.rollout = Some(rollout.clone());
            let (status, body) = s.publish(&p, "e").await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            let id = format!("g{generation}-{route}");
            let (status, r) = s.reserve(&id, "t", route, 1).await;
            assert_eq!(status, StatusCode::CREATED, "{r}");
            let mode = r["mode"].as_str().unwrap().to_string();
            let expected = if rollout.enforces(route) {
                "enforce"
            } else {
                "shadow"
            };
            assert_eq!(mode, expected, "{route} at {per_million} ppm");
            if mode == "enforce" {
                enforced.push(route.clone());
            }
        }
        assert!(
            enforced_before.iter().all(|r| enforced.contains(r)),
            "raising the fraction dropped a route: {enforced_before:?} then {enforced:?}"
        );
        assert!(
            !enforced.is_empty() && enforced.len() < routes.len(),
            "{enforced:?}"
        );
        enforced_before = enforced;
    }
    s.assert_conserved().await;

    // Out of range is refused before anything opens.
    let mut p = policy("t", "bad", 1, 100, 0);
    p.rollout = Some(Rollout {
        enforced_per_million: 1_000_001,
        salt: "s".into(),
    });
    let (status, body) = s.publish(&p, "e").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    s.stop().await;
}
