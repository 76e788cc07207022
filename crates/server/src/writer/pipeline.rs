//! The shard task's loop: take the queued requests, decide them as one batch
//! on speculative state, hand the batch to the log (group commit), and answer
//! only once the log acknowledged it.
//!
//! On a log with ordered appends the shard pipelines up to
//! [`MAX_BATCHES_IN_FLIGHT`] batches: batch N+1 is decided on top of N's
//! speculative state while N's append is in flight. Replies still go out in
//! order and only after each batch's own append. If N fails, every batch after
//! it (appended after it, so refused by the log too) is rolled back, newest
//! first, then N, and all of them answer 503; the clients retry with the same
//! ids. Rolling back is core's [`Savepoint`], taken at a partition's first
//! touch in a batch: the server never edits a partition's fields itself.
//!
//! Records that leave memory in a batch (their idempotency window passed,
//! [`reservoir_core::retention`]) wait in `Shard::retiring`, where lookups
//! still find them, until the batch is durable; then they go to the on-disk
//! idempotency index ([`super::retired`]) and leave every in-memory map. A
//! rolled-back batch puts them back into the partition instead.

use crate::ratelimit::RateLimits;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use reservoir_core::{EventBody, PartitionKey, Reservation, ReservationId, Savepoint};
use reservoir_log::{Claim, EventLog, LogError, Position, Record};
use tokio::sync::{mpsc, oneshot};

use super::protocol::{Answer, Envelope, Failure, Reply, Request};
use super::retired::{Retired, RetiredIndex};
use super::state::{FastMap, Index, ShardState};
use crate::clock::SharedClock;
use crate::sizing::Sizer;
use crate::telemetry;

/// Batches one shard keeps in flight on a log with ordered appends. One is
/// not enough: a request that arrives while the shard waits for batch N would
/// wait for N to land before being decided, then for its own write; with
/// several, it is decided at once and joins the log's next group commit.
pub const MAX_BATCHES_IN_FLIGHT: usize = 8;

/// Stops the server when a shard task panics (a broken invariant in `apply`,
/// a log that broke its contract): crash-only, a restart recovers from the
/// log, which never received the batch that broke.
struct CrashGuard {
    shard: usize,
    fatal: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

impl Drop for CrashGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.fatal.send(Some(format!(
                "shard {} stopped on a broken invariant (see the panic above)",
                self.shard
            )));
        }
    }
}

/// Pre-images taken at first touch within a batch, replayed backwards on failure.
pub(super) enum Undo {
    /// The partition did not exist before the batch.
    NewPartition(PartitionKey),
    /// The partition as it was before the batch's first event on it.
    Partition(PartitionKey, Box<Savepoint>),
    Active((String, String), Option<PartitionKey>),
    Index(ReservationId),
    /// A record this batch evicted (the savepoint puts it back into the partition).
    Retiring(ReservationId),
}

/// Where a reply's log position comes from once the batch is durable.
#[derive(Clone, Copy)]
pub(super) enum PositionFrom {
    /// Record `i` of this batch.
    Record(usize),
    /// Record `record` of an earlier batch (by its sequence number in this
    /// shard), in flight when this one was decided. It lands first (batches
    /// are answered in order), and on landing it rewrites these to `Known`.
    Earlier {
        batch: u64,
        record: usize,
    },
    Known(Position),
}

type AppendFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Vec<Position>, LogError>> + Send + 'a>,
>;

type ConfirmFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LogError>> + Send + 'a>>;

/// What a batch that appends nothing must confirm before it answers (see
/// [`EventLog::confirm_claim`]): the log partitions whose state its
/// decisions came from.
enum Confirm {
    Partitions(std::collections::BTreeSet<u32>),
    /// A decision whose partition is not known (no active policy yet): every
    /// log partition this writer holds.
    All,
}

