//! The bodies and views of the emergency-shard endpoints
//! (`crate::shards::http`): what a gateway sends (an issue request, a
//! reconcile with its receipts), the `emergencyShard.v1` document it keeps,
//! and what the ledger answers; and the two checks that belong to a body
//! (a presented document read back into domain types, receipts summed).

use std::collections::HashSet;

use axum::http::StatusCode;
use reservoir_core::policy::MAX_UNITS;
use reservoir_core::{PartitionKey, ReservationId, ShardId};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{
    ReceiptTotals, ReconcileOutcome, ShardDocument, ShardStatus, MAX_RECEIPTS_PER_RECONCILE,
    SHARD_SCHEMA,
};
use crate::problem::ApiError;
use crate::views::PartitionKeyView;

pub(super) fn invalid(code: &str, detail: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, detail)
}

/// `POST /v1/shards`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueShardBody {
    pub subject: String,
    pub route: String,
    #[schema(minimum = 1, maximum = 9_007_199_254_740_992_u64)]
    pub units: u64,
    pub gateway_id: String,
    #[schema(maximum = 9_223_372_036_854_775_807_u64)]
    pub gateway_boot_epoch: u64,
    /// The shard admits nothing after issue + this (1..=86400000).
    #[schema(minimum = 1, maximum = 86_400_000)]
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
    #[schema(pattern = "^emergencyShard\\.v1$")]
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
    pub(super) fn to_document(&self) -> Result<ShardDocument, ApiError> {
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

/// The public key shards are signed with.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct PublicKeyView {
    pub algorithm: String,
    /// Hex of the 32-byte ed25519 public key.
    pub public_key: String,
    /// How a signature is written: `ed25519:` + hex of the 64 bytes.
    pub signature_prefix: String,
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
pub(super) fn totals(receipts: &[ReceiptBody]) -> Result<ReceiptTotals, ApiError> {
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
        // One call can never have used more than one amount may carry; a
        // larger number is a broken meter, and recorded it would be a debt
        // no refill repays.
        if r.used_units > MAX_UNITS {
            return Err(invalid(
                "invalid_receipt",
                format!(
                    "reservation {}: used_units {} is above the most one amount may carry ({MAX_UNITS})",
                    r.reservation_id, r.used_units
                ),
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

pub(super) fn status_view(s: &ShardStatus, now_ms: u64) -> ShardStatusView {
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
