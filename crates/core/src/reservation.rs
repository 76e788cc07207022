//! `limitReservation.v1`: the reservation record and its state machine.

use serde::{Deserialize, Serialize};

use crate::types::{OperationId, RequestDigest, ReservationId, TimestampMs, Units};

/// Where a reservation stands. Allowed edges are exactly those of
/// [`ReservationState::can_move_to`]; `apply` asserts every move against it.
///
/// `Requested` is the state before the ledger decided (it never appears in a stored
/// record: a refused reserve leaves no reservation). RESERVATION_UNKNOWN is the
/// *client's* view of a reserve whose answer was lost; it lives in the client and
/// is resolved by asking again with the same id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReservationState {
    Requested,
    Reserved,
    Started,
    Settled,
    SettledWithDebt,
    Released,
    Expiring,
    Expired,
    UsageUnknown,
}

impl ReservationState {
    pub const ALL: [ReservationState; 9] = [
        ReservationState::Requested,
        ReservationState::Reserved,
        ReservationState::Started,
        ReservationState::Settled,
        ReservationState::SettledWithDebt,
        ReservationState::Released,
        ReservationState::Expiring,
        ReservationState::Expired,
        ReservationState::UsageUnknown,
    ];

    /// The contract's state machine, as one table.
    pub fn can_move_to(self, next: ReservationState) -> bool {
        use ReservationState::*;
        matches!(
            (self, next),
            (Requested, Reserved)
                | (Reserved, Started)
                | (Reserved, Released)
                | (Reserved, Expiring)
                | (Expiring, Expired)
                | (Started, Settled)
                | (Started, SettledWithDebt)
                | (Started, UsageUnknown)
                | (UsageUnknown, Settled)
                | (UsageUnknown, SettledWithDebt)
        )
    }

    /// Open reservations hold capacity in `reserved`.
    pub fn holds_capacity(self) -> bool {
        use ReservationState::*;
        matches!(self, Reserved | Started | Expiring | UsageUnknown)
    }

    pub fn is_terminal(self) -> bool {
        use ReservationState::*;
        matches!(self, Settled | SettledWithDebt | Released | Expired)
    }
}

/// What enforcement would have decided for a reserve admitted in shadow mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShadowVerdict {
    WouldAdmit,
    WouldRefuseInsufficientCapacity,
    WouldRefuseDebtOutstanding,
    WouldRefuseRequestTooLarge,
}

impl ShadowVerdict {
    /// The refusal enforcement would have answered (the problem type it
    /// names), or `None` for would-admit.
    pub fn would_refuse(self) -> Option<&'static str> {
        match self {
            ShadowVerdict::WouldAdmit => None,
            ShadowVerdict::WouldRefuseInsufficientCapacity => Some("insufficient_capacity"),
            ShadowVerdict::WouldRefuseDebtOutstanding => Some("debt_outstanding"),
            ShadowVerdict::WouldRefuseRequestTooLarge => Some("request_too_large"),
        }
    }
}

/// `limitReservation.v1`. The partition (subject, route, epoch, generation) is
/// the record's owner and is not repeated here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub id: ReservationId,
    pub digest: RequestDigest,
    /// Units the client asked for.
    pub reserved_units: Units,
    /// Units actually taken from `available` and held in `reserved`. Equal to
    /// `reserved_units`, except for a shadow-mode admission enforcement would have
    /// refused, which holds nothing (so shadow traffic never breaks conservation).
    pub held_units: Units,
    pub actual_units: Option<Units>,
    /// Part of `actual_units` that became overdraft (debt).
    pub overdraft_units: Units,
    pub operation_id: Option<OperationId>,
    pub state: ReservationState,
    pub reserved_at_ms: TimestampMs,
    pub expires_at_ms: TimestampMs,
    pub started_at_ms: Option<TimestampMs>,
    /// Hard execution limit: a started call unsettled at this time becomes USAGE_UNKNOWN.
    pub execution_deadline_ms: Option<TimestampMs>,
    pub finished_at_ms: Option<TimestampMs>,
    pub shadow: Option<ShadowVerdict>,
    /// The dimension a shadow verdict would have refused in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_dimension: Option<crate::Dimension>,
    /// How the server sized it, when the client did not give units (from the
    /// `Reserved` event; absent in state written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizing: Option<crate::Sizing>,
    /// The amounts in the policy's further dimensions, in policy order (the
    /// fields above are the primary dimension's); empty for one dimension.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub further: Vec<crate::DimensionHold>,
}
