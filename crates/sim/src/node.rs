//! One ledger node as the simulator runs it: the real writer shards
//! (`reservoir_server::writer::spawn`) over a [`SimLog`], rebuilt by the real
//! `reservoir_server::recovery::recover`, on a `ManualClock`.
//!
//! The node's life mirrors the serving loop of
//! `reservoir_server::start_with_clock` without HTTP or the projector:
//! recover (a new process from its last snapshot and the log) → spawn the
//! writers → run until the log is in doubt (stop the writers, re-claim,
//! recover from the log again) or fails fatally or the node crashes (a new
//! process: a new writer id claims the log and recovers), or another process
//! takes the log over while this one runs on ([`Zombie`]). That loop is
//! re-stated here, not shared: see the crate docs.

use std::sync::Arc;

use reservoir_core::{EventBody, Partition, PartitionKey, Sizing, SizingRule};
use reservoir_log::memory::MemoryLog;
use reservoir_log::{Claim, EventLog, EventReader, LogEntry, LogError, Position, Record};
use reservoir_server::clock::{ManualClock, SharedClock};
use reservoir_server::recovery;
use reservoir_server::sizing::{Sizer, SizingFailure};
use reservoir_server::snapshot::{Cut, Snapshot};
use reservoir_server::writer::{self, RetiredIndex, ShardState, Writers};
use std::collections::BTreeMap;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The memory log behind the simulator's own wrapper: appends can be held
/// in flight without a timer (the memory log's own hold polls a real-time
/// sleep), and a planted codec bug can rewrite what is written.
pub struct SimLog {
    pub inner: MemoryLog,
    hold: Arc<Hold>,
    /// Appends called while held, since the last `take_held_appends`.
    held_appends: std::sync::atomic::AtomicUsize,
    /// Planted bug: moves are written without their debt (see `Plant`).
    pub drop_move_debt: bool,
    /// Planted bug: every `LOST_WRITE_EVERY`th append is acknowledged
    /// without being written.
    pub lose_writes: bool,
    appends: std::sync::atomic::AtomicUsize,
}

/// The gate held appends wait at. Not a `tokio::sync::watch`: a watch
/// spreads its waiters over eight `Notify`s chosen by tokio's per-thread
/// random generator, seeded anew in every process, so the appends of two
/// writer shards released together completed in an order that changed from
/// one process to the next (seed 490076's trace hash did). A `Notify` wakes
/// its waiters in the order they began to wait.
#[derive(Default)]
struct Hold {
    held: std::sync::atomic::AtomicBool,
    released: tokio::sync::Notify,
}

impl Hold {
    fn held(&self) -> bool {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn set(&self, held: bool) {
        self.held.store(held, std::sync::atomic::Ordering::SeqCst);
        if !held {
            self.released.notify_waiters();
        }
    }

    async fn released(&self) {
        loop {
            let released = self.released.notified();
            if !self.held() {
                return;
            }
            released.await;
        }
    }
}

/// Which appends the planted lost write drops (the 23rd, 46th, …).
pub const LOST_WRITE_EVERY: usize = 23;

impl SimLog {
    pub fn new(ordered: bool, drop_move_debt: bool, lose_writes: bool) -> SimLog {
        SimLog {
            inner: if ordered {
                MemoryLog::ordered()
            } else {
                MemoryLog::new()
            },
            hold: Arc::default(),
            held_appends: Default::default(),
            drop_move_debt,
            lose_writes,
            appends: Default::default(),
        }
    }

    /// While held, every append stays in flight; its outcome (written or
    /// not) is fixed when it is called, as the memory log promises.
    pub fn hold(&self, held: bool) {
        self.hold.set(held);
    }

