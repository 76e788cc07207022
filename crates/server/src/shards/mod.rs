//! Emergency shards on the server: the signed `emergencyShard.v1` document a
//! gateway spends while the ledger is unreachable, and what reconciling it
//! means.
//!
//! - this file: [`ShardDocument`] and its canonical encoding (the bytes the
//!   signature covers), the reconcile outcome, the limits.
//! - [`signing`]: the ed25519 key (configured, or generated once into the data
//!   directory with mode 0600), signing and verification.
//! - [`http`]: `POST /v1/shards`, `GET /v1/shards`, `GET /v1/shards/public-key`,
//!   `POST /v1/shards/{id}/reconcile`; [`bodies`]: what they read and answer.
//! - the writer's side (issue, reconcile, list against partition state) is
//!   `crate::writer::shards`.
//!
//! Core decides and records (`Command::IssueShard` / `RemintShard`); the
//! server signs (core has no randomness and no keys). The signature is in the
//! `ShardIssued` event, so the log alone can show which document was handed
//! out.
//!
//! **Reconcile rule.** A gateway reports terminal local receipts; the ledger
//! sums them: `spent` (SETTLED, used units), `unknown` (USAGE_UNKNOWN, the
//! units the call held: never treated as unused). If `spent + unknown` exceeds
//! the allocation, the excess is recorded as debt in the active partition and
//! nothing is reminted. Otherwise the rest (`unused`) is reminted into the
//! subject/route's active partition, unless the reconcile arrives after
//! `expires_at + grace` ([`crate::config::Config::shard_reconcile_grace`]): then
//! the ledger no longer trusts that the receipts are complete (a gateway that
//! reports that late may have lost some) and remints nothing; the spend is
//! still recorded and the rest stays retired. A shard is reconciled once: a
//! repeat with the same totals answers the recorded outcome and remints 0; one
//! with other totals is refused.

pub mod bodies;
pub mod http;
pub mod signing;

use reservoir_core::partition::{IssuedShard, RemintedShard};
use reservoir_core::{PartitionKey, ShardId, TimestampMs, Units};

pub use signing::ShardSigner;

/// Longest shard a gateway may ask for (24 h): a shard is capacity out of the
/// ledger's hands until it is reconciled.
pub const MAX_SHARD_TTL_MS: u64 = 24 * 60 * 60 * 1_000;

/// Most receipts one reconcile may carry (about 90 bytes a receipt, so
/// [`MAX_RECONCILE_BODY_BYTES`] usually binds first).
pub const MAX_RECEIPTS_PER_RECONCILE: usize = 100_000;

/// The body limit of a reconcile, above the server's general one: a shard is
/// reconciled once, with every receipt of its local calls, and a limit that
/// refused it would leave the shard unreconciled for good (its spend never
/// recorded, its unused units never reminted). 8 MiB is about 90,000
/// receipts.
pub const MAX_RECONCILE_BODY_BYTES: usize = 8 << 20;

/// A reconcile's body limit: [`MAX_RECONCILE_BODY_BYTES`], or the
/// configured general limit if that is larger.
pub fn reconcile_body_limit(configured: usize) -> usize {
    configured.max(MAX_RECONCILE_BODY_BYTES)
}

/// The body limit of a request to `path` (the cluster front reads bodies
/// before it routes them).
pub fn body_limit(path: &str, configured: usize) -> usize {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["v1", "shards", _, "reconcile"] => reconcile_body_limit(configured),
        _ => configured,
    }
}

/// Schema name of the document.
pub const SHARD_SCHEMA: &str = "emergencyShard.v1";

/// Everything a shard binds, as the ledger issued it and the gateway keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardDocument {
    pub shard_id: ShardId,
    /// The partition the units were retired from.
    pub source: PartitionKey,
    pub units: Units,
    pub gateway_id: String,
    pub boot_epoch: u64,
    /// The issuing writer's claim epoch.
    pub fence_epoch: u64,
    pub issued_at_ms: TimestampMs,
    pub expires_at_ms: TimestampMs,
    /// `ed25519:` + hex of the signature over [`ShardDocument::canonical`].
    pub signature: String,
}

