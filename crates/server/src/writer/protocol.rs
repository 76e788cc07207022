//! What callers (the HTTP handlers, the sweepers, the snapshotter, cluster
//! routing) ask of a shard and what it answers, in domain types: the HTTP layer
//! shapes receipts from a reservation record and its log position
//! (`crate::views`). [`Writers`] is the cloneable handle that queues a request
//! on one shard and waits for its answer, bounded in queue depth and time.

use crate::ratelimit::RateLimits;
use std::sync::Arc;

use reservoir_core::{
    CapacityUnit, Command, ConservationError, Partition, PartitionKey, Policy, Rejection,
    RequestDigest, Reservation, ReservationId, TimestampMs, Units,
};
use reservoir_log::Position;
use tokio::sync::{mpsc, oneshot};

use super::retired::RetiredIndex;
use super::state::{Index, ShardState};
use crate::sizing::SizingFailure;

/// Requests waiting for one shard. Beyond this a caller gets 503 at once rather
/// than queueing without bound.
pub const MAX_QUEUED_REQUESTS_PER_SHARD: usize = 16_384;

/// Longest a request waits for its batch to be decided and appended.
pub const MAX_WAIT_FOR_COMMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How much a reserve asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amount {
    /// The caller named the units.
    Units(Units),
    /// The server sizes it (`crate::sizing`) against the active policy, in the
    /// same trip through the shard that decides it, so the policy cannot change
    /// between sizing and deciding.
    Sized {
        counted_input_tokens: u64,
        max_tokens: Option<u64>,
    },
}

/// What an API handler or a sweeper asks of a shard.
#[derive(Debug)]
pub enum Request {
    /// Open a partition under `policy`: in the epoch named, or for a policy
    /// whose epochs roll the current one (see `epochs`).
    Publish {
        accounting_epoch: Option<String>,
        policy: Policy,
    },
    /// Run the generation below the active one again, as `generation`
    /// (default: the active one + 1); see `commands::rollback`.
    Rollback {
        subject: String,
        route: String,
        generation: Option<u64>,
    },
    GetPolicy {
        subject: String,
        route: String,
    },
    Reserve {
        subject: String,
        route: String,
        id: ReservationId,
        digest: RequestDigest,
        amount: Amount,
    },
    /// Start, Settle, Release, and the sweepers' Expire, MarkUsageUnknown, Refill.
    Act {
        key: PartitionKey,
        command: Command,
    },
    /// A settle: `actual_units` for the primary dimension when given, every
    /// other amount derived from `usage` by the partition's policy
    /// ([`reservoir_core::Policy::used_units`]).
    Settle {
        key: PartitionKey,
        id: ReservationId,
        operation_id: Option<reservoir_core::OperationId>,
        actual_units: Option<u64>,
        usage: Option<reservoir_core::Usage>,
    },
    Get {
        key: PartitionKey,
        id: ReservationId,
    },
    Partitions,
    /// A copy of the shard's committed state, for a snapshot (between two batches).
    Snapshot,
    /// Sweeper: the commands due at `now_ms` (leases past, execution limits past, refills).
    CollectDue {
        now_ms: TimestampMs,
        refill: bool,
    },
    /// Issue an emergency shard from the subject/route's active partition.
    IssueShard(Box<super::shards::IssueShard>),
    /// Reconcile a shard: record its spend, remint its unused units once.
    ReconcileShard(Box<super::shards::ReconcileShard>),
    /// The shards of a subject (and route).
    ListShards {
        subject: String,
        route: Option<String>,
    },
}

/// One partition's state for `GET /v1/partitions`: everything but its
/// reservation records, their count, and the full invariant check.
#[derive(Debug)]
pub struct PartitionStatus {
    pub key: PartitionKey,
    pub partition: Partition,
    pub reservations: usize,
    pub invariants: Result<(), ConservationError>,
}

