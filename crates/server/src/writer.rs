//! The writer: the only code that decides commands and appends to the log.
//!
//! Ledger partitions are spread over a fixed number of *shards* by a hash of
//! (subject, route), so every generation and epoch of one subject/route lives in
//! one shard, and each shard is one task: a partition is decided by exactly one
//! task at a time, with no locks around the core.
//!
//! A shard task loops: take every queued request (up to the batch limit), decide
//! each against the in-memory state *speculatively applying* its events so later
//! commands in the batch see earlier ones, check conservation on every touched
//! partition, append all records with one `EventLog::append` (group commit), and
//! only then reply. If the append fails, the batch's effects are undone from an
//! undo log of pre-images (partition scalars and reservation records, taken at
//! first touch) and every request of the batch gets a retryable 503: the clients
//! retry with the same ids, which is safe because reserve is idempotent.
//!
//! `now` is the writer's: the wall clock, made monotonic per partition
//! (`max(last event time, clock)`), and recorded in the events.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use reservoir_core::{
    apply, decide, refusal_event, CapacityUnit, Command, EventBody, Partition, PartitionKey,
    Policy, Rejection, RequestDigest, Reservation, ReservationId, ReservationState, TimestampMs,
    Units,
};
use reservoir_log::{EventLog, Position, Record};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::telemetry;

/// Requests waiting for one shard. Beyond this a caller gets 503 at once rather
/// than queueing without bound.
pub const MAX_QUEUED_REQUESTS_PER_SHARD: usize = 16_384;

/// Longest a request waits for its batch to be decided and appended.
pub const MAX_WAIT_FOR_COMMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Global reservation id → the partition that holds it (ids are unique across
/// the server). Written only by shard tasks, speculatively during a batch.
pub type Index = Arc<RwLock<HashMap<ReservationId, PartitionKey>>>;

/// Which shard owns a subject/route. Stable for the process only (it is never stored).
pub fn shard_of(subject: &str, route: &str, shards: usize) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    subject.hash(&mut h);
    route.hash(&mut h);
    (h.finish() % shards as u64) as usize
}

/// Where a record was committed, as answered to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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

/// The receipt of a reservation: its record, its partition, and the log position
/// of the last event that changed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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

/// The sizing rule that produced a reservation's units, as recorded in its
/// `Reserved` event: `units = input_units + output_units`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
            reservoir_core::SizingRule::MaxTokens => "max_tokens",
            reservoir_core::SizingRule::RouteDefaultMaxTokens => "route_default_max_tokens",
            reservoir_core::SizingRule::RouteQuantile => "route_quantile",
            reservoir_core::SizingRule::SiblingQuantile => "sibling_quantile",
            reservoir_core::SizingRule::ColdCeiling => "cold_ceiling",
        };
        SizingReceipt {
            rule: rule.to_string(),
            units: s.units,
            input_units: s.input_units,
            output_units: s.output_units,
        }
    }
}

/// One partition's conservation terms, for operators and tests (`GET /v1/partitions`).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
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

/// What an API handler or a sweeper asks of a shard.
#[derive(Debug)]
pub enum Request {
    Publish {
        key: PartitionKey,
        policy: Policy,
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
        units: Units,
        /// How the server sized `units` (recorded in the `Reserved` event).
        sizing: Option<reservoir_core::Sizing>,
    },
    /// Start, Settle, Release, and the sweepers' Expire, MarkUsageUnknown, Refill.
    Act {
        key: PartitionKey,
        command: Command,
    },
    Get {
        key: PartitionKey,
        id: ReservationId,
    },
    Partitions,
    /// A copy of the shard's state, for a snapshot (between two batches).
    Snapshot,
    /// Sweeper: the commands due at `now_ms` (leases past, execution limits past, refills).
    CollectDue {
        now_ms: TimestampMs,
        refill: bool,
    },
}

#[derive(Debug)]
pub enum Answer {
    Receipt {
        receipt: Box<Receipt>,
        created: bool,
    },
    Published {
        key: PartitionKey,
        created: bool,
        log_position: Option<LogPosition>,
    },
    Policy {
        key: PartitionKey,
        policy: Box<Policy>,
    },
    Partitions(Vec<PartitionView>),
    Snapshot(Box<ShardSnapshot>),
    Due(Vec<(PartitionKey, Command)>),
    /// A command with no receipt (a sweeper's Refill).
    Done,
}