    /// How many appends were called while held since the last call (two or
    /// more: batches were in flight together).
    pub fn take_held_appends(&self) -> usize {
        self.held_appends
            .swap(0, std::sync::atomic::Ordering::SeqCst)
    }
}

/// The planted codec bug: the moves of a generation switch (or rollback)
/// lose their debt on the way to the log, as a field that defaulted to 0
/// would. Epoch roll-overs keep theirs: the bug is the switch's.
fn without_move_debt(mut batch: Vec<Record>) -> Vec<Record> {
    for record in &mut batch {
        let generation = record.key.policy_generation;
        for event in &mut record.events {
            let switch = match &event.body {
                EventBody::MovedOut { to: other, .. } | EventBody::MovedIn { from: other, .. } => {
                    other.policy_generation != generation
                }
                _ => false,
            };
            if !switch {
                continue;
            }
            if let EventBody::MovedOut { debt_units, .. } | EventBody::MovedIn { debt_units, .. } =
                &mut event.body
            {
                *debt_units = 0;
                for amounts in &mut event.further {
                    if let reservoir_core::DimensionAmounts::Moved { debt_units, .. } = amounts {
                        *debt_units = 0;
                    }
                }
            }
        }
    }
    batch
}

impl EventReader for SimLog {
    fn log_partition_for(&self, key: &PartitionKey) -> u32 {
        self.inner.log_partition_for(key)
    }

    fn log_partitions(&self) -> u32 {
        self.inner.log_partitions()
    }

    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        self.inner.read(log_partition, from_offset, max).await
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        self.inner.end_offset(log_partition).await
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: std::time::Duration,
    ) -> Result<bool, LogError> {
        self.inner.wait_for(log_partition, offset, timeout).await
    }
}

impl EventLog for SimLog {
    fn ordered_appends(&self) -> bool {
        self.inner.ordered_appends()
    }

    async fn reclaim(&self, log_partition: u32) -> Result<Claim, LogError> {
        self.inner.reclaim(log_partition).await
    }

    async fn confirm_claim(&self, log_partition: u32, claim: &Claim) -> Result<(), LogError> {
        self.inner.confirm_claim(log_partition, claim).await
    }

    fn append(
        &self,
        batch: Vec<Record>,
    ) -> impl std::future::Future<Output = Result<Vec<Position>, LogError>> + Send {
        let batch = match self.drop_move_debt {
            true => without_move_debt(batch),
            false => batch,
        };
        let n = self
            .appends
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let lost =
            self.lose_writes && !batch.is_empty() && n % LOST_WRITE_EVERY == LOST_WRITE_EVERY - 1;
        let positions: Vec<Position> = (0..batch.len() as u64)
            .map(|i| Position {
                log_partition: 0,
                offset: u64::MAX - i,
            })
            .collect();
        // Called now: the memory log fixes the outcome and the place in the log here.
        let appended: std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Vec<Position>, LogError>> + Send + '_>,
        > = match lost {
            true => Box::pin(std::future::ready(Ok(positions))),
            false => Box::pin(self.inner.append(batch)),
        };
        if self.hold.held() {
            self.held_appends
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let hold = self.hold.clone();
        async move {
            hold.released().await;
            appended.await
        }
    }
}

/// Sizes a reserve from its inputs alone: input = the counted input tokens,
/// output = `max_tokens` (or 256). Deterministic, and the same on a retry.
pub struct SimSizer;

/// Output tokens a reserve without `max_tokens` is sized with.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 256;

impl Sizer for SimSizer {
    fn size(
        &self,
        _policy: &reservoir_core::Policy,
        counted_input_tokens: u64,
        max_tokens: Option<u64>,
    ) -> Result<Sizing, SizingFailure> {
        let output_units = max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS);
        Ok(Sizing {
            units: counted_input_tokens
                .checked_add(output_units)
                .ok_or_else(|| SizingFailure::Invalid("tokens overflow".into()))?,
            input_units: counted_input_tokens,
            output_units,
            rule: SizingRule::MaxTokens,
        })
    }
}

/// Why the node needs rebuilding.
#[derive(Debug)]
pub enum Trouble {
    /// A log partition in doubt: stop, re-claim, rebuild (same process).
    InDoubt(String),
    /// A fatal log error or a writer that stopped: the process restarts.
    Fatal(String),
}

/// The writers of a process another one took the log over from while it
/// still ran (cut off from its group, paused): they answer from their stale
/// memory and append under a superseded claim until the log fences them.
pub struct Zombie {
    pub writers: Writers,
    tasks: Vec<JoinHandle<ShardState>>,
    /// Kept: a dropped stop sender reads as "stop" to the shard loop.
    _stop: watch::Sender<bool>,
    fatal: watch::Receiver<Option<String>>,
    /// Rounds it still runs if the log does not fence it first.
    pub rounds_left: u32,
}