#[derive(Debug)]
pub enum Answer {
    /// A reservation's record and the position of the last event that changed it.
    Reservation {
        key: PartitionKey,
        reservation: Box<Reservation>,
        position: Position,
        created: bool,
        /// The partition's numbers when answered (rate-limit headers, and the
        /// names of the receipt's further dimensions).
        limits: Option<Box<RateLimits>>,
    },
    Published {
        key: PartitionKey,
        created: bool,
        position: Option<Position>,
    },
    Policy {
        key: PartitionKey,
        policy: Box<Policy>,
    },
    Partitions(Vec<PartitionStatus>),
    Snapshot(Box<ShardState>),
    Due(Vec<(PartitionKey, Command)>),
    /// A command with no receipt (a sweeper's Refill).
    Done,
    /// An issued shard (`created` false: a retry answered from the log).
    Shard {
        document: Box<crate::shards::ShardDocument>,
        created: bool,
    },
    Reconciled(Box<crate::shards::ReconcileOutcome>),
    /// Shards and the writer's time when listed (to tell expired ones).
    Shards {
        shards: Vec<crate::shards::ShardStatus>,
        now_ms: TimestampMs,
    },
}

/// Why a request failed.
#[derive(Debug)]
pub enum Failure {
    /// The domain refused; `policy` names the partition's policy when one matched.
    Rejected {
        rejection: Rejection,
        policy_generation: Option<u64>,
        capacity_unit: Option<CapacityUnit>,
        /// The partition's numbers for the rate-limit headers of a limit refusal.
        limits: Option<Box<RateLimits>>,
    },
    /// No active policy for the subject/route.
    NoPolicy,
    /// The request conflicts with the subject/route's generations (`code`
    /// becomes the problem type).
    Conflict { code: &'static str, detail: String },
    /// The request is invalid for the state it met (422; `code` becomes the
    /// problem type).
    Invalid { code: &'static str, detail: String },
    /// A reserve the server was to size could not be sized.
    Sizing(SizingFailure),
    /// Retry with the same ids: the log failed, or the writer is overloaded or stopping.
    Unavailable(String),
    /// A bug or a broken invariant: the batch was not appended.
    Internal(String),
}

pub type Reply = Result<Answer, Failure>;

pub struct Envelope {
    pub request: Request,
    pub reply: oneshot::Sender<Reply>,
}

/// A cloneable handle to every shard.
#[derive(Clone)]
pub struct Writers {
    pub(super) senders: Arc<Vec<mpsc::Sender<Envelope>>>,
    pub index: Index,
    pub retired: Arc<RetiredIndex>,
}

impl Writers {
    pub fn shards(&self) -> usize {
        self.senders.len()
    }

    pub fn shard_of_key(&self, key: &PartitionKey) -> usize {
        self.shard_of(&key.subject, &key.route)
    }

    pub fn shard_of(&self, subject: &str, route: &str) -> usize {
        super::shard_of(subject, route, self.shards())
    }

    /// The partition holding reservation `id`, if any: in memory, or in the
    /// idempotency index once it left memory (`Err`: the index cannot be read).
    pub fn locate(&self, id: &ReservationId) -> Result<Option<PartitionKey>, String> {
        if let Some(key) = self.index.read().expect("index lock").get(id) {
            return Ok(Some(key.clone()));
        }
        Ok(self.retired.get(id)?.map(|r| r.key))
    }

    pub async fn call(&self, shard: usize, request: Request) -> Reply {
        let (reply, rx) = oneshot::channel();
        match self.senders[shard].try_send(Envelope { request, reply }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(Failure::Unavailable("writer queue full".into()));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(Failure::Unavailable("shutting down".into()))
            }
        }
        // A slow log must not hold a client forever. The command may still
        // commit after the timeout; a retry with the same id is answered from it.
        match tokio::time::timeout(MAX_WAIT_FOR_COMMIT, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(Failure::Unavailable("writer stopped".into())),
            Err(_) => Err(Failure::Unavailable(
                "timed out waiting for the log; retry with the same id".into(),
            )),
        }
    }
}
