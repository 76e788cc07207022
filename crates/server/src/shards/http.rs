//! The HTTP side of emergency shards: bodies, checks and handlers for
//! `POST /v1/shards` (issue), `GET /v1/shards?subject=&route=` (list),
//! `GET /v1/shards/public-key` and `POST /v1/shards/{id}/reconcile`.
//! Handlers validate and translate; the writer decides (`crate::writer::shards`).

use std::collections::HashSet;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use reservoir_core::{PartitionKey, ReservationId, ShardId};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::signing::BadSignature;
use super::{
    ReceiptTotals, ReconcileOutcome, ShardDocument, ShardStatus, MAX_RECEIPTS_PER_RECONCILE,
    MAX_SHARD_TTL_MS, SHARD_SCHEMA,
};
use crate::api::{ApiJson, AppState};
use crate::problem::{ApiError, Problem};
use crate::views::PartitionKeyView;
use crate::writer::shards::{IssueShard, ReconcileShard};
use crate::writer::{Answer, Request};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/shards", post(issue).get(list))
        .route("/v1/shards/public-key", get(public_key))
        .route("/v1/shards/{id}/reconcile", post(reconcile))
}

fn invalid(code: &str, detail: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, detail)
}

fn unexpected(answer: Answer) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("unexpected answer {answer:?}"),
    )
}

/// `POST /v1/shards`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueShardBody {
    pub subject: String,
    pub route: String,
    pub units: u64,
    pub gateway_id: String,
    pub gateway_boot_epoch: u64,
    /// The shard admits nothing after issue + this (1..=86400000).
    pub ttl_ms: u64,
    /// Name the shard to make a retried issue idempotent; by default the
    /// server picks a random id.
    #[serde(default)]
    pub shard_id: Option<String>,
}

/// `emergencyShard.v1`: what a gateway keeps and presents back. The signature
/// covers every other field (the canonical bytes are in [`ShardDocument::canonical`]).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardDocumentView {
    pub schema: String,
    pub shard_id: String,
    pub partition_key: PartitionKeyView,
    pub units: u64,
    pub gateway_id: String,
    pub gateway_boot_epoch: u64,
    /// The issuing writer's claim epoch (its fence).
    pub fence_epoch: u64,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
    pub signature: String,
}

impl From<&ShardDocument> for ShardDocumentView {
    fn from(d: &ShardDocument) -> Self {
        ShardDocumentView {
            schema: SHARD_SCHEMA.to_string(),
            shard_id: d.shard_id.as_str().to_string(),
            partition_key: (&d.source).into(),
            units: d.units,
            gateway_id: d.gateway_id.clone(),
            gateway_boot_epoch: d.boot_epoch,
            fence_epoch: d.fence_epoch,
            issued_at_ms: d.issued_at_ms,
            expires_at_ms: d.expires_at_ms,
            signature: d.signature.clone(),
        }
    }
}

impl ShardDocumentView {
    fn to_document(&self) -> Result<ShardDocument, ApiError> {
        if self.schema != SHARD_SCHEMA {
            return Err(invalid(
                "invalid_shard",
                format!("schema must be {SHARD_SCHEMA}"),
            ));
        }
        let k = &self.partition_key;
        let source = PartitionKey::new(
            k.subject.clone(),
            k.route.clone(),
            k.accounting_epoch.clone(),
            k.policy_generation,
        )
        .map_err(|e| invalid("invalid_shard", e.to_string()))?;
        reservoir_core::validate_id("gateway id", &self.gateway_id)
            .map_err(|e| invalid("invalid_shard", e.to_string()))?;
        Ok(ShardDocument {
            shard_id: ShardId::new(self.shard_id.clone())
                .map_err(|e| invalid("invalid_shard", e.to_string()))?,
            source,
            units: self.units,
            gateway_id: self.gateway_id.clone(),
            boot_epoch: self.gateway_boot_epoch,
            fence_epoch: self.fence_epoch,
            issued_at_ms: self.issued_at_ms,
            expires_at_ms: self.expires_at_ms,
            signature: self.signature.clone(),
        })
    }
}

/// A random shard id: `sh-` and 32 hex digits.
fn random_shard_id() -> Result<ShardId, ApiError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::unavailable(format!("no randomness: {e}")))?;
    Ok(ShardId::new(format!("sh-{}", hex::encode(bytes))).expect("hex is a valid id"))
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
    ApiJson(body): ApiJson<IssueShardBody>,
) -> Result<Response, ApiError> {
    let settings = state.shards()?.clone();
    let writers = state.writers()?;
    PartitionKey::new(body.subject.clone(), body.route.clone(), "e", 0)
        .map_err(|e| invalid("invalid_input", e.to_string()))?;
    reservoir_core::validate_id("gateway id", &body.gateway_id)
        .map_err(|e| invalid("invalid_input", e.to_string()))?;
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
    let shard = writers.shard_of(&body.subject, &body.route);
    let request = Request::IssueShard(Box::new(IssueShard {
        subject: body.subject,
        route: body.route,
        shard_id,
        units: body.units,
        gateway_id: body.gateway_id,
        boot_epoch: body.gateway_boot_epoch,
        ttl_ms: body.ttl_ms,
        signer: settings.signer.clone(),
    }));
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

/// The public key shards are signed with.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct PublicKeyView {
    pub algorithm: String,
    /// Hex of the 32-byte ed25519 public key.
    pub public_key: String,
    /// How a signature is written: `ed25519:` + hex of the 64 bytes.
    pub signature_prefix: String,
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

/// The terminal state of one local reservation on a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReceiptState {
    Settled,
    Released,
    Expired,
    UsageUnknown,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiptBody {
    pub reservation_id: String,
    pub state: ReceiptState,
    /// SETTLED: what the call used; USAGE_UNKNOWN: what it held (all of it
    /// stays retired); RELEASED, EXPIRED: 0.
    pub used_units: u64,
}

/// `POST /v1/shards/{id}/reconcile`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileBody {
    pub shard: ShardDocumentView,
    /// Who presents the shard.
    pub gateway_id: String,
    pub gateway_boot_epoch: u64,
    pub receipts: Vec<ReceiptBody>,
}

