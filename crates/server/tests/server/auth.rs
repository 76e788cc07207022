//! Who may do what (`reservoir_server::auth`), through a real server.
//!
//! `every_endpoint_answers_every_role_as_the_table_says`: one row per endpoint,
//! one column per role, the expected status in each cell. The same table runs
//! against a cluster in `auth_cluster`. `tenant_a_learns_nothing_about_tenant_b`:
//! B's ids and names answer A exactly as ids and names that do not exist.
//! The OpenAPI document's scopes are checked against the same table.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use reqwest::header::{HeaderMap, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};
use reservoir_server::auth::tokens::{create, NewToken};
use reservoir_server::auth::AuthConfig;
use serde_json::{json, Value};

use crate::support::*;

/// The callers of the table, in its column order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    None,
    Bad,
    GatewayA,
    GatewayB,
    TenantReadA,
    Operator,
    Metrics,
}
pub const ROLES: [Role; 7] = [
    Role::None,
    Role::Bad,
    Role::GatewayA,
    Role::GatewayB,
    Role::TenantReadA,
    Role::Operator,
    Role::Metrics,
];

/// A tokens file with one token per role (but none and bad).
pub struct Tokens {
    pub file: PathBuf,
    tokens: Vec<(Role, String)>,
}

impl Tokens {
    pub fn create_in(dir: &Path) -> Tokens {
        let file = dir.join("tokens.toml");
        let new = |role, principal, scopes: &[&str], subjects: &[&str]| {
            let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
            let subjects: Vec<String> = subjects.iter().map(|s| s.to_string()).collect();
            let token = create(
                &file,
                &NewToken {
                    principal,
                    scopes: &scopes,
                    subjects: &subjects,
                    subject_prefixes: &[],
                },
            )
            .unwrap();
            (role, token)
        };
        let tokens = vec![
            new(Role::GatewayA, "gw-a", &["gateway"], &["tenant-a"]),
            new(Role::GatewayB, "gw-b", &["gateway"], &["tenant-b"]),
            new(Role::TenantReadA, "read-a", &["tenant-read"], &["tenant-a"]),
            new(Role::Operator, "ops", &["operator"], &[]),
            new(Role::Metrics, "prometheus", &["metrics"], &[]),
        ];
        Tokens { file, tokens }
    }

    pub fn of(&self, role: Role) -> Option<String> {
        match role {
            Role::None => None,
            Role::Bad => Some("rsv_0000000000000000000000000000000000000000".to_string()),
            role => self
                .tokens
                .iter()
                .find(|(r, _)| *r == role)
                .map(|(_, t)| t.clone()),
        }
    }

    pub fn auth_config(&self) -> AuthConfig {
        AuthConfig {
            tokens_file: Some(self.file.clone()),
            ..AuthConfig::default()
        }
    }