/// A decided batch whose append has been handed to the log.
struct InFlight<'a> {
    /// Sequence number of the batch in its shard (see `PositionFrom::Earlier`).
    seq: u64,
    /// See `Batch::pause_after`.
    pause_after: bool,
    records: Vec<Record>,
    undo: Vec<Undo>,
    /// Records this batch evicted from memory (in `Shard::retiring` until it lands).
    evicted: Vec<ReservationId>,
    pendings: Vec<(oneshot::Sender<Reply>, Pending)>,
    /// `None`: nothing to append (reads, idempotent repeats); answered in order.
    append: Option<AppendFuture<'a>>,
    /// Appends nothing but answers decisions from state: the claim is
    /// confirmed first (when the batch reaches the front).
    confirm: Option<ConfirmFuture<'a>>,
    result: Option<Result<Vec<Position>, LogError>>,
    started: Instant,
}

impl InFlight<'_> {
    /// Waits for the append (cancel-safe: progress stays in `self`).
    async fn wait(&mut self) {
        if self.result.is_none() {
            let result = match self.append.as_mut() {
                Some(append) => append.await,
                None => Ok(Vec::new()),
            };
            self.append = None;
            self.result = Some(result);
        }
    }

    /// Whether the append has already failed (one poll, without waiting): a
    /// log refuses some batches at the call, before they are queued, and the
    /// next batch must then not be handed to it.
    fn failed_already(&mut self) -> bool {
        if self.result.is_none() {
            if let Some(append) = self.append.as_mut() {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                if let std::task::Poll::Ready(result) = append.as_mut().poll(&mut cx) {
                    self.append = None;
                    self.result = Some(result);
                }
            }
        }
        matches!(self.result, Some(Err(_)))
    }
}

/// A decided request waiting for the batch's append.
pub(super) enum Pending {
    Ready(Reply),
    Reservation {
        key: PartitionKey,
        reservation: Box<reservoir_core::Reservation>,
        created: bool,
        position: PositionFrom,
    },
    Published {
        key: PartitionKey,
        created: bool,
        position: Option<PositionFrom>,
    },
    /// A limit refusal: answered after its `AdmissionRefused` record is durable.
    Refused(Failure),
}

/// The batch being decided.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) records: Vec<Record>,
    pub(super) undo: Vec<Undo>,
    /// Partition → its savepoint's place in `undo`.
    savepoints: FastMap<PartitionKey, usize>,
    /// Reservations whose latest event is in this batch → its record.
    pub(super) pending_positions: FastMap<ReservationId, usize>,
    evicted: Vec<ReservationId>,
    /// The move-halves test failpoint: stop the shard once this batch is durable.
    pub(super) pause_after: bool,
}

/// One writer task's state and identity.
pub struct Shard {
    pub id: usize,
    pub shards: usize,
    pub state: ShardState,
    pub index: Index,
    pub writer_id: String,
    /// The claim epoch this writer holds in each log partition.
    pub claim_epochs: Arc<Vec<u64>>,
    /// The log's `log_partition_for`, so records carry the right claim epoch.
    pub log_partition_for: Arc<dyn Fn(&PartitionKey) -> u32 + Send + Sync>,
    pub max_batch_commands: usize,
    /// Set when the log failed in a way only a restart (reopen, reclaim, recover) fixes.
    pub fatal: Arc<tokio::sync::watch::Sender<Option<String>>>,
    /// Set when the log is in doubt after a failed append (or, for a log with
    /// ordered appends, refuses appends after one failed): the server
    /// re-claims the log and rebuilds the writers' state from it.
    pub in_doubt: Arc<tokio::sync::watch::Sender<Option<String>>>,
    /// The log's [`EventLog::ordered_appends`]: this shard pipelines.
    pub ordered: bool,
    /// Where `now` comes from (made monotonic per partition, see `now_for`).
    pub clock: SharedClock,
    /// Sizes reserves that name no units.
    pub sizer: Arc<dyn Sizer>,
    /// See [`super::WriterSetup::gauge_partition`].
    pub gauge_partition: Option<u32>,
    /// `pending_positions` of the batches in flight, newest winning: id →
    /// (batch sequence number, record) (see `PositionFrom::Earlier`).
    pub(super) in_flight_positions: FastMap<ReservationId, (u64, usize)>,
    /// Sequence number of the next batch.
    pub(super) next_batch_seq: u64,
    /// The idempotency index: records that left memory.
    pub retired: Arc<RetiredIndex>,
    /// Records evicted by batches not yet durable: id → (partition, record).
    pub(super) retiring: FastMap<ReservationId, (PartitionKey, Reservation)>,
    /// Whether moves logged without their second half have been completed
    /// since recovery (`super::moves`); done in the first batch.
    pub half_moves_checked: bool,
}