impl ShardDocument {
    /// The bytes the signature covers: a version line and one `name=value`
    /// line per field, in this order, `\n`-separated, no trailing newline. No
    /// value can hold a newline: ids and key parts are `[A-Za-z0-9._:/@-]`,
    /// the rest are decimal numbers.
    /// The client crate builds the same bytes (`reservoir_client::shards`).
    pub fn canonical(&self) -> String {
        let k = &self.source;
        format!(
            "reservoir.emergencyShard.v1\nshard_id={}\nsubject={}\nroute={}\naccounting_epoch={}\npolicy_generation={}\nunits={}\ngateway_id={}\nboot_epoch={}\nfence_epoch={}\nissued_at_ms={}\nexpires_at_ms={}",
            self.shard_id.as_str(),
            k.subject,
            k.route,
            k.accounting_epoch,
            k.policy_generation,
            self.units,
            self.gateway_id,
            self.boot_epoch,
            self.fence_epoch,
            self.issued_at_ms,
            self.expires_at_ms,
        )
    }

    /// The document a partition recorded for `shard_id`.
    pub fn from_issued(shard_id: &ShardId, source: &PartitionKey, s: &IssuedShard) -> Self {
        ShardDocument {
            shard_id: shard_id.clone(),
            source: source.clone(),
            units: s.units,
            gateway_id: s.gateway_id.clone(),
            boot_epoch: s.boot_epoch,
            fence_epoch: s.fence_epoch,
            issued_at_ms: s.issued_at_ms,
            expires_at_ms: s.expires_at_ms,
            signature: s.signature.clone(),
        }
    }
}

/// What the gateway's terminal receipts add up to (summed and checked by the
/// HTTP layer; the writer compares them against the shard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiptTotals {
    pub spent_units: u128,
    pub unknown_units: u128,
    pub receipts: usize,
}

/// How a reconcile ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileOutcome {
    pub document: ShardDocument,
    /// The partition the unused units were reminted into (the active one then).
    pub target: PartitionKey,
    pub record: RemintedShard,
    /// False for a repeat: nothing was reminted by this call.
    pub created: bool,
}

/// How a recorded reconcile ended, from the record alone (so a repeat
/// answers the same): `overspent` (spend above the allocation, the excess is
/// debt), `reminted` (every confirmed-unused unit came back) or `retired`
/// (some unused units stay retired: the reconcile came after expiry + grace,
/// or the active partition had no room below its burst).
pub fn outcome_name(r: &RemintedShard) -> &'static str {
    let accounted = u128::from(r.spent_units) + u128::from(r.unknown_units);
    if r.excess_units > 0 {
        "overspent"
    } else if u128::from(r.units) + accounted == u128::from(r.issued_units) {
        "reminted"
    } else {
        "retired"
    }
}

/// One shard and where it stands, for `GET /v1/shards`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardStatus {
    pub document: ShardDocument,
    /// `None` while outstanding.
    pub reconciled: Option<(PartitionKey, RemintedShard)>,
}

/// The units a reconcile remints and records, from the shard and the totals
/// (see the module docs): `(unused, spent, unknown, excess)`. Saturates
/// nowhere: totals above `u64` are excess too.
pub fn outcome_units(
    issued: Units,
    totals: ReceiptTotals,
    late: bool,
) -> (Units, Units, Units, Units) {
    let issued128 = u128::from(issued);
    let accounted = totals.spent_units + totals.unknown_units;
    let clamp = |v: u128| Units::try_from(v).unwrap_or(Units::MAX);
    if accounted > issued128 {
        let excess = accounted - issued128;
        // Spent and unknown as reported (clamped to u64), so that
        // spent + unknown = issued + excess holds exactly when they fit.
        let spent = clamp(totals.spent_units);
        let unknown = clamp(totals.unknown_units);
        let excess = clamp(excess);
        return (0, spent, unknown, excess);
    }
    let unused = issued - clamp(accounted);
    let unused = if late { 0 } else { unused };
    (
        unused,
        clamp(totals.spent_units),
        clamp(totals.unknown_units),
        0,
    )
}