/// Why a request failed.
#[derive(Debug)]
pub enum Failure {
    /// The domain refused; `policy` names the partition's policy when one matched.
    Rejected {
        rejection: Rejection,
        policy_generation: Option<u64>,
        capacity_unit: Option<CapacityUnit>,
    },
    /// No active policy for the subject/route.
    NoPolicy,
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
    senders: Arc<Vec<mpsc::Sender<Envelope>>>,
    pub index: Index,
}

impl Writers {
    pub fn shards(&self) -> usize {
        self.senders.len()
    }

    pub fn shard_of_key(&self, key: &PartitionKey) -> usize {
        shard_of(&key.subject, &key.route, self.shards())
    }

    /// The partition holding reservation `id`, if any.
    pub fn locate(&self, id: &ReservationId) -> Option<PartitionKey> {
        self.index.read().expect("index lock").get(id).cloned()
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

/// One shard's part of a snapshot.
#[derive(Debug)]
pub struct ShardSnapshot {
    pub partitions: Vec<crate::snapshot::SnapPartition>,
    pub active: Vec<(String, String, PartitionKey)>,
}

/// Kinds of due work the sweeper looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DueKind {
    LeaseExpiry,
    ExecutionLimit,
}

/// One ledger partition as the writer holds it.
#[derive(Clone, Debug, Default)]
pub struct PartitionState {
    pub partition: Partition,
    /// Position of the last committed event of each reservation.
    pub positions: HashMap<ReservationId, Position>,
    /// Position of the record that opened the partition.
    pub opened_at: Option<Position>,
}

/// State of one shard: its partitions and the bookkeeping around them.
#[derive(Default)]
pub struct ShardState {
    pub partitions: HashMap<PartitionKey, PartitionState>,
    /// Active partition for each (subject, route): the last one published.
    pub active: HashMap<(String, String), PartitionKey>,
    /// (due at, kind, partition, reservation); entries are checked lazily when due.
    pub due: BTreeSet<(TimestampMs, DueKind, PartitionKey, ReservationId)>,
}

impl ShardState {
    /// Records what a committed event means for the sweepers and the index.
    pub fn note_committed(&mut self, key: &PartitionKey, body: &EventBody, position: Position) {
        if let Some(id) = body.reservation_id() {
            if !matches!(body, EventBody::AdmissionRefused { .. }) {
                if let Some(ps) = self.partitions.get_mut(key) {
                    ps.positions.insert(id.clone(), position);
                }
            }
        }
        match body {
            EventBody::Reserved {
                id, expires_at_ms, ..
            } => {
                self.due.insert((
                    *expires_at_ms,
                    DueKind::LeaseExpiry,
                    key.clone(),
                    id.clone(),
                ));
            }
            EventBody::Started {
                id,
                execution_deadline_ms,
                ..
            } => {
                self.due.insert((
                    *execution_deadline_ms,
                    DueKind::ExecutionLimit,
                    key.clone(),
                    id.clone(),
                ));
            }
            EventBody::PartitionOpened { key: k, .. } => {
                if let Some(ps) = self.partitions.get_mut(k) {
                    ps.opened_at = Some(position);
                }
                self.active
                    .insert((k.subject.clone(), k.route.clone()), k.clone());
            }
            _ => {}
        }
    }
}

/// Wall clock in ms since the epoch.
pub fn clock_ms() -> TimestampMs {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Builds the receipt of a reservation from its partition and record.
pub fn receipt(key: &PartitionKey, r: &Reservation, position: Position) -> Receipt {
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

fn view(key: &PartitionKey, ps: &PartitionState) -> PartitionView {
    let p = &ps.partition;
    let l = &p.ledger;
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
        reservations: p.reservations.len() as u64,
        refusals: p.refusals,
        conservation: match p.check_invariants() {
            Ok(()) => "ok".to_string(),
            Err(e) => e.to_string(),
        },
    }
}

/// Pre-images taken at first touch within a batch, replayed backwards on failure.
enum Undo {
    /// The partition did not exist before the batch.
    NewPartition(PartitionKey),
    /// Partition scalars (its reservation map left out, see `shell`).
    Partition(PartitionKey, Box<Partition>),
    Reservation(PartitionKey, ReservationId, Option<Box<Reservation>>),
    Active((String, String), Option<PartitionKey>),
    Index(ReservationId),
}

/// Where a reply's log position comes from once the batch is durable.
#[derive(Clone, Copy)]
enum PositionFrom {
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
    Box<
        dyn std::future::Future<Output = Result<Vec<Position>, reservoir_log::LogError>>
            + Send
            + 'a,
    >,
>;

/// A decided batch whose append has been handed to the log.
struct InFlight<'a> {
    /// Sequence number of the batch in its shard (see `PositionFrom::Earlier`).
    seq: u64,
    records: Vec<Record>,
    undo: Vec<Undo>,
    pendings: Vec<(oneshot::Sender<Reply>, Pending)>,
    /// `None`: nothing to append (reads, idempotent repeats); answered in order.
    append: Option<AppendFuture<'a>>,
    result: Option<Result<Vec<Position>, reservoir_log::LogError>>,
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
enum Pending {
    Ready(Reply),
    Receipt {
        receipt: Box<Receipt>,
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

#[derive(Default)]
struct Batch {
    records: Vec<Record>,
    undo: Vec<Undo>,
    touched_partitions: Vec<PartitionKey>,
    touched_reservations: std::collections::HashSet<(PartitionKey, ReservationId)>,
    /// Reservations whose latest event is in this batch → its record.
    pending_positions: HashMap<ReservationId, usize>,
}

/// A copy of a partition without its reservation map (which can be large).
fn shell(p: &mut Partition) -> Partition {
    let reservations = std::mem::take(&mut p.reservations);
    let copy = p.clone();
    p.reservations = reservations;
    copy
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
    /// `pending_positions` of the batches in flight, newest winning: id →
    /// (batch sequence number, record) (see `PositionFrom::Earlier`).
    in_flight_positions: HashMap<ReservationId, (u64, usize)>,
    /// Sequence number of the next batch.
    next_batch_seq: u64,
}

/// Batches one shard keeps in flight on a log with ordered appends. One is
/// not enough: a request that arrives while the shard waits for batch N would
/// wait for N to land before being decided, then for its own write; with
/// several, it is decided at once and joins the log's next group commit.
pub const MAX_BATCHES_IN_FLIGHT: usize = 8;

impl Shard {
    /// The task body: batches until every sender is gone, then returns its state.
    /// On `stop`, the queue is closed and what is already in it is still decided
    /// and appended: the batch in flight always finishes.
    ///
    /// On a log with [`EventLog::ordered_appends`] the shard pipelines: while
    /// batch N's append is in flight it decides batch N+1 on top of N's
    /// speculative state and hands it to the log at once (so it joins the next
    /// synced write), and so on up to [`MAX_BATCHES_IN_FLIGHT`] batches.
    /// Replies still go out only after each batch's own append is
    /// acknowledged, and N's before N+1's. If N fails, every batch after it
    /// (appended after it, so refused by the log too) is undone, newest first,
    /// then N, and all of them answer 503.
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
            let envelopes = std::mem::take(&mut buffer);
            // A snapshot copies committed state only: let the batches in flight land first.
            let barrier = envelopes
                .iter()
                .any(|e| matches!(e.request, Request::Snapshot));
            if barrier {
                self.complete_all(&mut in_flight).await;
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
            match next {
                Some(flight) if pipelined => in_flight.push_back(flight),
                Some(flight) => {
                    self.complete_all(&mut in_flight).await;
                    self.complete(flight, &mut in_flight).await;
                }
                None => {}
            }
        }
    }

    /// Completes every batch in flight, oldest first.
    async fn complete_all(&mut self, in_flight: &mut VecDeque<InFlight<'_>>) {
        while let Some(flight) = in_flight.pop_front() {
            self.complete(flight, in_flight).await;
        }
    }

    /// Decides a batch against the (possibly speculative) state, checks
    /// conservation and hands the records to the log (`None`: do not append,
    /// the batch before failed). Returns `None` when the batch was refused
    /// (already answered, effects undone).
    fn begin<'a, L: EventLog>(
        &mut self,
        log: Option<&'a L>,
        envelopes: Vec<Envelope>,
    ) -> Option<InFlight<'a>> {
        let mut batch = Batch::default();
        let mut pendings = Vec::with_capacity(envelopes.len());
        for Envelope { request, reply } in envelopes {
            let pending = self.decide_one(&mut batch, request);
            pendings.push((reply, pending));
        }
        metrics::histogram!("reservoir_batch_commands").record(pendings.len() as f64);

        // The writer refuses to append a batch that breaks conservation.
        for key in &batch.touched_partitions {
            if let Some(ps) = self.state.partitions.get(key) {
                if let Err(err) = ps.partition.ledger.check() {
                    tracing::error!(shard = self.id, partition = %key, %err, "conservation broken; batch not appended");
                    metrics::counter!("reservoir_invariant_violations_total").increment(1);
                    self.restore(batch.undo);
                    for (reply, _) in pendings {
                        let _ = reply.send(Err(Failure::Internal(format!(
                            "conservation check failed: {err}"
                        ))));
                    }
                    return None;
                }
            }
        }
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
                None => Some(Box::pin(std::future::ready(Err(
                    reservoir_log::LogError::Unavailable(
                        "not appended: the batch before it failed".into(),
                    ),
                )))),
            }
        };
        Some(InFlight {
            seq,
            records: batch.records,
            undo: batch.undo,
            pendings,
            append,
            result: None,
            started: Instant::now(),
        })
    }