    /// A client that sends `role`'s token on every request.
    pub fn client(&self, role: Role) -> reqwest::Client {
        let mut headers = HeaderMap::new();
        if let Some(token) = self.of(role) {
            headers.insert(AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        }
        reqwest::Client::builder()
            .default_headers(headers)
            .timeout(std::time::Duration::from_secs(40))
            .build()
            .unwrap()
    }
}

pub async fn send(
    client: &reqwest::Client,
    base: &str,
    method: &Method,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, Value, HeaderMap) {
    let mut request = client.request(method.clone(), format!("{base}{path}"));
    if let Some(body) = body {
        request = request.json(body);
    }
    let r = request.send().await.unwrap();
    let headers = r.headers().clone();
    let (status, body) = split(r).await;
    (status, body, headers)
}

/// The fixture the table reads: policies for tenant-a and tenant-b on `chat`,
/// and reservations of A's in every state a row needs. Returns where the
/// projection must be for A's and B's reads (`LP:OFFSET`).
pub async fn fixture(tokens: &Tokens, base: &str) -> (String, String) {
    let (op, a, b) = (
        tokens.client(Role::Operator),
        tokens.client(Role::GatewayA),
        tokens.client(Role::GatewayB),
    );
    for tenant in ["tenant-a", "tenant-b"] {
        let mut p = policy(tenant, "chat", 1, 100_000, 100);
        p.emergency_mode = reservoir_core::EmergencyMode::Enabled;
        let body = json!({"accounting_epoch": "e1", "policy": p});
        let (s, r, _) = send(&op, base, &Method::POST, "/v1/policies", Some(&body)).await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
    }
    let reserve = |id: &str, subject: &str| json!({"id": id, "subject": subject, "route": "chat", "units": 100});
    let post = Method::POST;
    for id in ["res-a", "res-start", "res-settle", "res-release"] {
        let (s, r, _) = send(
            &a,
            base,
            &post,
            "/v1/reservations",
            Some(&reserve(id, "tenant-a")),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
    }
    let (s, _, _) = send(
        &b,
        base,
        &post,
        "/v1/reservations",
        Some(&reserve("res-b", "tenant-b")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    for (client, id) in [(&a, "res-a"), (&a, "res-settle"), (&b, "res-b")] {
        let start = json!({"operation_id": format!("op-{id}")});
        let (s, r, _) = send(
            client,
            base,
            &post,
            &format!("/v1/reservations/{id}/start"),
            Some(&start),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{r}");
    }
    let mut at = Vec::new();
    for (client, id) in [(&a, "res-a"), (&b, "res-b")] {
        let settle = json!({"actual_units": 40});
        let (s, r, _) = send(
            client,
            base,
            &post,
            &format!("/v1/reservations/{id}/settle"),
            Some(&settle),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{r}");
        let p = &r["log_position"];
        at.push(format!("{}:{}", p["log_partition"], p["offset"]));
    }
    (at[0].clone(), at[1].clone())
}

/// A shard id no ledger issued.
const FORGED_SHARD: &str = "sh-00000000000000000000000000000000";

/// One endpoint, and the status each of [`ROLES`] gets.
pub struct Row(pub Method, pub String, pub Option<Value>, pub [u16; 7]);

pub fn table(at_a: &str) -> Vec<Row> {
    use Method as M;
    let q = format!("?min_position={at_a}");
    let new_policy =
        json!({"accounting_epoch": "e1", "policy": policy("tenant-a", "other", 1, 1_000, 10)});
    let row = |m: &M, path: &str, body: Option<Value>, expect| {
        Row(m.clone(), path.to_string(), body, expect)
    };
    //  columns:                                                          none bad gwA  gwB  readA ops  metrics
    vec![
        row(
            &M::POST,
            "/v1/policies",
            Some(new_policy),
            [401, 401, 403, 403, 403, 201, 403],
        ),
        row(
            &M::GET,
            "/v1/policies/tenant-a/chat",
            None,
            [401, 401, 200, 403, 200, 200, 403],
        ),
        row(
            &M::POST,
            "/v1/policies/tenant-a/chat/rollback",
            Some(json!({})),
            [401, 401, 403, 403, 403, 409, 403],
        ),
        row(
            &M::POST,
            "/v1/reservations",
            Some(json!({"id": "new-1", "subject": "tenant-a", "route": "chat", "units": 5})),
            [401, 401, 201, 403, 403, 403, 403],
        ),
        row(
            &M::GET,
            "/v1/reservations/res-a",
            None,
            [401, 401, 200, 404, 200, 200, 403],
        ),
        // An id nobody holds: a caller without the route's scope learns
        // nothing from it (in cluster mode the front, not an owner, answers).
        row(
            &M::GET,
            "/v1/reservations/res-none",
            None,
            [401, 401, 404, 404, 404, 404, 403],
        ),
        row(
            &M::POST,
            "/v1/reservations/res-none/settle",
            Some(json!({"actual_units": 7})),
            [401, 401, 404, 404, 403, 403, 403],
        ),
        row(
            &M::POST,
            "/v1/reservations/res-start/start",
            Some(json!({"operation_id": "op-s"})),
            [401, 401, 200, 404, 403, 403, 403],
        ),
        row(
            &M::POST,
            "/v1/reservations/res-settle/settle",
            Some(json!({"actual_units": 7})),
            [401, 401, 200, 404, 403, 403, 403],
        ),
        row(
            &M::POST,
            "/v1/reservations/res-release/release",
            Some(json!({})),
            [401, 401, 200, 404, 403, 403, 403],
        ),
        row(
            &M::GET,
            "/v1/partitions",
            None,
            [401, 401, 403, 403, 403, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/tenants/tenant-a/balances{q}"),
            None,
            [401, 401, 403, 403, 200, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/tenants/tenant-a/efficiency{q}"),
            None,
            [401, 401, 403, 403, 200, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/tenants/tenant-a/diagnosis{q}"),
            None,
            [401, 401, 403, 403, 200, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/routes/chat/balances{q}"),
            None,
            [401, 401, 403, 403, 403, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/routes/chat/estimate{q}"),
            None,
            [401, 401, 403, 403, 403, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/routes/chat/efficiency{q}"),
            None,
            [401, 401, 403, 403, 403, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/routes/chat/shadow{q}"),
            None,
            [401, 401, 403, 403, 403, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/tenants/tenant-a/shadow{q}"),
            None,
            [401, 401, 403, 403, 200, 200, 403],
        ),
        row(
            &M::GET,
            &format!("/v1/projections/reservations/res-a{q}"),
            None,
            [401, 401, 200, 404, 200, 200, 403],
        ),
        row(
            &M::POST,
            "/v1/shards",
            Some(json!({"subject": "tenant-a", "route": "chat", "units": 10,
                "gateway_id": "gw-a", "gateway_boot_epoch": 1, "ttl_ms": 60_000})),
            [401, 401, 201, 403, 403, 201, 403],
        ),
        row(
            &M::GET,
            "/v1/shards?subject=tenant-a",
            None,
            [401, 401, 200, 403, 200, 200, 403],
        ),
        // A forged shard: the scope and the subject are checked before the
        // signature, so only the callers who may reconcile learn it is bad.
        row(
            &M::POST,
            &format!("/v1/shards/{FORGED_SHARD}/reconcile"),
            Some(json!({
                "shard": {
                    "schema": "emergencyShard.v1", "shard_id": FORGED_SHARD,
                    "partition_key": {"subject": "tenant-a", "route": "chat",
                        "accounting_epoch": "e1", "policy_generation": 1},
                    "units": 10, "gateway_id": "gw-a", "gateway_boot_epoch": 1,
                    "fence_epoch": 1, "issued_at_ms": 1, "expires_at_ms": 2,
                    "signature": format!("ed25519:{}", "0".repeat(128)),
                },
                "gateway_id": "gw-a", "gateway_boot_epoch": 1, "receipts": [],
            })),
            [401, 401, 422, 403, 403, 422, 403],
        ),
        row(
            &M::GET,
            "/v1/shards/public-key",
            None,
            [200, 401, 200, 200, 200, 200, 200],
        ),
        row(
            &M::GET,
            "/metrics",
            None,
            [401, 401, 403, 403, 403, 200, 200],
        ),
        row(
            &M::GET,
            "/healthz",
            None,
            [200, 401, 200, 200, 200, 200, 200],
        ),
        row(
            &M::GET,
            "/readyz",
            None,
            [200, 401, 200, 200, 200, 200, 200],
        ),
        row(
            &M::GET,
            "/openapi.json",
            None,
            [200, 401, 200, 200, 200, 200, 200],
        ),
    ]
}

/// Runs `rows` against `base`, role by role; every 401 carries the Bearer
/// challenge and every refusal is problem+json.
pub async fn run_table(tokens: &Tokens, base: &str, rows: &[Row]) {
    let mut wrong = Vec::new();
    for Row(method, path, body, expect) in rows {
        for (role, want) in ROLES.iter().zip(expect) {
            let (status, answer, headers) =
                send(&tokens.client(*role), base, method, path, body.as_ref()).await;
            if status.as_u16() != *want {
                let answer: String = answer.to_string().chars().take(300).collect();
                wrong.push(format!(
                    "{method} {path} as {role:?}: {status}, want {want}: {answer}"
                ));
            }
            if status == StatusCode::UNAUTHORIZED {
                let challenge = headers
                    .get(WWW_AUTHENTICATE)
                    .map(|v| v.to_str().unwrap_or(""));
                assert!(
                    challenge.is_some_and(|c| c.starts_with("Bearer")),
                    "{method} {path}: {headers:?}"
                );
            }
            let content_type = headers.get("content-type").and_then(|v| v.to_str().ok());
            if status.is_client_error() && content_type != Some("application/problem+json") {
                wrong.push(format!(
                    "{method} {path} as {role:?}: {status} as {content_type:?}, not a problem"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "cells that differ from the table:\n{}",
        wrong.join("\n")
    );
}

pub async fn authenticated_server(dir: &Path) -> (TestServer, Tokens) {
    let tokens = Tokens::create_in(dir);
    let config = reservoir_server::Config {
        auth: tokens.auth_config(),
        ..test_config(dir)
    };
    let log = Arc::new(reservoir_log::memory::MemoryLog::new());
    let mut server = TestServer::start(log, config).await;
    // The harness's own reads (conservation) as an operator.
    server.client = tokens.client(Role::Operator);
    (server, tokens)
}

/// The scope a role's token holds.
fn scope_of(role: Role) -> Option<&'static str> {
    match role {
        Role::GatewayA | Role::GatewayB => Some("gateway"),
        Role::TenantReadA => Some("tenant-read"),
        Role::Operator => Some("operator"),
        Role::Metrics => Some("metrics"),
        Role::None | Role::Bad => None,
    }
}

/// The OpenAPI document declares for each row's operation exactly the
/// scopes whose tokens the table lets through (not 401, not 403), and 401
/// and 403 among its answers; an operation the anonymous caller may call
/// declares nothing.
fn assert_declared(doc: &Value, rows: &[Row]) {
    for Row(method, path, _, expect) in rows {
        let concrete: Vec<&str> = path.split('?').next().unwrap().split('/').collect();
        let template = doc["paths"].as_object().unwrap().keys().find(|t| {
            let t: Vec<&str> = t.split('/').collect();
            t.len() == concrete.len()
                && t.iter()
                    .zip(&concrete)
                    .all(|(t, c)| t == c || t.starts_with('{'))
        });
        let public = expect[0] != 401;
        let template = match template {
            Some(t) => t,
            None if public => continue, // `/openapi.json` does not describe itself
            None => panic!("{path} is not in the document"),
        };
        let operation = &doc["paths"][template][method.as_str().to_lowercase()];
        let mut granted: Vec<&str> = ROLES
            .iter()
            .zip(expect)
            .filter(|(_, status)| ![401, 403].contains(*status))
            .filter_map(|(role, _)| scope_of(*role))
            .collect();
        granted.sort();
        granted.dedup();
        let mut declared: Vec<&str> = operation["security"]
            .as_array()
            .map(|reqs| {
                reqs.iter()
                    .flat_map(|r| {
                        r["bearer"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|s| s.as_str().unwrap())
                    })
                    .collect()
            })
            .unwrap_or_default();
        declared.sort();
        if public {
            assert!(
                declared.is_empty(),
                "{method} {template} is public but declares {declared:?}"
            );
        } else {
            assert_eq!(declared, granted, "{method} {template}");
            for status in ["401", "403"] {
                assert!(
                    operation["responses"][status].is_object(),
                    "{method} {template} documents {status}"
                );
            }
        }
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_every_role_as_the_table_says() {
    let dir = crate::support::tempdir().unwrap();
    let (server, tokens) = authenticated_server(dir.path()).await;
    let (at_a, _) = fixture(&tokens, &server.base).await;
    let rows = table(&at_a);
    run_table(&tokens, &server.base, &rows).await;
    let (_, doc) = server.get("/openapi.json").await;
    assert_declared(&doc, &rows);
    // A path the subject check cannot read is a problem+json 400, not plain text.
    let op = tokens.client(Role::Operator);
    for path in ["/v1/tenants/%FF/balances", "/v1/policies/%FF/chat"] {
        let (status, body, headers) = send(&op, &server.base, &Method::GET, path, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(
            headers["content-type"], "application/problem+json",
            "{path}"
        );
    }
    server.assert_conserved().await;
    server.stop().await;
}

/// `answer` with `from` replaced by `to` in its body, and its header names.
fn normalized(
    answer: &(StatusCode, Value, HeaderMap),
    from: &str,
    to: &str,
) -> (StatusCode, String, Vec<String>) {
    let (status, body, headers) = answer;
    let mut names: Vec<String> = headers
        .keys()
        .map(|k| k.to_string())
        .filter(|k| k != "date")
        .collect();
    names.sort();
    (*status, body.to_string().replace(from, to), names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_a_learns_nothing_about_tenant_b() {
    let dir = crate::support::tempdir().unwrap();
    let (server, tokens) = authenticated_server(dir.path()).await;
    let (_, at_b) = fixture(&tokens, &server.base).await;
    let base = &server.base;
    let q = format!("?min_position={at_b}");
    // (who, method, path, body) with `B` for tenant-b's name or id, asked
    // again with tenant-z / res-z (which do not exist).
    let probes: Vec<(Role, Method, String, Option<Value>)> = vec![
        (
            Role::GatewayA,
            Method::GET,
            "/v1/reservations/res-B".into(),
            None,
        ),
        (
            Role::GatewayA,
            Method::POST,
            "/v1/reservations/res-B/start".into(),
            Some(json!({"operation_id": "op-x"})),
        ),
        (
            Role::GatewayA,
            Method::POST,
            "/v1/reservations/res-B/settle".into(),
            Some(json!({"actual_units": 1})),
        ),
        (
            Role::GatewayA,
            Method::POST,
            "/v1/reservations/res-B/release".into(),
            Some(json!({})),
        ),
        (
            Role::GatewayA,
            Method::GET,
            format!("/v1/projections/reservations/res-B{q}"),
            None,
        ),
        (
            Role::GatewayA,
            Method::GET,
            "/v1/policies/tenant-B/chat".into(),
            None,
        ),
        (
            Role::GatewayA,
            Method::POST,
            "/v1/reservations".into(),
            Some(json!({"id": "x-1", "subject": "tenant-B", "route": "chat", "units": 1})),
        ),
        (
            Role::GatewayA,
            Method::GET,
            "/v1/shards?subject=tenant-B".into(),
            None,
        ),
        (
            Role::GatewayA,
            Method::POST,
            "/v1/shards".into(),
            Some(json!({"subject": "tenant-B", "route": "chat", "units": 1,
                "gateway_id": "gw-a", "gateway_boot_epoch": 1, "ttl_ms": 1_000})),
        ),
        (
            Role::TenantReadA,
            Method::GET,
            "/v1/reservations/res-B".into(),
            None,
        ),
        (
            Role::TenantReadA,
            Method::GET,
            format!("/v1/projections/reservations/res-B{q}"),
            None,
        ),
        (
            Role::TenantReadA,
            Method::GET,
            format!("/v1/tenants/tenant-B/balances{q}"),
            None,
        ),
        (
            Role::TenantReadA,
            Method::GET,
            format!("/v1/tenants/tenant-B/efficiency{q}"),
            None,
        ),
        (
            Role::TenantReadA,
            Method::GET,
            format!("/v1/tenants/tenant-B/diagnosis{q}"),
            None,
        ),
        (
            Role::TenantReadA,
            Method::GET,
            format!("/v1/tenants/tenant-B/shadow{q}"),
            None,
        ),
        (
            Role::TenantReadA,
            Method::GET,
            "/v1/policies/tenant-B/chat".into(),
            None,
        ),
    ];
    for (role, method, path, body) in &probes {
        let client = tokens.client(*role);
        let with = |name: &str| {
            let body = body
                .as_ref()
                .map(|b| serde_json::from_str::<Value>(&b.to_string().replace('B', name)).unwrap());
            (path.replace('B', name), body)
        };
        let (real_path, real_body) = with("b");
        let (none_path, none_body) = with("z");
        let real = send(&client, base, method, &real_path, real_body.as_ref()).await;
        let none = send(&client, base, method, &none_path, none_body.as_ref()).await;
        assert!(
            real.0.is_client_error(),
            "{role:?} {method} {real_path}: {real:?}"
        );
        assert_eq!(
            normalized(&real, "", ""),
            normalized(&none, "-z", "-b"),
            "{role:?} {method} {real_path} tells B's apart from nothing"
        );
    }
    // Known limit: ids are one namespace, so A reserving with B's id is
    // refused (as a different request under that id), but with nothing of
    // B's: no partition key, no generation, no rate-limit numbers.
    let a = tokens.client(Role::GatewayA);
    let taken = json!({"id": "res-b", "subject": "tenant-a", "route": "chat", "units": 1});
    let (status, body, headers) =
        send(&a, base, &Method::POST, "/v1/reservations", Some(&taken)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(problem_type(&body), "exists_with_different_digest");
    assert!(!body.to_string().contains("tenant-b"), "{body}");
    assert!(body.get("policy_generation").is_none(), "{body}");
    assert!(headers.keys().all(|k| !k.as_str().starts_with("ratelimit") && !k.as_str().starts_with("x-ratelimit")), "{headers:?}");
    server.assert_conserved().await;
    server.stop().await;
}
