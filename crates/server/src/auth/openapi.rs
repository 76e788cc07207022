//! The OpenAPI document's side of authentication: the `bearer` security
//! scheme, each operation's scopes (OpenAPI 3.1 lets a non-OAuth requirement
//! list role names; one requirement per scope, any of which grants the call)
//! and its 401 and 403 answers. The table mirrors the routers' `require(...)`
//! calls; `tests/server/auth.rs` checks it against what the server answers.

use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};

use super::{Scope, GATEWAY, METRICS, OPERATOR, SHARD_WRITE, SUBJECT_READ, TENANT_READ};

/// (method, path, the scopes granting it); operations not listed are public.
pub const OPERATIONS: &[(&str, &str, &[Scope])] = &[
    ("post", "/v1/policies", OPERATOR),
    ("get", "/v1/policies/{subject}/{route}", SUBJECT_READ),
    ("post", "/v1/policies/{subject}/{route}/rollback", OPERATOR),
    ("post", "/v1/reservations", GATEWAY),
    ("get", "/v1/reservations/{id}", SUBJECT_READ),
    ("post", "/v1/reservations/{id}/start", GATEWAY),
    ("post", "/v1/reservations/{id}/settle", GATEWAY),
    ("post", "/v1/reservations/{id}/release", GATEWAY),
    ("get", "/v1/partitions", OPERATOR),
    ("get", "/v1/tenants/{tenant}/balances", TENANT_READ),
    ("get", "/v1/tenants/{tenant}/efficiency", TENANT_READ),
    ("get", "/v1/tenants/{tenant}/diagnosis", TENANT_READ),
    ("get", "/v1/routes/{route}/balances", OPERATOR),
    ("get", "/v1/routes/{route}/estimate", OPERATOR),
    ("get", "/v1/routes/{route}/efficiency", OPERATOR),
    ("get", "/v1/routes/{route}/shadow", OPERATOR),
    ("get", "/v1/tenants/{tenant}/shadow", TENANT_READ),
    ("get", "/v1/projections/reservations/{id}", SUBJECT_READ),
    ("post", "/v1/shards", SHARD_WRITE),
    ("get", "/v1/shards", SUBJECT_READ),
    ("post", "/v1/shards/{id}/reconcile", SHARD_WRITE),
    ("get", "/metrics", METRICS),
];

pub const SCHEME: &str = "bearer";

pub fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::Gateway => "gateway",
        Scope::TenantRead => "tenant-read",
        Scope::Operator => "operator",
        Scope::Metrics => "metrics",
        Scope::Node => "node",
    }
}

/// Adds the scheme, and to each listed operation its scopes and its 401/403.
/// `metrics_public`: `/metrics` is listed as public.
pub fn declare(doc: &mut OpenApi, metrics_public: bool) {
    let scheme = HttpBuilder::new()
        .scheme(HttpAuthScheme::Bearer)
        .bearer_format("rsv_ and 64 hex digits")
        .description(Some(
            "A token from `reservoir token create`; the server keeps only its SHA-256.",
        ))
        .build();
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme(SCHEME, SecurityScheme::Http(scheme));
    for (method, path, scopes) in OPERATIONS {
        if metrics_public && *path == "/metrics" {
            continue;
        }
        let Some(item) = doc.paths.paths.get_mut(*path) else {
            continue;
        };
        let operation = match *method {
            "get" => item.get.as_mut(),
            "post" => item.post.as_mut(),
            _ => None,
        };
        if let Some(operation) = operation {
            secure(operation, scopes);
        }
    }
}

fn secure(operation: &mut Operation, scopes: &[Scope]) {
    operation.security = Some(
        scopes
            .iter()
            .map(|s| SecurityRequirement::new(SCHEME, [scope_name(*s)]))
            .collect(),
    );
    let problem = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/problem+json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build(),
        )
    };
    let responses = &mut operation.responses.responses;
    responses.insert(
        "401".to_string(),
        problem("No bearer token, or one the server does not know (`WWW-Authenticate: Bearer`)"),
    );
    responses.insert(
        "403".to_string(),
        problem("The token lacks the scope, or the subject named is not one of the token's"),
    );
}