impl Zombie {
    /// Why it stopped, if it did (a fenced append is fatal to a writer).
    pub fn stopped(&self) -> Option<String> {
        self.fatal.borrow().clone()
    }

    /// Ends the process. Returns the panic messages of its shard tasks.
    pub async fn kill(self) -> Vec<String> {
        abort_all(self.tasks).await
    }
}

pub struct Node {
    pub log: Arc<SimLog>,
    pub clock: ManualClock,
    pub retired: Arc<RetiredIndex>,
    pub shards: usize,
    max_batch_commands: usize,
    /// Process restarts so far (each one a new writer id).
    pub boots: u64,
    writer_id: String,
    claim_epoch: u64,
    pub writers: Writers,
    tasks: Vec<JoinHandle<ShardState>>,
    stop: watch::Sender<bool>,
    fatal: watch::Receiver<Option<String>>,
    in_doubt: watch::Receiver<Option<String>>,
    /// The last snapshot "written to the data directory": a process that
    /// restarts recovers from it and the log after its cut.
    pub snapshot: Option<Snapshot>,
}

impl Node {
    /// Claims the log as a first process and starts the writers on what it holds.
    pub async fn boot(
        log: Arc<SimLog>,
        clock: ManualClock,
        retired: Arc<RetiredIndex>,
        shards: usize,
        max_batch_commands: usize,
    ) -> Result<Node, String> {
        let writer_id = "sim-node-b0".to_string();
        let claim = log.inner.claim(&writer_id);
        let (writers, tasks, stop, fatal, in_doubt) = start_writers(
            None,
            &log,
            &clock,
            &retired,
            shards,
            max_batch_commands,
            (&writer_id, claim.epoch),
        )
        .await?;
        Ok(Node {
            log,
            clock,
            retired,
            shards,
            max_batch_commands,
            boots: 0,
            writer_id,
            claim_epoch: claim.epoch,
            writers,
            tasks,
            stop,
            fatal,
            in_doubt,
            snapshot: None,
        })
    }

    /// Where a snapshot taken now resumes: the log's end, under this
    /// writer's claim (the log has no other writer: see `snapshot`).
    pub fn cut(&self) -> Cut {
        Cut {
            log_partition: 0,
            next_offset: self.log.inner.len() as u64,
            claim_writer_id: self.writer_id.clone(),
            claim_epoch: self.claim_epoch,
        }
    }

    /// What the writers reported since they started, if anything.
    pub fn trouble(&self) -> Option<Trouble> {
        if let Some(reason) = self.fatal.borrow().clone() {
            return Some(Trouble::Fatal(reason));
        }
        self.in_doubt.borrow().clone().map(Trouble::InDoubt)
    }

    /// The process dies where it stands: batches in flight are dropped
    /// unanswered (their appends may have landed). Returns the panic message
    /// of every shard task that had panicked.
    pub async fn crash(&mut self) -> Vec<String> {
        abort_all(std::mem::take(&mut self.tasks)).await
    }

    /// A new process claims the log and takes over while this one's writers
    /// still run: they become a [`Zombie`], alive for `rounds` rounds.
    pub async fn take_over(&mut self, rounds: u32) -> Result<Zombie, String> {
        let writers = self.writers.clone();
        let tasks = std::mem::take(&mut self.tasks);
        let fatal = self.fatal.clone();
        let stop = std::mem::replace(&mut self.stop, watch::channel(false).0);
        let zombie = Zombie {
            writers,
            tasks,
            _stop: stop,
            fatal,
            rounds_left: rounds,
        };
        // Another process, with a data directory of its own: no snapshot
        // now, and none of the old one's later.
        self.snapshot = None;
        self.restart(false).await?;
        Ok(zombie)
    }

    /// A new process after a crash or a fatal log error: a new writer id
    /// claims the log above every claim, recovers from the last snapshot
    /// (with `from_snapshot`) and the log, and serves.
    pub async fn restart(&mut self, from_snapshot: bool) -> Result<(), String> {
        self.boots += 1;
        self.writer_id = format!("sim-node-b{}", self.boots);
        let claim = self.log.inner.claim(&self.writer_id);
        self.claim_epoch = claim.epoch;
        let snapshot = if from_snapshot {
            self.snapshot.clone()
        } else {
            None
        };
        self.respawn(snapshot).await
    }