impl Shard {
    /// The task body: batches until every sender is gone, then returns its state.
    /// On `stop`, the queue is closed and what is already in it is still decided
    /// and appended: the batch in flight always finishes.
    pub async fn run<L: EventLog>(
        mut self,
        log: Arc<L>,
        mut rx: mpsc::Receiver<Envelope>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> ShardState {
        enum Woke {
            Appended,
            Received(usize),
            Stop,
        }
        let _guard = CrashGuard {
            shard: self.id,
            fatal: self.fatal.clone(),
        };
        let pipelined = log.ordered_appends();
        let mut buffer = Vec::with_capacity(self.max_batch_commands);
        let mut stopping = false;
        let mut in_flight: VecDeque<InFlight<'_>> = VecDeque::new();
        loop {
            let woke = tokio::select! {
                biased;
                _ = async { in_flight.front_mut().expect("checked").wait().await }, if !in_flight.is_empty() => Woke::Appended,
                n = rx.recv_many(&mut buffer, self.max_batch_commands), if in_flight.len() < MAX_BATCHES_IN_FLIGHT => Woke::Received(n),
                _ = stop.wait_for(|s| *s), if !stopping => Woke::Stop,
            };
            let received = match woke {
                Woke::Appended => {
                    let flight = in_flight.pop_front().expect("in flight");
                    self.complete(flight, &mut in_flight).await;
                    continue;
                }
                Woke::Stop => {
                    rx.close();
                    stopping = true;
                    continue;
                }
                Woke::Received(n) => n,
            };
            if received == 0 {
                self.complete_all(&mut in_flight).await;
                tracing::info!(shard = self.id, "writer stopped");
                return self.state;
            }
            let mut envelopes = std::mem::take(&mut buffer);
            // A snapshot copies committed state only: let the batches in
            // flight land first, and answer it before this batch is decided
            // (it changes nothing, so the others decide as they would have).
            // Taken after the requests before it in the batch, it would hold
            // their speculative events: events no log holds if the append
            // failed, and without their log positions (which a request gets
            // when its batch lands) if it did not.
            let barrier = envelopes
                .iter()
                .any(|e| matches!(e.request, Request::Snapshot));
            if barrier {
                self.complete_all(&mut in_flight).await;
                if !self.half_moves_checked {
                    // The first batch after a start finishes what a torn
                    // append left half done (see `moves`): let it land, so
                    // the snapshot holds it.
                    let first = self.begin(Some(&*log), Vec::new());
                    in_flight.push_back(first);
                    self.complete_all(&mut in_flight).await;
                }
                let (snapshots, rest): (Vec<_>, Vec<_>) = envelopes
                    .into_iter()
                    .partition(|e| matches!(e.request, Request::Snapshot));
                for Envelope { reply, .. } in snapshots {
                    let _ = reply.send(self.snapshot());
                }
                envelopes = rest;
                if envelopes.is_empty() {
                    continue;
                }
            }
            let previous_failed = match in_flight.back_mut() {
                Some(flight) => flight.failed_already(),
                None => false,
            };
            let next = if previous_failed {
                // Not handed to the log behind a failed append; answered 503 when it lands.
                self.begin::<L>(None, envelopes)
            } else {
                self.begin(Some(&*log), envelopes)
            };
            if pipelined {
                in_flight.push_back(next);
            } else {
                self.complete_all(&mut in_flight).await;
                self.complete(next, &mut in_flight).await;
            }
        }
    }

    /// Completes every batch in flight, oldest first.
    async fn complete_all(&mut self, in_flight: &mut VecDeque<InFlight<'_>>) {
        while let Some(flight) = in_flight.pop_front() {
            self.complete(flight, in_flight).await;
        }
    }

    /// Decides a batch against the (possibly speculative) state and hands the
    /// records to the log (`None`: do not append, the batch before failed).
    fn begin<'a, L: EventLog>(
        &mut self,
        log: Option<&'a L>,
        envelopes: Vec<Envelope>,
    ) -> InFlight<'a> {
        let mut batch = Batch::default();
        if !self.half_moves_checked {
            self.complete_half_moves(&mut batch);
            self.complete_supersessions(&mut batch);
            self.half_moves_checked = true;
        }
        let mut pendings = Vec::with_capacity(envelopes.len());
        let mut confirm = Confirm::Partitions(Default::default());
        for Envelope { request, reply } in envelopes {
            // Once the batch has a record, its append fences every answer in
            // it and nothing needs confirming: the common case does no work.
            if batch.records.is_empty() {
                self.note_confirm(&mut confirm, &request);
            }
            let pending = self.decide_one(&mut batch, request);
            pendings.push((reply, pending));
        }
        metrics::histogram!("reservoir_batch_commands").record(pendings.len() as f64);

