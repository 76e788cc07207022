//! Events: the facts `decide` produces and `apply` folds into state. Every amount
//! an event moves is written in it, so `apply` recomputes nothing and an auditor
//! reading the log sees each unit move.

use serde::{Deserialize, Serialize};

use crate::dimension::{Dimension, DimensionAmounts};
use crate::policy::Policy;
use crate::reservation::ShadowVerdict;
use crate::sizing::Sizing;
use crate::types::{
    MoveId, OperationId, PartitionKey, RequestDigest, ReservationId, ShardId, TimestampMs, Units,
};
use crate::usage::Usage;

/// One fact in one partition's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Per-partition sequence, dense from 1.
    pub sequence: u64,
    /// Writer-assigned time of the command that produced the event.
    pub at_ms: TimestampMs,
    pub body: EventBody,
    /// The body's amounts in the policy's further dimensions, in policy order
    /// (see [`crate::dimension`]); empty for an event that moves nothing and
    /// for every event of a one-dimension policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub further: Vec<DimensionAmounts>,
}

impl Event {
    /// An event that moves nothing in further dimensions.
    pub fn new(sequence: u64, at_ms: TimestampMs, body: EventBody) -> Event {
        Event {
            sequence,
            at_ms,
            body,
            further: Vec::new(),
        }
    }
}

/// Why an admission was refused (logged for diagnosis, answered 429).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    InsufficientCapacity,
    DebtOutstanding,
    RequestTooLarge,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventBody {
    PartitionOpened {
        key: PartitionKey,
        policy: Policy,
        opening_units: Units,
    },
    /// Time passed: `repaid_units` went to debt, `minted_units − repaid_units` to
    /// `available`. Credit above the burst is dropped, never minted.
    Refilled {
        minted_units: Units,
        repaid_units: Units,
        remainder: u64,
    },
    Reserved {
        id: ReservationId,
        digest: RequestDigest,
        reserved_units: Units,
        held_units: Units,
        expires_at_ms: TimestampMs,
        shadow: Option<ShadowVerdict>,
        /// The dimension a shadow verdict would have refused in.
        #[serde(default)]
        shadow_dimension: Option<Dimension>,
        /// How `reserved_units` was sized, when the server sized it.
        #[serde(default)]
        sizing: Option<Sizing>,
    },
    /// A limit refusal, kept so efficiency and refusal patterns can be diagnosed.
    /// Moves no capacity.
    AdmissionRefused {
        id: ReservationId,
        requested_units: Units,
        reason: RefusalReason,
        retry_after_ms: Option<u64>,
        /// The limiting dimension `requested_units` counts in (absent in
        /// records written before dimensions: the primary one).
        #[serde(default)]
        dimension: Option<Dimension>,
    },
    Started {
        id: ReservationId,
        operation_id: OperationId,
        execution_deadline_ms: TimestampMs,
    },
    /// `actual = held − refunded + from_available + overdraft`, written out in full.
    Settled {
        id: ReservationId,
        actual_units: Units,
        refunded_units: Units,
        from_available_units: Units,
        overdraft_units: Units,
        /// Overdraft pushed debt past the policy's maximum (recorded in full anyway).
        overdraft_limit_breached: bool,
        /// Resolved a USAGE_UNKNOWN with an operation receipt.
        from_usage_unknown: bool,
        /// The usage breakdown the settle reported (not part of conservation).
        #[serde(default)]
        usage: Option<Usage>,
    },
    Released {
        id: ReservationId,
        refunded_units: Units,
    },
    ExpiryBegan {
        id: ReservationId,
    },
    Expired {
        id: ReservationId,
        refunded_units: Units,
    },
    UsageUnknown {
        id: ReservationId,
    },
    ShardIssued {
        shard_id: ShardId,
        units: Units,
        gateway_id: String,
        boot_epoch: u64,
        expires_at_ms: TimestampMs,
        /// Claim epoch of the writer that issued the shard (its fence); 0 in
        /// records written before shards were signed.
        #[serde(default)]
        fence_epoch: u64,
        /// The issuer's signature over the shard's canonical document
        /// (`ed25519:<hex>`, made by the server); empty in older records.
        #[serde(default)]
        signature: String,
    },
    /// A shard was reconciled: its confirmed-unused units (`units`) reminted
    /// here, and what the gateway reported it spent, recorded.
    ShardReminted {
        shard_id: ShardId,
        source: PartitionKey,
        units: Units,
        /// The shard's allocation (0 in records written before reconcile
        /// recorded the local spend).
        #[serde(default)]
        issued_units: Units,
        /// Spent on settled local calls (stays retired at the source).
        #[serde(default)]
        spent_units: Units,
        /// Held by local calls whose usage is unknown (stays retired: UNKNOWN
        /// is never unused).
        #[serde(default)]
        unknown_units: Units,
        /// Reported spend beyond the allocation, recorded here as debt
        /// (overdraft issued and spent).
        #[serde(default)]
        excess_units: Units,
    },
    Closed,
    MovedOut {
        move_id: MoveId,
        to: PartitionKey,
        units: Units,
        debt_units: Units,
    },
    MovedIn {
        move_id: MoveId,
        from: PartitionKey,
        units: Units,
        debt_units: Units,
    },
}

impl EventBody {
    /// Whether the event moves amounts (in the primary dimension, its own
    /// fields), so that it carries one [`DimensionAmounts`] per further
    /// dimension in [`Event::further`]. Shard events move the primary
    /// dimension only.
    pub fn moves_amounts(&self) -> bool {
        matches!(
            self,
            EventBody::PartitionOpened { .. }
                | EventBody::Refilled { .. }
                | EventBody::Reserved { .. }
                | EventBody::Settled { .. }
                | EventBody::Released { .. }
                | EventBody::Expired { .. }
                | EventBody::MovedOut { .. }
                | EventBody::MovedIn { .. }
        )
    }

    /// Stable name of the event type (record headers, metrics, audit tables).
    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::PartitionOpened { .. } => "PartitionOpened",
            EventBody::Refilled { .. } => "Refilled",
            EventBody::Reserved { .. } => "Reserved",
            EventBody::AdmissionRefused { .. } => "AdmissionRefused",
            EventBody::Started { .. } => "Started",
            EventBody::Settled { .. } => "Settled",
            EventBody::Released { .. } => "Released",
            EventBody::ExpiryBegan { .. } => "ExpiryBegan",
            EventBody::Expired { .. } => "Expired",
            EventBody::UsageUnknown { .. } => "UsageUnknown",
            EventBody::ShardIssued { .. } => "ShardIssued",
            EventBody::ShardReminted { .. } => "ShardReminted",
            EventBody::Closed => "Closed",
            EventBody::MovedOut { .. } => "MovedOut",
            EventBody::MovedIn { .. } => "MovedIn",
        }
    }

    /// The reservation the event touched, if any.
    pub fn reservation_id(&self) -> Option<&ReservationId> {
        match self {
            EventBody::Reserved { id, .. }
            | EventBody::AdmissionRefused { id, .. }
            | EventBody::Started { id, .. }
            | EventBody::Settled { id, .. }
            | EventBody::Released { id, .. }
            | EventBody::ExpiryBegan { id }
            | EventBody::Expired { id, .. }
            | EventBody::UsageUnknown { id } => Some(id),
            _ => None,
        }
    }
}