    /// Waits for a batch's append and answers it. On failure, `next` (decided on
    /// top of it and appended after it) fails too: both are undone, newest first.
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

        for (record, position) in flight.records.iter().zip(&positions) {
            for event in &record.events {
                self.state
                    .note_committed(&record.key, &event.body, *position);
                telemetry::record_event(
                    &record.key,
                    &event.body,
                    self.state.partitions.get(&record.key),
                );
            }
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
                Pending::Receipt {
                    mut receipt,
                    created,
                    position,
                } => {
                    receipt.log_position = resolve(position).into();
                    Ok(Answer::Receipt { receipt, created })
                }
                Pending::Published {
                    key,
                    created,
                    position,
                } => Ok(Answer::Published {
                    key,
                    created,
                    log_position: position.map(|p| resolve(p).into()),
                }),
            };
            let _ = reply.send(answer);
        }
        // Later batches that named this one's records learn their positions.
        for later in later.iter_mut() {
            for (_, pending) in later.pendings.iter_mut() {
                let position = match pending {
                    Pending::Receipt { position, .. } => Some(position),
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

    /// After a failed append: a log that cannot say what reached the disk
    /// (embedded: any failed synced write) or that fenced us cannot be written
    /// again by this process: report it, so the server stops and restarts from
    /// the log. A log partition in doubt (or an ordered log, which refuses
    /// every append after a failed one) is re-claimed and rebuilt in process.
    fn report_failure(&self, err: &reservoir_log::LogError) {
        use reservoir_log::LogError;
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
                Undo::Partition(key, before) => {
                    let ps = self
                        .state
                        .partitions
                        .get_mut(&key)
                        .expect("touched partition exists");
                    let reservations = std::mem::take(&mut ps.partition.reservations);
                    ps.partition = *before;
                    ps.partition.reservations = reservations;
                }
                Undo::Reservation(key, id, before) => {
                    let ps = self
                        .state
                        .partitions
                        .get_mut(&key)
                        .expect("touched partition exists");
                    match before {
                        Some(r) => ps.partition.reservations.insert(id, *r),
                        None => ps.partition.reservations.remove(&id),
                    };
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
            }
        }
    }

    /// Takes the pre-images a command's events need before they are applied.
    fn touch(&mut self, batch: &mut Batch, key: &PartitionKey, id: Option<&ReservationId>) {
        if !batch.touched_partitions.contains(key) {
            batch.touched_partitions.push(key.clone());
            match self.state.partitions.get_mut(key) {
                Some(ps) => batch.undo.push(Undo::Partition(
                    key.clone(),
                    Box::new(shell(&mut ps.partition)),
                )),
                None => {
                    batch.undo.push(Undo::NewPartition(key.clone()));
                    self.state
                        .partitions
                        .insert(key.clone(), PartitionState::default());
                }
            }
        }
        if let Some(id) = id {
            if batch.touched_reservations.insert((key.clone(), id.clone())) {
                let before = self.state.partitions[key]
                    .partition
                    .reservations
                    .get(id)
                    .cloned()
                    .map(Box::new);
                batch
                    .undo
                    .push(Undo::Reservation(key.clone(), id.clone(), before));
            }
        }
    }

    /// Applies decided events and queues their record. Returns the record's index.
    fn commit_speculatively(
        &mut self,
        batch: &mut Batch,
        key: &PartitionKey,
        events: Vec<reservoir_core::Event>,
    ) -> usize {
        let ids: Vec<ReservationId> = events
            .iter()
            .filter_map(|e| e.body.reservation_id().cloned())
            .collect();
        self.touch(batch, key, None);
        for id in &ids {
            self.touch(batch, key, Some(id));
        }
        let ps = self.state.partitions.get_mut(key).expect("touched");
        for event in &events {
            apply(&mut ps.partition, event);
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

    fn position_of(
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

    fn rejected(&self, key: &PartitionKey, rejection: Rejection) -> Failure {
        let policy = self
            .state
            .partitions
            .get(key)
            .and_then(|ps| ps.partition.policy.as_ref());
        Failure::Rejected {
            rejection,
            policy_generation: policy.map(|p| p.generation),
            capacity_unit: policy.map(|p| p.capacity_unit),
        }
    }

    fn now_for(&self, key: &PartitionKey) -> TimestampMs {
        let last = self
            .state
            .partitions
            .get(key)
            .map(|ps| ps.partition.last_at_ms)
            .unwrap_or(0);
        clock_ms().max(last)
    }

    fn decide_one(&mut self, batch: &mut Batch, request: Request) -> Pending {
        match request {
            Request::Publish { key, policy } => self.publish(batch, key, policy),
            Request::GetPolicy { subject, route } => {
                Pending::Ready(match self.state.active.get(&(subject, route)) {
                    Some(key) => match self
                        .state
                        .partitions
                        .get(key)
                        .and_then(|ps| ps.partition.policy.clone())
                    {
                        Some(policy) => Ok(Answer::Policy {
                            key: key.clone(),
                            policy: Box::new(policy),
                        }),
                        None => Err(Failure::NoPolicy),
                    },
                    None => Err(Failure::NoPolicy),
                })
            }
            Request::Reserve {
                subject,
                route,
                id,
                digest,
                units,
                sizing,
            } => {
                let located = self.index.read().expect("index lock").get(&id).cloned();
                let key = match located {
                    Some(key) => key,
                    None => match self.state.active.get(&(subject.clone(), route.clone())) {
                        Some(key) => key.clone(),
                        None => return Pending::Ready(Err(Failure::NoPolicy)),
                    },
                };
                if shard_of(&key.subject, &key.route, self.shards) != self.id {
                    // The id is held by another subject/route: the digests cannot match.
                    return Pending::Ready(Err(
                        self.rejected(&key, Rejection::ExistsWithDifferentDigest { id })
                    ));
                }
                self.act(
                    batch,
                    key,
                    Command::Reserve {
                        id,
                        digest,
                        units,
                        sizing,
                    },
                )
            }
            Request::Act { key, command } => self.act(batch, key, command),
            Request::Get { key, id } => self.get(batch, &key, &id),
            Request::Snapshot => {
                let (partitions, active) = crate::snapshot::capture(&self.state);
                Pending::Ready(Ok(Answer::Snapshot(Box::new(ShardSnapshot {
                    partitions,
                    active,
                }))))
            }
            Request::Partitions => Pending::Ready(Ok(Answer::Partitions(
                self.state
                    .partitions
                    .iter()
                    .map(|(k, ps)| view(k, ps))
                    .collect(),
            ))),
            Request::CollectDue { now_ms, refill } => {
                Pending::Ready(Ok(Answer::Due(self.collect_due(now_ms, refill))))
            }
        }
    }

    fn get(&self, batch: &Batch, key: &PartitionKey, id: &ReservationId) -> Pending {
        let ps = self.state.partitions.get(key);
        let record = ps.and_then(|ps| ps.partition.reservation(id));
        match (record, self.position_of(batch, key, id)) {
            (Some(r), Some(PositionFrom::Known(p))) => Pending::Ready(Ok(Answer::Receipt {
                receipt: Box::new(receipt(key, r, p)),
                created: false,
            })),
            // Changed by the batch in flight: answered after it lands (or 503 with it).
            (Some(r), Some(position @ PositionFrom::Earlier { .. })) => Pending::Receipt {
                receipt: Box::new(receipt(
                    key,
                    r,
                    Position {
                        log_partition: 0,
                        offset: 0,
                    },
                )),
                created: false,
                position,
            },
            // Not yet durable (decided in this very batch) or unknown.
            _ => Pending::Ready(Err(
                self.rejected(key, Rejection::UnknownReservation { id: id.clone() })
            )),
        }
    }

    fn publish(&mut self, batch: &mut Batch, key: PartitionKey, policy: Policy) -> Pending {
        let now = self.now_for(&key);
        let current = self.state.partitions.get(&key).map(|ps| &ps.partition);
        let empty = Partition::default();
        let command = Command::OpenPartition {
            key: key.clone(),
            policy,
        };
        match decide(current.unwrap_or(&empty), &command, now) {
            Ok(events) if events.is_empty() => {
                let position = self
                    .state
                    .partitions
                    .get(&key)
                    .and_then(|ps| ps.opened_at)
                    .map(PositionFrom::Known);
                Pending::Published {
                    key,
                    created: false,
                    position,
                }
            }
            Ok(events) => {
                let sr = (key.subject.clone(), key.route.clone());
                let previous = self.state.active.get(&sr).cloned();
                let record = self.commit_speculatively(batch, &key, events);
                batch.undo.push(Undo::Active(sr.clone(), previous.clone()));
                self.state.active.insert(sr, key.clone());
                // The superseded generation stops admitting; its reservations still finish.
                if let Some(old) = previous.filter(|old| *old != key) {
                    let old_now = self.now_for(&old);
                    let old_partition = &self.state.partitions[&old].partition;
                    if let Ok(events) = decide(old_partition, &Command::Close, old_now) {
                        if !events.is_empty() {
                            self.commit_speculatively(batch, &old, events);
                        }
                    }
                }
                Pending::Published {
                    key,
                    created: true,
                    position: Some(PositionFrom::Record(record)),
                }
            }
            Err(rejection) => Pending::Ready(Err(Failure::Rejected {
                rejection,
                policy_generation: Some(key.policy_generation),
                capacity_unit: None,
            })),
        }
    }

    fn act(&mut self, batch: &mut Batch, key: PartitionKey, command: Command) -> Pending {
        let Some(ps) = self.state.partitions.get(&key) else {
            return Pending::Ready(Err(Failure::NoPolicy));
        };
        let now = clock_ms().max(ps.partition.last_at_ms);
        match decide(&ps.partition, &command, now) {
            Ok(events) => {
                let created = events
                    .iter()
                    .any(|e| matches!(e.body, EventBody::Reserved { .. }));
                if created {
                    let id = command
                        .reservation_id()
                        .expect("reserve names an id")
                        .clone();
                    let mut index = self.index.write().expect("index lock");
                    match index.get(&id) {
                        Some(other) if *other != key => {
                            // Another shard took this id for another subject/route meanwhile.
                            drop(index);
                            return Pending::Ready(Err(
                                self.rejected(&key, Rejection::ExistsWithDifferentDigest { id })
                            ));
                        }
                        Some(_) => {}
                        None => {
                            index.insert(id.clone(), key.clone());
                            batch.undo.push(Undo::Index(id));
                        }
                    }
                }
                let record = if events.is_empty() {
                    None
                } else {
                    Some(self.commit_speculatively(batch, &key, events))
                };
                let Some(id) = command.reservation_id() else {
                    return Pending::Ready(Ok(Answer::Done));
                };
                let ps = &self.state.partitions[&key];
                let Some(r) = ps.partition.reservation(id) else {
                    return Pending::Ready(Err(
                        self.rejected(&key, Rejection::UnknownReservation { id: id.clone() })
                    ));
                };
                let position = match record {
                    Some(i) => PositionFrom::Record(i),
                    None => match self.position_of(batch, &key, id) {
                        Some(p) => p,
                        None => {
                            return Pending::Ready(Err(Failure::Internal(format!(
                                "no log position for {id}"
                            ))))
                        }
                    },
                };
                let placeholder = Position {
                    log_partition: 0,
                    offset: 0,
                };
                Pending::Receipt {
                    receipt: Box::new(receipt(&key, r, placeholder)),
                    created,
                    position,
                }
            }
            Err(rejection) => {
                let refusal = refusal_event(&ps.partition, &command, &rejection, now);
                let failure = self.rejected(&key, rejection);
                match refusal {
                    Some(event) => {
                        self.commit_speculatively(batch, &key, vec![event]);
                        Pending::Refused(failure)
                    }
                    None => Pending::Ready(Err(failure)),
                }
            }
        }
    }

    /// Commands the sweeper should send now. Entries whose reservation moved on
    /// are dropped; the core re-checks every one (NotYetDue, WrongState) anyway.
    fn collect_due(&mut self, now_ms: TimestampMs, refill: bool) -> Vec<(PartitionKey, Command)> {
        /// Commands one sweep sends per shard; the rest wait for the next sweep.
        const MAX_DUE_PER_SWEEP: usize = 4_096;
        // Entries stay until the reservation has moved on, so a command lost to a
        // failed append is simply sent again by the next sweep.
        let mut out = Vec::new();
        let mut stale = Vec::new();
        for entry in self.state.due.iter() {
            let (due_at, kind, key, id) = entry;
            if *due_at > now_ms || out.len() >= MAX_DUE_PER_SWEEP {
                break;
            }
            let state = self
                .state
                .partitions
                .get(key)
                .and_then(|ps| ps.partition.reservation(id))
                .map(|r| r.state);
            match (kind, state) {
                (
                    DueKind::LeaseExpiry,
                    Some(ReservationState::Reserved | ReservationState::Expiring),
                ) => {
                    out.push((key.clone(), Command::Expire { id: id.clone() }));
                }
                (DueKind::ExecutionLimit, Some(ReservationState::Started)) => {
                    out.push((key.clone(), Command::MarkUsageUnknown { id: id.clone() }));
                }
                _ => stale.push(entry.clone()),
            }
        }
        for entry in stale {
            self.state.due.remove(&entry);
        }
        if refill {
            for (key, ps) in &self.state.partitions {
                let p = &ps.partition;
                let Some(policy) = &p.policy else { continue };
                let l = &p.ledger;
                let below_burst =
                    l.available_units.saturating_add(l.reserved_units) < policy.burst_units;
                if p.debt_units() > 0 || (below_burst && !p.closed) {
                    out.push((key.clone(), Command::Refill));
                }
            }
        }
        out
    }
}

/// Everything the shard tasks start from.
pub struct WriterSetup<L> {
    pub log: Arc<L>,
    /// One recovered state per shard.
    pub states: Vec<ShardState>,
    pub index: Index,
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
}

/// Starts one task per shard and returns the handle to them.
pub fn spawn<L: EventLog>(
    setup: WriterSetup<L>,
) -> (Writers, Vec<tokio::task::JoinHandle<ShardState>>) {
    let WriterSetup {
        log,
        states,
        index,
        writer_id,
        claim_epochs,
        max_batch_commands,
        stop,
        fatal,
        in_doubt,
    } = setup;
    let fatal = Arc::new(fatal);
    let in_doubt = Arc::new(in_doubt.unwrap_or_else(|| tokio::sync::watch::channel(None).0));
    let ordered = log.ordered_appends();
    let shards = states.len();
    let claim_epochs = Arc::new(claim_epochs);
    let partition_log = log.clone();
    let log_partition_for: Arc<dyn Fn(&PartitionKey) -> u32 + Send + Sync> =
        Arc::new(move |key| partition_log.log_partition_for(key));
    let mut senders = Vec::with_capacity(shards);
    let mut handles = Vec::with_capacity(shards);
    for (id, state) in states.into_iter().enumerate() {
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
            in_flight_positions: HashMap::new(),
            next_batch_seq: 0,
        };
        handles.push(tokio::spawn(shard.run(log.clone(), rx, stop.clone())));
    }
    (
        Writers {
            senders: Arc::new(senders),
            index,
        },
        handles,
    )
}
