//! The writer: the only code that decides commands and appends to the log.
//!
//! Ledger partitions are spread over a fixed number of *shards* by a hash of
//! (subject, route), so every generation and epoch of one subject/route lives in
//! one shard, and each shard is one task: a partition is decided by exactly one
//! task at a time, with no locks around the core.
//!
//! - [`protocol`]: what a shard is asked ([`Request`]) and answers ([`Answer`],
//!   [`Failure`]), in domain types, and the [`Writers`] handle that asks.
//! - [`state`]: what a shard holds between batches ([`ShardState`]).
//! - [`pipeline`]: the task loop: batch, decide speculatively, group-commit,
//!   answer after the log acknowledged; roll back through core savepoints when
//!   an append fails.
//! - `commands`: what each request decides or reads against the state.
//! - `due`: which expiries, execution limits and refills the sweepers should send.
//! - [`retired`]: the idempotency index, on disk, of records that left memory.
//! - [`shards`]: emergency shards: issue, reconcile, list.
//!
//! `now` is the writer's: read from the injected [`crate::clock::Clock`], made
//! monotonic per partition (`max(last event time, clock)`), and recorded in the
//! events.

mod commands;
mod due;
mod epochs;
mod moves;
pub mod pipeline;
pub mod protocol;
pub mod retired;
pub mod shards;
pub mod state;

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use reservoir_core::PartitionKey;
use reservoir_log::EventLog;
use tokio::sync::mpsc;

pub use due::MAX_DUE_PER_SWEEP;
pub use moves::FAILPOINT_MOVE_HALVES;
pub use pipeline::{Shard, MAX_BATCHES_IN_FLIGHT};
pub use protocol::{
    Amount, Answer, Envelope, Failure, PartitionStatus, Reply, Request, Writers,
    MAX_QUEUED_REQUESTS_PER_SHARD, MAX_WAIT_FOR_COMMIT,
};
pub use retired::{Retired, RetiredIndex};
pub use state::{DueKind, FastMap, Index, PartitionState, ShardState};

use crate::clock::SharedClock;
use crate::sizing::Sizer;

/// Which shard owns a subject/route. Stable for the process only (it is never stored).
pub fn shard_of(subject: &str, route: &str, shards: usize) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    subject.hash(&mut h);
    route.hash(&mut h);
    (h.finish() % shards as u64) as usize
}

/// Everything the shard tasks start from.
pub struct WriterSetup<L> {
    pub log: Arc<L>,
    /// One recovered state per shard.
    pub states: Vec<ShardState>,
    pub index: Index,
    pub retired: Arc<RetiredIndex>,
    pub writer_id: String,
    /// The claim epoch held in each log partition.
    pub claim_epochs: Vec<u64>,
    pub max_batch_commands: usize,
    /// Set to `true` to stop: queued requests are still decided and appended.
    pub stop: tokio::sync::watch::Receiver<bool>,
    pub fatal: tokio::sync::watch::Sender<Option<String>>,
    /// See [`Shard::in_doubt`]; `None`: nobody re-claims (a failed append
    /// leaves the log partition refusing appends, answered 503).
    pub in_doubt: Option<tokio::sync::watch::Sender<Option<String>>>,
    pub clock: SharedClock,
    pub sizer: Arc<dyn Sizer>,
    /// In cluster mode, the Kafka partition these writers serve: a label of
    /// their gauges, so that the writers of two partitions on one node do not
    /// set the same series (see `crate::cluster::gauges`).
    pub gauge_partition: Option<u32>,
}

/// One stop signal per shard, set in shard order when `stop` is set (or its
/// sender dropped). Shards that waited on clones of one `watch` would be
/// woken in an order tokio draws at random (a watch spreads its waiters over
/// several `Notify`s, picked by the runtime's random generator), and a
/// shard woken by the stop first would decide what reached its queue
/// meanwhile in that random order: a simulator run could then differ from
/// its seed's replay. A watch with a single waiter wakes it, and the relay
/// sets the shards' watches in shard order.
pub fn relay_stop(
    mut stop: tokio::sync::watch::Receiver<bool>,
    shards: usize,
) -> Vec<tokio::sync::watch::Receiver<bool>> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..shards)
        .map(|_| tokio::sync::watch::channel(false))
        .unzip();
    tokio::spawn(async move {
        tokio::select! {
            biased;
            // Set, or the sender dropped: both read as "stop".
            _ = stop.wait_for(|s| *s) => {}
            // Every shard ended on its own: nothing left to stop.
            () = every_closed(&senders) => return,
        }
        for sender in &senders {
            sender.send_replace(true);
        }
    });
    receivers
}

async fn every_closed(senders: &[tokio::sync::watch::Sender<bool>]) {
    for sender in senders {
        sender.closed().await;
    }
}

/// Starts one task per shard and returns the handle to them.
pub fn spawn<L: EventLog>(
    setup: WriterSetup<L>,
) -> (Writers, Vec<tokio::task::JoinHandle<ShardState>>) {
    let WriterSetup {
        log,
        states,
        index,
        retired,
        writer_id,
        claim_epochs,
        max_batch_commands,
        stop,
        fatal,
        in_doubt,
        clock,
        sizer,
        gauge_partition,
    } = setup;
    let fatal = Arc::new(fatal);
    let in_doubt = Arc::new(in_doubt.unwrap_or_else(|| tokio::sync::watch::channel(None).0));
    let ordered = log.ordered_appends();
    let shards = states.len();
    let claim_epochs = Arc::new(claim_epochs);
    let partition_log = log.clone();
    let log_partition_for: Arc<dyn Fn(&PartitionKey) -> u32 + Send + Sync> =
        Arc::new(move |key| partition_log.log_partition_for(key));
    let stops = relay_stop(stop, shards);
    let mut senders = Vec::with_capacity(shards);
    let mut handles = Vec::with_capacity(shards);
    for ((id, state), stop) in states.into_iter().enumerate().zip(stops) {
        let (tx, rx) = mpsc::channel(MAX_QUEUED_REQUESTS_PER_SHARD);
        senders.push(tx);
        let shard = Shard {
            id,
            shards,
            state,
            index: index.clone(),
            writer_id: writer_id.clone(),
            claim_epochs: claim_epochs.clone(),
            log_partition_for: log_partition_for.clone(),
            max_batch_commands,
            fatal: fatal.clone(),
            in_doubt: in_doubt.clone(),
            ordered,
            clock: clock.clone(),
            sizer: sizer.clone(),
            gauge_partition,
            in_flight_positions: FastMap::default(),
            next_batch_seq: 0,
            retired: retired.clone(),
            retiring: FastMap::default(),
            half_moves_checked: false,
        };
        handles.push(tokio::spawn(shard.run(log.clone(), rx, stop)));
    }
    (
        Writers {
            senders: Arc::new(senders),
            index,
            retired,
        },
        handles,
    )
}
