//! The HTTP side of emergency shards: the handlers of `POST /v1/shards`
//! (issue), `GET /v1/shards?subject=&route=` (list), `GET
//! /v1/shards/public-key` and `POST /v1/shards/{id}/reconcile`, and their
//! OpenAPI description. Bodies and views are in [`super::bodies`]. Handlers
//! validate and translate; the writer decides (`crate::writer::shards`).

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use reservoir_core::{PartitionKey, ShardId};

use crate::auth::{require, Principal, SHARD_WRITE, SUBJECT_READ};
use utoipa::OpenApi;

use super::bodies::*;
use super::signing::BadSignature;
use super::{ShardSigner, MAX_SHARD_TTL_MS};
use crate::api::{ApiJson, AppState};
use crate::problem::{ApiError, Problem};
use crate::writer::shards::{IssueShard, ReconcileShard};
use crate::writer::{Answer, Request};

/// Issue and reconcile: a gateway of the shard's subject, or an operator;
/// listing: anyone who reads the subject; the public key: everyone.
/// `max_body_bytes` is the server's general body limit.
pub fn routes(max_body_bytes: usize) -> Router<AppState> {
    Router::new()
        .route(
            "/v1/shards",
            require(SHARD_WRITE, post(issue)).merge(require(SUBJECT_READ, get(list))),
        )
        .route("/v1/shards/public-key", get(public_key))
        .route(
            "/v1/shards/{id}/reconcile",
            // Inside the router's general limit, so this one applies.
            require(SHARD_WRITE, post(reconcile)).layer(DefaultBodyLimit::max(
                super::reconcile_body_limit(max_body_bytes),
            )),
        )
}

fn unexpected(answer: Answer) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("unexpected answer {answer:?}"),
    )
}

/// The log records a boot epoch as a signed 64-bit integer.
pub const MAX_BOOT_EPOCH: u64 = i64::MAX as u64;

fn boot_epoch_fits(boot_epoch: u64) -> Result<(), ApiError> {
    if boot_epoch > MAX_BOOT_EPOCH {
        return Err(invalid(
            "invalid_input",
            format!("gateway_boot_epoch must be at most {MAX_BOOT_EPOCH}"),
        ));
    }
    Ok(())
}

/// A random shard id: `sh-` and 32 hex digits.
fn random_shard_id() -> Result<ShardId, ApiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::unavailable(format!("no randomness: {e}")))?;
    Ok(ShardId::new(format!("sh-{}", hex::encode(bytes))).expect("hex is a valid id"))
}

/// `POST /v1/shards`'s body checked and turned into the writer's request
/// (the caller checks the principal). Public for the simulator, which sends
/// the same bodies to the writers without HTTP.
pub fn issue_request(
    body: IssueShardBody,
    signer: Arc<ShardSigner>,
) -> Result<IssueShard, ApiError> {
    PartitionKey::new(body.subject.clone(), body.route.clone(), "e", 0)
        .map_err(|e| invalid("invalid_input", e.to_string()))?;
    reservoir_core::validate_id("gateway id", &body.gateway_id)
        .map_err(|e| invalid("invalid_input", e.to_string()))?;
    boot_epoch_fits(body.gateway_boot_epoch)?;
    if !(1..=MAX_SHARD_TTL_MS).contains(&body.ttl_ms) {
        return Err(invalid(
            "invalid_input",
            format!("ttl_ms must be 1..={MAX_SHARD_TTL_MS}"),
        ));
    }
    let shard_id = match &body.shard_id {
        Some(id) => ShardId::new(id.clone()).map_err(|e| invalid("invalid_id", e.to_string()))?,
        None => random_shard_id()?,
    };
    Ok(IssueShard {
        subject: body.subject,
        route: body.route,
        shard_id,
        units: body.units,
        gateway_id: body.gateway_id,
        boot_epoch: body.gateway_boot_epoch,
        ttl_ms: body.ttl_ms,
        signer,
    })
}

/// `POST /v1/shards/{path_id}/reconcile`'s body checked (the document's
/// signature verified, the receipts summed) and turned into the writer's
/// request (the caller checks the principal). Public for the simulator.
pub fn reconcile_request(
    path_id: &str,
    body: ReconcileBody,
    signer: &ShardSigner,
    grace_ms: u64,
) -> Result<ReconcileShard, ApiError> {
    let presented = body.shard.to_document()?;
    if presented.shard_id.as_str() != path_id {
        return Err(invalid(
            "shard_id_mismatch",
            "the path names another shard than the body",
        ));
    }
    match signer.verify(&presented) {
        Ok(()) => {}
        Err(BadSignature::Malformed) => {
            return Err(invalid(
                "shard_signature_invalid",
                "the signature is not ed25519:<128 hex digits>",
            ))
        }
        Err(BadSignature::Mismatch) => {
            return Err(invalid(
                "shard_signature_invalid",
                "the signature does not verify: the shard was altered or not issued by this ledger",
            ))
        }
    }
    reservoir_core::validate_id("gateway id", &body.gateway_id)
        .map_err(|e| invalid("invalid_input", e.to_string()))?;
    boot_epoch_fits(body.gateway_boot_epoch)?;
    let totals = totals(&body.receipts)?;
    Ok(ReconcileShard {
        presented,
        gateway_id: body.gateway_id,
        boot_epoch: body.gateway_boot_epoch,
        totals,
        grace_ms,
    })
}