/// Sums the receipts, refusing anything that is not a terminal receipt.
fn totals(receipts: &[ReceiptBody]) -> Result<ReceiptTotals, ApiError> {
    if receipts.len() > MAX_RECEIPTS_PER_RECONCILE {
        return Err(invalid(
            "too_many_receipts",
            format!("at most {MAX_RECEIPTS_PER_RECONCILE} receipts per reconcile"),
        ));
    }
    let mut seen = HashSet::with_capacity(receipts.len());
    let mut t = ReceiptTotals {
        receipts: receipts.len(),
        ..Default::default()
    };
    for r in receipts {
        let id = ReservationId::new(r.reservation_id.clone())
            .map_err(|e| invalid("invalid_receipt", e.to_string()))?;
        if !seen.insert(id) {
            return Err(invalid(
                "invalid_receipt",
                format!("reservation {} appears twice", r.reservation_id),
            ));
        }
        match r.state {
            ReceiptState::Settled => t.spent_units += u128::from(r.used_units),
            ReceiptState::UsageUnknown => t.unknown_units += u128::from(r.used_units),
            ReceiptState::Released | ReceiptState::Expired if r.used_units == 0 => {}
            ReceiptState::Released | ReceiptState::Expired => {
                return Err(invalid(
                    "invalid_receipt",
                    format!(
                        "reservation {}: a released or expired reservation used nothing",
                        r.reservation_id
                    ),
                ));
            }
        }
    }
    Ok(t)
}

/// What a reconcile recorded.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct ReconcileView {
    pub shard_id: String,
    pub source: PartitionKeyView,
    /// The partition the unused units were reminted into (active then).
    pub target: PartitionKeyView,
    /// `reminted`, `retired` or `overspent` (see [`super::outcome_name`]).
    pub outcome: String,
    pub issued_units: u64,
    pub spent_units: u64,
    pub unknown_units: u64,
    pub reminted_units: u64,
    /// What stays retired for good: issued − reminted.
    pub retired_units: u64,
    pub excess_units: u64,
    /// False for a repeat: this call reminted nothing.
    pub created: bool,
}

impl From<&ReconcileOutcome> for ReconcileView {
    fn from(o: &ReconcileOutcome) -> Self {
        let r = &o.record;
        ReconcileView {
            shard_id: o.document.shard_id.as_str().to_string(),
            source: (&o.document.source).into(),
            target: (&o.target).into(),
            outcome: super::outcome_name(r).into(),
            issued_units: r.issued_units,
            spent_units: r.spent_units,
            unknown_units: r.unknown_units,
            reminted_units: r.units,
            retired_units: r.issued_units.saturating_sub(r.units),
            excess_units: r.excess_units,
            created: o.created,
        }
    }
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
    path: Result<Path<String>, PathRejection>,
    ApiJson(body): ApiJson<ReconcileBody>,
) -> Result<Response, ApiError> {
    let settings = state.shards()?.clone();
    let writers = state.writers()?;
    let Path(raw) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()))?;
    let presented = body.shard.to_document()?;
    if presented.shard_id.as_str() != raw {
        return Err(invalid(
            "shard_id_mismatch",
            "the path names another shard than the body",
        ));
    }
    match settings.signer.verify(&presented) {
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
    let totals = totals(&body.receipts)?;
    let shard = writers.shard_of_key(&presented.source);
    let request = Request::ReconcileShard(Box::new(ReconcileShard {
        presented,
        gateway_id: body.gateway_id,
        boot_epoch: body.gateway_boot_epoch,
        totals,
        grace_ms: settings.reconcile_grace_ms,
    }));
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

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    pub subject: String,
    #[serde(default)]
    pub route: Option<String>,
}

/// One shard in `GET /v1/shards`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct ShardStatusView {
    pub shard: ShardDocumentView,
    /// `outstanding`, `expired` (past its expiry, not reconciled) or `reconciled`.
    pub state: String,
    /// Since issue, writer time.
    pub age_ms: u64,
    pub reconcile: Option<ReconcileView>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct ShardList {
    pub shards: Vec<ShardStatusView>,
    /// Units on shards not yet reconciled.
    pub outstanding_units: u64,
}

fn status_view(s: &ShardStatus, now_ms: u64) -> ShardStatusView {
    let d = &s.document;
    let reconcile = s.reconciled.as_ref().map(|(target, record)| {
        ReconcileView::from(&ReconcileOutcome {
            document: d.clone(),
            target: target.clone(),
            record: record.clone(),
            created: false,
        })
    });
    let state = match (&reconcile, now_ms > d.expires_at_ms) {
        (Some(_), _) => "reconciled",
        (None, true) => "expired",
        (None, false) => "outstanding",
    };
    ShardStatusView {
        shard: d.into(),
        state: state.into(),
        age_ms: now_ms.saturating_sub(d.issued_at_ms),
        reconcile,
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
    query: Result<Query<ListParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let Query(params) = query
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))?;
    reservoir_core::validate_id("subject", &params.subject)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.to_string()))?;
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
