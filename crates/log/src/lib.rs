//! # reservoir-log
//!
//! The event log every other part of Reservoir reads and writes: the writer
//! appends, the projector and the replay tool read. Two traits say which:
//! - [`EventReader`]: reads (a log partition's entries, its end, following the
//!   tail). The projector, replay, writer recovery and the cluster's read paths
//!   take only this, so a reader can never write a record or a claim.
//! - [`EventLog`]` : EventReader`: adds `append` (records under a held claim)
//!   and `reclaim`. Only writers take it.
//!
//! The implementations share one record format and one validity rule:
//! - `embedded` (the default): a RocksDB column family on one machine,
//!   [`embedded::EmbeddedLog`]; [`embedded::SecondaryLog`] reads a running
//!   one from another process (`reservoir project`, replay) and is only an
//!   `EventReader`.
//! - `kafka`: a Kafka topic (`reservoir.events`), any Kafka-protocol broker.
//! - `memory` (cargo feature `memory`): `memory::MemoryLog`, in memory with
//!   fault injection, for tests and `reservoir serve --log memory`; not durable.
//!
//! What goes in the log is a [`LogEntry`]: either one command's events for one
//! ledger partition (a [`Record`], appended atomically), or a writer's [`Claim`]
//! of a log partition. [`fence::Validity`] is the single rule that decides which
//! records count: *a record counts only if its writer holds the latest claim
//! before it in that log partition*. Every reader applies it through that type.
//!
//! Values are Avro (see `schemas/` at the repository root) in the Confluent wire
//! framing; [`codec`] encodes and decodes them.

use std::future::Future;

pub mod codec;
pub mod embedded;
mod fast_decode;
pub mod fence;
pub mod kafka;
#[cfg(feature = "memory")]
pub mod memory;
pub mod rocks;

use reservoir_core::{Event, PartitionKey};
use thiserror::Error;

/// Where an entry sits: the log partition (a Kafka partition; always 0 in the
/// embedded log) and its offset there, dense and increasing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    pub log_partition: u32,
    pub offset: u64,
}

/// A writer's claim on a log partition. The latest claim wins; records of any
/// other writer after it do not count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Stable identity of the writer process (node id + boot id).
    pub writer_id: String,
    /// Strictly above every claim epoch the writer saw in the partition.
    pub epoch: u64,
}

/// One command's events for one ledger partition, written by one writer under
/// one claim. Never split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: PartitionKey,
    pub writer_id: String,
    pub claim_epoch: u64,
    pub events: Vec<Event>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEntry {
    Claim(Claim),
    Record(Record),
}

/// Infrastructure errors. `transient()` says whether retrying may succeed.
#[derive(Debug, Error)]
pub enum LogError {
    #[error("fenced: writer {writer_id} lost log partition {log_partition} to a newer claim")]
    Fenced {
        writer_id: String,
        log_partition: u32,
    },
    /// An earlier append to this log partition failed after its records may
    /// have reached the log (Kafka: a delivery or read-back failure). They may
    /// count, so state built without them is wrong: re-claim the partition and
    /// rebuild state from the log before appending again.
    #[error("log partition {log_partition} in doubt after a failed append ({reason}): re-claim and recover before appending")]
    InDoubt { log_partition: u32, reason: String },
    #[error("log unavailable: {0}")]
    Unavailable(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("corrupt entry at {position:?}: {reason}")]
    Corrupt { position: Position, reason: String },
    #[error("storage error: {0}")]
    Storage(String),
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl LogError {
    pub fn transient(&self) -> bool {
        matches!(
            self,
            LogError::Fenced { .. }
                | LogError::InDoubt { .. }
                | LogError::Unavailable(_)
                | LogError::Timeout(_)
        )
    }
}

/// What every reader of the log needs, and all it gets: the projector, replay,
/// writer recovery and the cluster's read paths take an `EventReader`, so none
/// of them can append a record or a claim (and fence a writer) by mistake.
/// Every [`EventLog`] is one; [`embedded::SecondaryLog`] (a running embedded
/// log seen from another process) is only one.
pub trait EventReader: Send + Sync + 'static {
    /// Which log partition a ledger partition's records go to.
    fn log_partition_for(&self, key: &PartitionKey) -> u32;

    /// Number of log partitions.
    fn log_partitions(&self) -> u32;

    /// Entries of one log partition from `from_offset`, at most `max` of them,
    /// in order. Returns fewer (possibly none) at the end of the log.
    fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> impl Future<Output = Result<Vec<(Position, LogEntry)>, LogError>> + Send;

    /// Offset one past the last entry of a log partition.
    fn end_offset(&self, log_partition: u32) -> impl Future<Output = Result<u64, LogError>> + Send;

    /// Follows the tail: waits until the log partition holds an entry at `offset`
    /// or `timeout` passes, and says which.
    fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: std::time::Duration,
    ) -> impl Future<Output = Result<bool, LogError>> + Send;
}

/// The log a writer appends to: an [`EventReader`] that also appends records
/// under a claim and re-claims a log partition.
///
/// `append` returns only after the entries are durable (embedded: one synced
/// RocksDB write for the whole batch; Kafka: acknowledged with `acks=all` and
/// read back with no foreign claim before them). Positions come back in batch order.
pub trait EventLog: EventReader {
    fn append(
        &self,
        batch: Vec<Record>,
    ) -> impl Future<Output = Result<Vec<Position>, LogError>> + Send;

    /// Whether a writer may call `append` again while an earlier append of its
    /// own is still in flight (pipelining). A log that says yes promises:
    /// - an append takes its place in the log's order when `append` is
    ///   *called* (the returned future only waits for it), or is refused there
    ///   (its future is then already resolved);
    /// - appends become durable and are acknowledged in call order;
    /// - once an append fails, every append called after it fails too, until
    ///   the log partition is claimed again (or the log reopened). A log that
    ///   refuses them before writing (embedded, memory) writes nothing of
    ///   them; the Kafka log cannot take back records already handed to the
    ///   producer, so they may still land: it fails them in doubt, and the
    ///   writer re-claims and rebuilds its state from the log, where they
    ///   count like any record of an append that failed after writing.
    fn ordered_appends(&self) -> bool {
        false
    }

    /// Confirms that `claim` still holds `log_partition`: no newer claim was
    /// written there. A writer asks before it answers from its memory alone
    /// (a refusal, a retry answered from its record) when it appended
    /// nothing: appends are fenced, and without this a writer whose claim was
    /// superseded (a paused node, a take-over that left the old process
    /// running) would answer from stale state. `Err(Fenced)` when superseded.
    /// The default confirms at once: a log only one process can open (the
    /// embedded log holds RocksDB's lock) cannot be claimed under a running
    /// writer.
    fn confirm_claim(
        &self,
        log_partition: u32,
        claim: &Claim,
    ) -> impl Future<Output = Result<(), LogError>> + Send {
        let _ = (log_partition, claim);
        async { Ok(()) }
    }

    /// Claims `log_partition` again for this writer (a new epoch), after an
    /// append left it in doubt: the writer then rebuilds its state from the log
    /// up to the new claim. Logs that cannot re-claim in process say so.
    fn reclaim(&self, log_partition: u32) -> impl Future<Output = Result<Claim, LogError>> + Send {
        async move {
            Err(LogError::Invalid(format!(
                "this log cannot re-claim log partition {log_partition} in process"
            )))
        }
    }
}