    /// The in-doubt path of the serving loop: writers stop after what is
    /// queued, the log is re-claimed by the same writer, state is rebuilt.
    pub async fn reclaim(&mut self) -> Result<Vec<String>, String> {
        self.stop.send_replace(true);
        let mut panics = Vec::new();
        for task in self.tasks.drain(..) {
            if let Err(err) = task.await {
                if err.is_panic() {
                    panics.push(panic_message(err.into_panic()));
                }
            }
        }
        let claim = self
            .log
            .reclaim(0)
            .await
            .map_err(|e| format!("re-claim failed: {e}"))?;
        if claim.writer_id != self.writer_id {
            return Err(format!(
                "re-claimed as {} instead of {}",
                claim.writer_id, self.writer_id
            ));
        }
        self.claim_epoch = claim.epoch;
        // As the serving loop: the rebuild starts from the last snapshot written.
        self.respawn(self.snapshot.clone()).await?;
        Ok(panics)
    }

    async fn respawn(&mut self, snapshot: Option<Snapshot>) -> Result<(), String> {
        let (writers, tasks, stop, fatal, in_doubt) = start_writers(
            snapshot,
            &self.log,
            &self.clock,
            &self.retired,
            self.shards,
            self.max_batch_commands,
            (&self.writer_id, self.claim_epoch),
        )
        .await?;
        self.writers = writers;
        self.tasks = tasks;
        self.stop = stop;
        self.fatal = fatal;
        self.in_doubt = in_doubt;
        Ok(())
    }

    /// Every shard's committed state (a snapshot request: a barrier behind
    /// the batches in flight), as one map by partition key.
    pub async fn partitions(&self) -> Result<BTreeMap<PartitionKey, Partition>, String> {
        let mut all = BTreeMap::new();
        for shard in 0..self.writers.shards() {
            match self.writers.call(shard, writer::Request::Snapshot).await {
                Ok(writer::Answer::Snapshot(state)) => {
                    for (key, ps) in state.partitions {
                        all.insert(key, ps.partition);
                    }
                }
                Ok(other) => return Err(format!("shard {shard}: snapshot answered {other:?}")),
                Err(failure) => return Err(format!("shard {shard}: snapshot failed: {failure:?}")),
            }
        }
        Ok(all)
    }
}

type Started = (
    Writers,
    Vec<JoinHandle<ShardState>>,
    watch::Sender<bool>,
    watch::Receiver<Option<String>>,
    watch::Receiver<Option<String>>,
);

async fn start_writers(
    snapshot: Option<Snapshot>,
    log: &Arc<SimLog>,
    clock: &ManualClock,
    retired: &Arc<RetiredIndex>,
    shards: usize,
    max_batch_commands: usize,
    (writer_id, claim_epoch): (&str, u64),
) -> Result<Started, String> {
    let recovered = recovery::recover(&**log, shards, snapshot, retired)
        .await
        .map_err(|e| format!("recovery failed: {e}"))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (fatal_tx, fatal_rx) = watch::channel(None::<String>);
    let (in_doubt_tx, in_doubt_rx) = watch::channel(None::<String>);
    let clock: SharedClock = Arc::new(clock.clone());
    let (writers, tasks) = writer::spawn(writer::WriterSetup {
        gauge_partition: None,
        log: log.clone(),
        states: recovered.shards,
        index: Arc::new(std::sync::RwLock::new(recovered.index)),
        retired: retired.clone(),
        writer_id: writer_id.to_string(),
        claim_epochs: vec![claim_epoch],
        max_batch_commands,
        stop: stop_rx,
        fatal: fatal_tx,
        in_doubt: Some(in_doubt_tx),
        clock,
        sizer: Arc::new(SimSizer),
    });
    Ok((writers, tasks, stop_tx, fatal_rx, in_doubt_rx))
}

async fn abort_all(tasks: Vec<JoinHandle<ShardState>>) -> Vec<String> {
    for task in &tasks {
        task.abort();
    }
    let mut panics = Vec::new();
    for task in tasks {
        if let Err(err) = task.await {
            if err.is_panic() {
                panics.push(panic_message(err.into_panic()));
            }
        }
    }
    panics
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        return (*s).to_string();
    }
    if let Some(s) = payload.downcast_ref::<String>() {
        return s.clone();
    }
    "a panic without a message".to_string()
}
