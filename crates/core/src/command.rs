//! Commands: what a gateway, an operator or a sweeper asks of one partition.

use serde::{Deserialize, Serialize};

use crate::policy::Policy;
use crate::sizing::Sizing;
use crate::types::{
    MoveId, OperationId, PartitionKey, RequestDigest, ReservationId, ShardId, TimestampMs, Units,
};
use crate::usage::Usage;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Open the partition under a published policy. Repeating it with the same
    /// policy is a no-op; with a different one, a rejection.
    OpenPartition { key: PartitionKey, policy: Policy },
    /// Open a later partition of a subject/route (a new generation, a
    /// rollback, the next accounting epoch) with nothing in any dimension:
    /// only a subject/route's first partition opens with `opening_units`,
    /// later ones receive capacity and debt by a move from the one before
    /// (see [`crate::ledger`]), so publishing never mints.
    OpenSuccessor { key: PartitionKey, policy: Policy },
    /// Hold `units` for a call. The id is the idempotency key.
    Reserve {
        id: ReservationId,
        digest: RequestDigest,
        units: Units,
        /// How `units` was sized, when the server sized it (recorded in the
        /// `Reserved` event; `sizing.units` must equal `units`).
        #[serde(default)]
        sizing: Option<Sizing>,
        /// Units in the policy's further dimensions, in policy order (empty
        /// for a one-dimension policy; `units` is the primary dimension's).
        #[serde(default)]
        further_units: Vec<Units>,
    },
    /// RESERVED → STARTED, binding the executor's operation id.
    Start {
        id: ReservationId,
        operation_id: OperationId,
    },
    /// Report what the call really used. From USAGE_UNKNOWN this is the operation
    /// receipt, and must name the operation id bound at start.
    Settle {
        id: ReservationId,
        operation_id: Option<OperationId>,
        actual_units: Units,
        /// What the call used, as counted and reported (recorded in the
        /// `Settled` event, never moved: the ledger uses `actual_units`).
        #[serde(default)]
        usage: Option<Usage>,
        /// What the call used in the policy's further dimensions, in policy
        /// order (see [`crate::Policy::used_units`]).
        #[serde(default)]
        further_actual_units: Vec<Units>,
    },
    /// Give back an unstarted reservation.
    Release { id: ReservationId },
    /// Sweeper: the lease of an unstarted reservation has passed.
    Expire { id: ReservationId },
    /// Sweeper: a started call passed its hard execution limit unsettled.
    MarkUsageUnknown { id: ReservationId },
    /// Sweeper: credit the refill earned up to `now` (debt is repaid first).
    Refill,
    /// Carve an emergency shard out of `available` (moved to `retiredForEmergency`).
    IssueShard {
        shard_id: ShardId,
        units: Units,
        gateway_id: String,
        boot_epoch: u64,
        expires_at_ms: TimestampMs,
        /// The issuing writer's claim epoch (recorded, signed over).
        #[serde(default)]
        fence_epoch: u64,
        /// Signature over the shard's document, made by the server.
        #[serde(default)]
        signature: String,
    },
    /// After reconciliation, remint a shard's confirmed-unused units into this
    /// partition (the subject/route's active one) and record what the gateway
    /// spent on it. At most once per shard. Without excess,
    /// `spent + unknown + unused <= issued` (less when a late reconcile remints
    /// nothing); with excess, `unused = 0` and `spent + unknown = issued + excess`.
    RemintShard {
        shard_id: ShardId,
        source: PartitionKey,
        /// Units the shard was issued with; the remint can never exceed them.
        issued_units: Units,
        unused_units: Units,
        #[serde(default)]
        spent_units: Units,
        #[serde(default)]
        unknown_units: Units,
        /// Reported spend beyond the allocation: recorded as debt here.
        #[serde(default)]
        excess_units: Units,
    },
    /// Stop admission (epoch roll-over, generation switch). In-flight reservations
    /// still start, settle, release and expire.
    Close,
    /// First half of a move: take `units` from `available` and all outstanding debt.
    MoveOut {
        move_id: MoveId,
        to: PartitionKey,
        units: Units,
        /// Units taken in each further dimension (with all of its debt).
        #[serde(default)]
        further_units: Vec<Units>,
    },
    /// Second half: receive what the paired `MoveOut` took.
    MoveIn {
        move_id: MoveId,
        from: PartitionKey,
        units: Units,
        debt_units: Units,
        /// What the paired `MoveOut` took in each further dimension (all
        /// [`crate::DimensionAmounts::Moved`]).
        #[serde(default)]
        further: Vec<crate::DimensionAmounts>,
    },
}

impl Command {
    /// The reservation the command is about, if any.
    pub fn reservation_id(&self) -> Option<&ReservationId> {
        match self {
            Command::Reserve { id, .. }
            | Command::Start { id, .. }
            | Command::Settle { id, .. }
            | Command::Release { id }
            | Command::Expire { id }
            | Command::MarkUsageUnknown { id } => Some(id),
            _ => None,
        }
    }
}
