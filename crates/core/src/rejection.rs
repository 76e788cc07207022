//! Why `decide` refused a command. Exact and comparable, so tests match whole
//! values and the HTTP layer maps each variant to one status and problem type.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::dimension::Dimension;
use crate::reservation::ReservationState;
use crate::types::{ReservationId, Units};

/// Bad input: the command itself is malformed, whatever the state.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum InvalidInput {
    #[error("{kind} must be 1 to 128 bytes")]
    IdLength { kind: &'static str },
    #[error("{kind} may contain only letters, digits and . _ : / @ -")]
    IdCharacters { kind: &'static str },
    #[error("units must be greater than zero")]
    ZeroUnits,
    #[error("{units} units is above the limit of {limit} for any single amount")]
    AbsurdUnits { units: Units, limit: Units },
    #[error("arithmetic overflow")]
    Overflow,
    #[error("time went backwards: command at {now_ms} ms, partition already at {last_ms} ms")]
    TimeWentBackwards { now_ms: u64, last_ms: u64 },
    #[error("invalid policy field `{field}`")]
    Policy { field: &'static str },
    #[error("the settle's usage does not say what was used in the {dimension} dimension")]
    UsageMissing { dimension: Dimension },
    #[error("{given} amounts given for a policy of {expected} dimensions")]
    DimensionCount { given: usize, expected: usize },
    #[error("command addressed to partition {found}, this partition is {expected}")]
    WrongPartition { expected: String, found: String },
}

/// Which transition a command asked for, named in `WrongState` rejections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    Start,
    Settle,
    Release,
    Expire,
    MarkUsageUnknown,
}

/// A domain refusal. `code()` is stable and becomes the problem+json `type`.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Rejection {
    #[error("insufficient capacity in {dimension}: {requested_units} requested, {available_units} available")]
    InsufficientCapacity {
        /// The limiting dimension: of the refusing ones, the one that frees last.
        dimension: Dimension,
        requested_units: Units,
        available_units: Units,
        /// Conservative time until refill alone covers the shortfall; `None` if never.
        retry_after_ms: Option<u64>,
    },
    #[error(
        "request too large in {dimension}: {requested_units} units, at most {max_units} can ever be admitted"
    )]
    RequestTooLarge {
        dimension: Dimension,
        requested_units: Units,
        max_units: Units,
    },
    #[error("admission suspended: {debt_units} units of debt outstanding in {dimension}")]
    DebtOutstanding {
        /// The owing dimension that is repaid last.
        dimension: Dimension,
        debt_units: Units,
        retry_after_ms: Option<u64>,
    },
    #[error("reservation {id} is {state:?}; cannot {transition:?}")]
    WrongState {
        id: ReservationId,
        state: ReservationState,
        transition: Transition,
    },
    #[error("unknown reservation {id}")]
    UnknownReservation { id: ReservationId },
    #[error("reservation {id} exists with a different request digest")]
    ExistsWithDifferentDigest { id: ReservationId },
    #[error("reservation {id} was started under a different operation id")]
    ExistsWithDifferentOperationId { id: ReservationId },
    #[error("reservation {id} was already settled with {settled_units} units")]
    ExistsWithDifferentActualUnits {
        id: ReservationId,
        settled_units: Units,
    },
    #[error("reservation {id}'s lease expired at {expires_at_ms} ms")]
    LeaseExpired {
        id: ReservationId,
        expires_at_ms: u64,
    },
    #[error("reservation {id} is not due until {due_at_ms} ms")]
    NotYetDue { id: ReservationId, due_at_ms: u64 },
    #[error("policy generation {generation} is closed for admission")]
    GenerationClosed { generation: u64 },
    #[error("partition is not open")]
    PartitionNotOpen,
    #[error("partition is already open under a different policy")]
    PartitionExistsWithDifferentPolicy,
    #[error("limit reached: at most {limit} {what} per partition")]
    LimitReached { what: &'static str, limit: usize },
    /// [`crate::retention::MAX_OPEN_RESERVATIONS_PER_PARTITION`] reservations
    /// hold capacity: admitted again as they settle, release or expire.
    #[error("{limit} open reservations in this partition; retry after {retry_after_ms} ms")]
    OpenReservationsLimit { limit: usize, retry_after_ms: u64 },
    #[error("emergency shards are disabled by the policy")]
    EmergencyDisabled,
    #[error("shard or move id already used with different fields")]
    ExistsWithDifferentFields,
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
}

impl Rejection {
    /// Stable machine-readable code; the HTTP layer builds problem types from it.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::InsufficientCapacity { .. } => "insufficient_capacity",
            Rejection::RequestTooLarge { .. } => "request_too_large",
            Rejection::DebtOutstanding { .. } => "debt_outstanding",
            Rejection::WrongState { .. } => "wrong_state",
            Rejection::UnknownReservation { .. } => "unknown_reservation",
            Rejection::ExistsWithDifferentDigest { .. } => "exists_with_different_digest",
            Rejection::ExistsWithDifferentOperationId { .. } => {
                "exists_with_different_operation_id"
            }
            Rejection::ExistsWithDifferentActualUnits { .. } => {
                "exists_with_different_actual_units"
            }
            Rejection::LeaseExpired { .. } => "lease_expired",
            Rejection::NotYetDue { .. } => "not_yet_due",
            Rejection::GenerationClosed { .. } => "generation_closed",
            Rejection::PartitionNotOpen => "partition_not_open",
            Rejection::PartitionExistsWithDifferentPolicy => {
                "partition_exists_with_different_policy"
            }
            Rejection::LimitReached { .. } => "limit_reached",
            Rejection::OpenReservationsLimit { .. } => "open_reservations_limit",
            Rejection::EmergencyDisabled => "emergency_disabled",
            Rejection::ExistsWithDifferentFields => "exists_with_different_fields",
            Rejection::InvalidInput(_) => "invalid_input",
        }
    }

    /// Whether this is a limit refusal (worth logging for diagnosis, answered 429).
    pub fn is_admission_refusal(&self) -> bool {
        matches!(
            self,
            Rejection::InsufficientCapacity { .. }
                | Rejection::DebtOutstanding { .. }
                | Rejection::RequestTooLarge { .. }
        )
    }

    /// The dimension a limit refusal names.
    pub fn dimension(&self) -> Option<Dimension> {
        match self {
            Rejection::InsufficientCapacity { dimension, .. }
            | Rejection::RequestTooLarge { dimension, .. }
            | Rejection::DebtOutstanding { dimension, .. } => Some(*dimension),
            _ => None,
        }
    }

    /// Retry hint for limit refusals.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Rejection::InsufficientCapacity { retry_after_ms, .. }
            | Rejection::DebtOutstanding { retry_after_ms, .. } => *retry_after_ms,
            Rejection::OpenReservationsLimit { retry_after_ms, .. } => Some(*retry_after_ms),
            _ => None,
        }
    }
}