        // No conservation check here: `apply` (through each partition's
        // savepoint) asserts the books after every event, in the build we
        // ship, so a batch that would break them crashes this task before it
        // reaches the log, and `CrashGuard` stops the server (see `run`).
        // Later batches name this one's records as `Earlier` until it lands.
        let seq = self.next_batch_seq;
        self.next_batch_seq += 1;
        for (id, record) in std::mem::take(&mut batch.pending_positions) {
            self.in_flight_positions.insert(id, (seq, record));
        }
        let append: Option<AppendFuture<'a>> = if batch.records.is_empty() {
            None
        } else {
            metrics::histogram!("reservoir_batch_records").record(batch.records.len() as f64);
            match log {
                Some(log) => Some(Box::pin(log.append(batch.records.clone()))),
                None => Some(Box::pin(std::future::ready(Err(LogError::Unavailable(
                    "not appended: the batch before it failed".into(),
                ))))),
            }
        };
        let confirm = match log {
            Some(log) if batch.records.is_empty() => {
                let claims = self.claims_to_confirm(confirm);
                (!claims.is_empty()).then(|| {
                    Box::pin(async move {
                        for (p, claim) in &claims {
                            log.confirm_claim(*p, claim).await?;
                        }
                        Ok(())
                    }) as ConfirmFuture<'a>
                })
            }
            _ => None,
        };
        InFlight {
            seq,
            pause_after: batch.pause_after,
            records: batch.records,
            undo: batch.undo,
            evicted: batch.evicted,
            pendings,
            append,
            confirm,
            result: None,
            started: Instant::now(),
        }
    }

    /// Waits for a batch's append and answers it. On failure, `later` (decided
    /// on top of it and appended after it) fails too: all are undone, newest first.
    async fn complete(&mut self, mut flight: InFlight<'_>, later: &mut VecDeque<InFlight<'_>>) {
        flight.wait().await;
        metrics::histogram!("reservoir_append_seconds")
            .record(flight.started.elapsed().as_secs_f64());
        let result = flight.result.take().expect("waited");
        let positions = match result {
            Ok(positions) if positions.len() == flight.records.len() => positions,
            Ok(positions) => {
                // The log broke its contract; nothing can be trusted about this batch.
                panic!(
                    "log returned {} positions for {} records",
                    positions.len(),
                    flight.records.len()
                );
            }
            Err(err) => {
                self.fail(flight, later, err).await;
                return;
            }
        };
        if later.is_empty() {
            self.in_flight_positions.clear();
        } else {
            let seq = flight.seq;
            self.in_flight_positions
                .retain(|_, (batch, _)| *batch != seq);
        }
        if let Some(confirm) = flight.confirm.take() {
            if let Err(err) = confirm.await {
                self.unconfirmed(flight, &err);
                return;
            }
        }

        for (record, position) in flight.records.iter().zip(&positions) {
            for event in &record.events {
                self.state
                    .note_committed(&record.key, &event.body, *position);
                telemetry::record_event(
                    &record.key,
                    &event.body,
                    self.state
                        .partitions
                        .get(&record.key)
                        .map(|ps| &ps.partition),
                );
            }
        }
        self.retire(std::mem::take(&mut flight.evicted));
        if flight.pause_after {
            // The test failpoint: the start of a publish is durable, the
            // rest is not; wait here until the test kills the process.
            tracing::warn!(
                shard = self.id,
                "failpoint: paused between the halves of a move"
            );
            std::future::pending::<()>().await;
        }
        let resolve = |from: PositionFrom| {
            match from {
            PositionFrom::Record(i) => positions[i],
            PositionFrom::Known(p) => p,
            PositionFrom::Earlier { batch, record } => panic!(
                "shard {}: batch {} answered before batch {batch} (record {record}) it depends on landed",
                self.id, flight.seq
            ),
        }
        };
        for (reply, pending) in flight.pendings {
            let answer = match pending {
                Pending::Ready(r) => r,
                Pending::Refused(failure) => Err(failure),
                Pending::Reservation {
                    key,
                    reservation,
                    created,
                    position,
                } => Ok(Answer::Reservation {
                    limits: self
                        .state
                        .partitions
                        .get(&key)
                        .and_then(|ps| RateLimits::of(&ps.partition))
                        .map(Box::new),
                    key,
                    reservation,
                    position: resolve(position),
                    created,
                }),
                Pending::Published {
                    key,
                    created,
                    position,
                } => Ok(Answer::Published {
                    key,
                    created,
                    position: position.map(resolve),
                }),
            };
            let _ = reply.send(answer);
        }
        // Later batches that named this one's records learn their positions.
        for later in later.iter_mut() {
            for (_, pending) in later.pendings.iter_mut() {
                let position = match pending {
                    Pending::Reservation { position, .. } => Some(position),
                    Pending::Published {
                        position: Some(position),
                        ..
                    } => Some(position),
                    _ => None,
                };
                if let Some(position) = position {
                    if let PositionFrom::Earlier { batch, record } = *position {
                        if batch == flight.seq {
                            *position = PositionFrom::Known(positions[record]);
                        }
                    }
                }
            }
        }
    }

    /// A failed append: this batch and every later one are rolled back,
    /// newest first, and answered 503.
    async fn fail(
        &mut self,
        flight: InFlight<'_>,
        later: &mut VecDeque<InFlight<'_>>,
        err: LogError,
    ) {
        tracing::warn!(shard = self.id, %err, records = flight.records.len(), "append failed; batch discarded");
        metrics::counter!("reservoir_append_failures_total").increment(1);
        let mut failed = vec![flight];
        while let Some(mut later) = later.pop_front() {
            later.wait().await;
            if matches!(later.result, Some(Ok(_))) && !later.records.is_empty() {
                // An ordered log must refuse appends after a failed one.
                tracing::error!(
                    shard = self.id,
                    "log acknowledged an append made after a failed one"
                );
                let _ = self.fatal.send(Some(format!(
                    "shard {}: the log acknowledged an append after a failed one",
                    self.id
                )));
            }
            failed.push(later);
        }
        self.in_flight_positions.clear();
        // The half-move completion, if it was in a failed batch, runs again.
        self.half_moves_checked = false;
        // Newest first: each undo log holds the pre-images of its own batch.
        for f in failed.iter_mut().rev() {
            let undo = std::mem::take(&mut f.undo);
            self.restore(undo);
        }
        self.report_failure(&err);
        for f in failed {
            for (reply, _) in f.pendings {
                let _ = reply.send(Err(Failure::Unavailable(format!(
                    "log append failed: {err}"
                ))));
            }
        }
    }

    /// Adds what `request`'s answer depends on to `confirm`, if it is a
    /// decision from the writer's state (a write, its refusal, or a retry
    /// answered from its record). Reads and the operator's views are not.
    fn note_confirm(&self, confirm: &mut Confirm, request: &Request) {
        let Confirm::Partitions(partitions) = confirm else {
            return;
        };
        let placed = |key: &PartitionKey| (self.log_partition_for)(key);
        let active = |subject: &str, route: &str| {
            self.state
                .active
                .get(&(subject.to_string(), route.to_string()))
                .map(placed)
        };
        let partition = match request {
            Request::Reserve { subject, route, .. } | Request::Rollback { subject, route, .. } => {
                active(subject, route)
            }
            Request::Publish { policy, .. } => active(&policy.subject, &policy.route),
            Request::IssueShard(issue) => active(&issue.subject, &issue.route),
            Request::Act { key, .. } | Request::Settle { key, .. } => Some(placed(key)),
            Request::ReconcileShard(reconcile) => Some(placed(&reconcile.presented.source)),
            _ => return,
        };
        match partition {
            Some(p) => {
                partitions.insert(p);
            }
            None => *confirm = Confirm::All,
        }
    }

    /// This writer's claims on the log partitions `confirm` names.
    fn claims_to_confirm(&self, confirm: Confirm) -> Vec<(u32, Claim)> {
        let held = |p: u32| {
            let epoch = self.claim_epochs.get(p as usize).copied().unwrap_or(0);
            let writer_id = self.writer_id.clone();
            (epoch > 0).then_some((p, Claim { writer_id, epoch }))
        };
        match confirm {
            Confirm::All => (0..self.claim_epochs.len() as u32)
                .filter_map(held)
                .collect(),
            Confirm::Partitions(partitions) => partitions.into_iter().filter_map(held).collect(),
        }
    }

    /// A batch that appended nothing could not confirm this writer's claim:
    /// its answers, decided from state another writer may have changed
    /// since, are withheld (503, retry). Nothing was written or changed, so
    /// nothing is undone; superseded (`Fenced`), the writer stops as after a
    /// fenced append.
    fn unconfirmed(&self, flight: InFlight<'_>, err: &LogError) {
        tracing::warn!(shard = self.id, %err, "claim not confirmed; answers withheld");
        metrics::counter!("reservoir_claim_unconfirmed_total").increment(1);
        if matches!(err, LogError::Fenced { .. }) {
            self.report_failure(err);
        }
        for (reply, _) in flight.pendings {
            let _ = reply.send(Err(Failure::Unavailable(format!(
                "this writer could not confirm it still holds the log: {err}"
            ))));
        }
    }

    /// After a failed append: a log that cannot say what reached the disk
    /// (embedded: any failed synced write) or that fenced us cannot be written
    /// again by this process: report it, so the server stops and restarts from
    /// the log. A log partition in doubt (or an ordered log, which refuses
    /// every append after a failed one) is re-claimed and rebuilt in process.
    fn report_failure(&self, err: &LogError) {
        match err {
            LogError::InDoubt { .. } => {
                let _ = self
                    .in_doubt
                    .send(Some(format!("shard {}: {err}", self.id)));
            }
            LogError::Fenced { .. } => {
                let _ = self.fatal.send(Some(format!("shard {}: {err}", self.id)));
            }
            e if !e.transient() => {
                let _ = self.fatal.send(Some(format!("shard {}: {err}", self.id)));
            }
            _ if self.ordered => {
                let _ = self
                    .in_doubt
                    .send(Some(format!("shard {}: {err}", self.id)));
            }
            _ => {}
        }
    }

    fn restore(&mut self, undo: Vec<Undo>) {
        for u in undo.into_iter().rev() {
            match u {
                Undo::NewPartition(key) => {
                    self.state.partitions.remove(&key);
                }
                Undo::Partition(key, savepoint) => {
                    let ps = self
                        .state
                        .partitions
                        .get_mut(&key)
                        .expect("touched partition exists");
                    savepoint.rollback(&mut ps.partition);
                }
                Undo::Active(sr, before) => match before {
                    Some(k) => {
                        self.state.active.insert(sr, k);
                    }
                    None => {
                        self.state.active.remove(&sr);
                    }
                },
                Undo::Index(id) => {
                    self.index.write().expect("index lock").remove(&id);
                }
                Undo::Retiring(id) => {
                    self.retiring.remove(&id);
                }
            }
        }
    }

    /// A landed batch's evicted records: into the idempotency index, out of
    /// every in-memory map. A failed index write stops the server (the records
    /// would be nowhere a retry could find them; recovery writes them again).
    fn retire(&mut self, evicted: Vec<ReservationId>) {
        if evicted.is_empty() {
            return;
        }
        let mut retired = Vec::with_capacity(evicted.len());
        {
            let mut index = self.index.write().expect("index lock");
            for id in &evicted {
                let (key, record) = self
                    .retiring
                    .remove(id)
                    .expect("an evicted record waits in `retiring` until its batch lands");
                let position = self
                    .state
                    .forget(&key, &record)
                    .expect("a record in memory has the position of its last event");
                index.remove(id);
                retired.push(Retired::new(key, position, record));
            }
        }
        telemetry::evicted(retired.len());
        if let Err(err) = self.retired.put_all(&retired) {
            tracing::error!(shard = self.id, %err, "idempotency index write failed");
            let _ = self.fatal.send(Some(format!("shard {}: {err}", self.id)));
        }
    }

    /// The place in `batch.undo` of `key`'s savepoint, taken at first touch.
    fn touch(&mut self, batch: &mut Batch, key: &PartitionKey) -> usize {
        if let Some(&at) = batch.savepoints.get(key) {
            return at;
        }
        let ps = match self.state.partitions.get(key) {
            Some(ps) => ps,
            None => {
                batch.undo.push(Undo::NewPartition(key.clone()));
                self.state.partitions.entry(key.clone()).or_default()
            }
        };
        let at = batch.undo.len();
        batch.undo.push(Undo::Partition(
            key.clone(),
            Box::new(Savepoint::new(&ps.partition)),
        ));
        batch.savepoints.insert(key.clone(), at);
        at
    }

    /// Applies decided events through the partition's savepoint and queues
    /// their record. Returns the record's index.
    pub(super) fn commit_speculatively(
        &mut self,
        batch: &mut Batch,
        key: &PartitionKey,
        events: Vec<reservoir_core::Event>,
    ) -> usize {
        let at = self.touch(batch, key);
        let Undo::Partition(_, savepoint) = &mut batch.undo[at] else {
            unreachable!("savepoints index partition undo entries");
        };
        let ps = self.state.partitions.get_mut(key).expect("touched");
        let mut evicted = Vec::new();
        for event in &events {
            evicted.extend(savepoint.apply(&mut ps.partition, event));
        }
        for record in evicted {
            batch.undo.push(Undo::Retiring(record.id.clone()));
            batch.evicted.push(record.id.clone());
            self.retiring
                .insert(record.id.clone(), (key.clone(), record));
        }
        let index = batch.records.len();
        for e in &events {
            if let (Some(id), false) = (
                e.body.reservation_id(),
                matches!(e.body, EventBody::AdmissionRefused { .. }),
            ) {
                batch.pending_positions.insert(id.clone(), index);
            }
        }
        let log_partition = (self.log_partition_for)(key) as usize;
        batch.records.push(Record {
            key: key.clone(),
            writer_id: self.writer_id.clone(),
            claim_epoch: self.claim_epochs.get(log_partition).copied().unwrap_or(0),
            events,
        });
        index
    }

    /// Where the last event of reservation `id` is (or will be) in the log.
    pub(super) fn position_of(
        &self,
        batch: &Batch,
        key: &PartitionKey,
        id: &ReservationId,
    ) -> Option<PositionFrom> {
        if let Some(i) = batch.pending_positions.get(id) {
            return Some(PositionFrom::Record(*i));
        }
        if let Some(&(batch, record)) = self.in_flight_positions.get(id) {
            return Some(PositionFrom::Earlier { batch, record });
        }
        self.state
            .partitions
            .get(key)?
            .positions
            .get(id)
            .map(|p| PositionFrom::Known(*p))
    }
}