#[utoipa::path(post, path = "/v1/shards", request_body = IssueShardBody,
    responses(
        (status = 201, description = "Issued", body = ShardDocumentView),
        (status = 200, description = "A retry with the same shard_id and fields: the same document", body = ShardDocumentView),
        (status = 404, description = "No policy for the subject and route", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Emergency mode disabled, generation closed, or the shard_id names another shard", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid input", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Not enough available capacity, or debt outstanding", body = Problem, content_type = "application/problem+json"),
    ))]
/// Issue a shard: `units` leave the active partition's `available` for
/// `retiredForEmergency`, signed and bound to the gateway (201; a retry with
/// the same `shard_id` and fields: 200 and the same document).
pub async fn issue(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(body): ApiJson<IssueShardBody>,
) -> Result<Response, ApiError> {
    principal.require_subject(SHARD_WRITE, &body.subject)?;
    let settings = state.shards()?.clone();
    let writers = state.writers()?;
    let shard = writers.shard_of(&body.subject, &body.route);
    let request = Request::IssueShard(Box::new(issue_request(body, settings.signer.clone())?));
    match writers.call(shard, request).await? {
        Answer::Shard { document, created } => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok((status, Json(ShardDocumentView::from(&*document))).into_response())
        }
        other => Err(unexpected(other)),
    }
}

/// The ed25519 key shards are signed with, for offline verification.
#[utoipa::path(get, path = "/v1/shards/public-key",
    responses((status = 200, body = PublicKeyView)))]
pub async fn public_key(State(state): State<AppState>) -> Result<Response, ApiError> {
    let settings = state.shards()?;
    Ok(Json(PublicKeyView {
        algorithm: "ed25519".into(),
        public_key: settings.signer.public_key_hex(),
        signature_prefix: super::signing::SIGNATURE_PREFIX.into(),
    })
    .into_response())
}

#[utoipa::path(post, path = "/v1/shards/{id}/reconcile", request_body = ReconcileBody,
    params(("id" = String, Path)),
    responses(
        (status = 201, description = "Reconciled: spend recorded, unused units reminted", body = ReconcileView),
        (status = 200, description = "Reconciled before: the recorded outcome, nothing reminted now", body = ReconcileView),
        (status = 409, description = "Bound to another gateway or boot epoch, or reconciled before with other receipts", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Signature does not verify, unknown shard, or invalid receipts", body = Problem, content_type = "application/problem+json"),
    ))]
/// Reconcile a shard with the gateway's terminal receipts: the spend is
/// recorded, the confirmed-unused units are reminted into the active
/// partition once (201); a repeat with the same receipts remints nothing
/// and answers the same (200).
pub async fn reconcile(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    ApiJson(body): ApiJson<ReconcileBody>,
) -> Result<Response, ApiError> {
    principal.require_subject(SHARD_WRITE, &body.shard.partition_key.subject)?;
    let settings = state.shards()?.clone();
    let writers = state.writers()?;
    let Path(raw) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()))?;
    let reconcile = reconcile_request(&raw, body, &settings.signer, settings.reconcile_grace_ms)?;
    let shard = writers.shard_of_key(&reconcile.presented.source);
    let request = Request::ReconcileShard(Box::new(reconcile));
    match writers.call(shard, request).await? {
        Answer::Reconciled(outcome) => {
            let status = if outcome.created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok((status, Json(ReconcileView::from(&*outcome))).into_response())
        }
        other => Err(unexpected(other)),
    }
}

#[utoipa::path(get, path = "/v1/shards", params(ListParams),
    responses(
        (status = 200, body = ShardList),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
    ))]
/// The shards of a subject (every writer shard is asked: a subject's routes
/// may live in any of them).
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    query: Result<Query<ListParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = query
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))?;
    principal.require_subject(SUBJECT_READ, &params.subject)?;
    state.shards()?;
    let writers = state.writers()?;
    for (kind, value) in [
        ("subject", Some(&params.subject)),
        ("route", params.route.as_ref()),
    ] {
        if let Some(value) = value {
            reservoir_core::validate_id(kind, value).map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.to_string())
            })?;
        }
    }
    let shards: Vec<usize> = match &params.route {
        Some(route) => vec![writers.shard_of(&params.subject, route)],
        None => (0..writers.shards()).collect(),
    };
    let mut views = Vec::new();
    for shard in shards {
        let request = Request::ListShards {
            subject: params.subject.clone(),
            route: params.route.clone(),
        };
        match writers.call(shard, request).await? {
            Answer::Shards { shards, now_ms } => {
                views.extend(shards.iter().map(|s| status_view(s, now_ms)))
            }
            other => return Err(unexpected(other)),
        }
    }
    let outstanding_units = views
        .iter()
        .filter(|v| v.reconcile.is_none())
        .map(|v| v.shard.units)
        .fold(0u64, u64::saturating_add);
    Ok(Json(ShardList {
        shards: views,
        outstanding_units,
    })
    .into_response())
}

#[derive(OpenApi)]
#[openapi(
    paths(issue, list, public_key, reconcile),
    components(schemas(
        IssueShardBody,
        ShardDocumentView,
        PublicKeyView,
        ReceiptState,
        ReceiptBody,
        ReconcileBody,
        ReconcileView,
        ShardStatusView,
        ShardList
    ))
)]
pub struct ShardsDoc;
