//! What the HTTP API answers, shaped from the writer's domain answers: the
//! receipt of a reservation, the log position it was committed at, how it was
//! sized, and a partition's terms for operators. The command handlers
//! (`crate::api`) and the query handlers (`crate::queries`) both answer these.

use reservoir_core::{PartitionKey, Reservation, ReservationState, SizingRule};
use reservoir_log::Position;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::writer::PartitionStatus;

/// Where a record was committed, as answered to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LogPosition {
    pub log_partition: u32,
    pub offset: u64,
}

impl From<Position> for LogPosition {
    fn from(p: Position) -> Self {
        LogPosition {
            log_partition: p.log_partition,
            offset: p.offset,
        }
    }
}

/// The identity of a ledger partition.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct PartitionKeyView {
    pub subject: String,
    pub route: String,
    pub accounting_epoch: String,
    pub policy_generation: u64,
}

impl From<&PartitionKey> for PartitionKeyView {
    fn from(k: &PartitionKey) -> Self {
        PartitionKeyView {
            subject: k.subject.clone(),
            route: k.route.clone(),
            accounting_epoch: k.accounting_epoch.clone(),
            policy_generation: k.policy_generation,
        }
    }
}

/// The receipt of a reservation: its record, its partition, and the log position
/// of the last event that changed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Receipt {
    pub id: String,
    pub subject: String,
    pub route: String,
    pub accounting_epoch: String,
    pub policy_generation: u64,
    /// One of RESERVED, STARTED, SETTLED, SETTLED_WITH_DEBT, RELEASED, EXPIRING, EXPIRED, USAGE_UNKNOWN.
    #[schema(example = "RESERVED")]
    pub state: String,
    pub reserved_units: u64,
    pub held_units: u64,
    pub actual_units: Option<u64>,
    pub operation_id: Option<String>,
    pub expires_at_ms: u64,
    /// How the server sized the reservation when the request gave no units
    /// (absent when it did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizing: Option<SizingReceipt>,
    pub log_position: LogPosition,
}

impl Receipt {
    pub fn new(key: &PartitionKey, r: &Reservation, position: Position) -> Receipt {
        Receipt {
            id: r.id.to_string(),
            subject: key.subject.clone(),
            route: key.route.clone(),
            accounting_epoch: key.accounting_epoch.clone(),
            policy_generation: key.policy_generation,
            state: state_name(r.state).to_string(),
            reserved_units: r.reserved_units,
            held_units: r.held_units,
            actual_units: r.actual_units,
            operation_id: r.operation_id.as_ref().map(|o| o.to_string()),
            expires_at_ms: r.expires_at_ms,
            sizing: r.sizing.map(SizingReceipt::from),
            log_position: position.into(),
        }
    }
}

/// The sizing rule that produced a reservation's units, as recorded in its
/// `Reserved` event: `units = input_units + output_units`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SizingReceipt {
    /// One of max_tokens, route_default_max_tokens, route_quantile, sibling_quantile, cold_ceiling.
    #[schema(example = "route_quantile")]
    pub rule: String,
    pub units: u64,
    /// Counted input tokens times the route's drift multiplier.
    pub input_units: u64,
    /// The output estimate the rule gave.
    pub output_units: u64,
}

impl From<reservoir_core::Sizing> for SizingReceipt {
    fn from(s: reservoir_core::Sizing) -> Self {
        let rule = match s.rule {
            SizingRule::MaxTokens => "max_tokens",
            SizingRule::RouteDefaultMaxTokens => "route_default_max_tokens",
            SizingRule::RouteQuantile => "route_quantile",
            SizingRule::SiblingQuantile => "sibling_quantile",
            SizingRule::ColdCeiling => "cold_ceiling",
        };
        SizingReceipt {
            rule: rule.to_string(),
            units: s.units,
            input_units: s.input_units,
            output_units: s.output_units,
        }
    }
}

pub fn state_name(s: ReservationState) -> &'static str {
    match s {
        ReservationState::Requested => "REQUESTED",
        ReservationState::Reserved => "RESERVED",
        ReservationState::Started => "STARTED",
        ReservationState::Settled => "SETTLED",
        ReservationState::SettledWithDebt => "SETTLED_WITH_DEBT",
        ReservationState::Released => "RELEASED",
        ReservationState::Expiring => "EXPIRING",
        ReservationState::Expired => "EXPIRED",
        ReservationState::UsageUnknown => "USAGE_UNKNOWN",
    }
}

/// One partition's conservation terms, for operators and tests (`GET /v1/partitions`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct PartitionView {
    pub subject: String,
    pub route: String,
    pub accounting_epoch: String,
    pub policy_generation: u64,
    pub closed: bool,
    pub last_sequence: u64,
    pub opening_units: u64,
    pub minted_units: u64,
    pub overdraft_issued_units: u64,
    pub available_units: u64,
    pub reserved_units: u64,
    pub spent_units: u64,
    pub retired_for_emergency_units: u64,
    pub overdraft_repaid_units: u64,
    pub debt_units: u64,
    pub open_reservations: u64,
    pub reservations: u64,
    pub refusals: u64,
    /// Result of the full invariant check (conservation and reserved = Σ held): `ok` or the error.
    pub conservation: String,
}

impl From<&PartitionStatus> for PartitionView {
    fn from(s: &PartitionStatus) -> Self {
        let p = &s.partition;
        let l = &p.ledger;
        let key = &s.key;
        PartitionView {
            subject: key.subject.clone(),
            route: key.route.clone(),
            accounting_epoch: key.accounting_epoch.clone(),
            policy_generation: key.policy_generation,
            closed: p.closed,
            last_sequence: p.last_sequence,
            opening_units: l.opening_units,
            minted_units: l.minted_units,
            overdraft_issued_units: l.overdraft_issued_units,
            available_units: l.available_units,
            reserved_units: l.reserved_units,
            spent_units: l.spent_units,
            retired_for_emergency_units: l.retired_for_emergency_units,
            overdraft_repaid_units: l.overdraft_repaid_units,
            debt_units: p.debt_units(),
            open_reservations: p.open_reservations as u64,
            reservations: s.reservations as u64,
            refusals: p.refusals,
            conservation: match &s.invariants {
                Ok(()) => "ok".to_string(),
                Err(e) => e.to_string(),
            },
        }
    }
}
