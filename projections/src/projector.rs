//! The projector: reads every log partition through the fence rule, folds the
//! records that count into the read models, and commits each step's changes
//! *and* the log positions (with the claim needed to resume the fence) in one
//! RocksDB `WriteBatch`.
//!
//! Crash safety comes from that single batch: after a crash the database holds
//! either everything a step derived together with the positions it consumed, or
//! none of it, so restarting from the stored positions applies each event
//! exactly once. By default the batch skips RocksDB's write-ahead log: the
//! event log is the projection's write-ahead log. The column families are
//! flushed atomically ([`store::open`] sets `atomic_flush`), so what reaches
//! the disk is always a prefix of whole steps with the positions they
//! consumed; a crash loses the steps since the last flush, and the restarted
//! projector derives them again from the log (a clean stop flushes, see
//! [`store::flush`]). With [`ProjectorConfig::sync_writes`] each batch is
//! written through the WAL and synced instead, and a restart loses nothing.
//! (Skipping the WAL cut the projector's commit cost roughly in half under
//! `scripts/bench-http`; Kafka Streams keeps its RocksDB stores the same way,
//! recovering from the changelog topic.)
//!
//! Balances are computed by `reservoir_core::try_apply` on an in-memory
//! `Partition` per ledger partition — the writer's own code — and that
//! `Partition` is persisted beside the derived rows, so a restart resumes
//! without replaying from offset 0. An event `try_apply` refuses becomes a
//! [`Finding`] and quarantines its partition; the projector does not crash.
//!
//! Anything that fails mid-step (a store write, the test hook) leaves the
//! in-memory state ahead of the database, so the projector refuses further work
//! ([`ProjectionError::Poisoned`]) and must be reopened, which reloads from the
//! committed state.
//!
//! Metrics (through the `metrics` facade): `reservoir_projection_lag_entries`
//! per log partition, `reservoir_projected_events_total`, and per route, from
//! its committed roll-up, `reservoir_debt_units` and
//! `reservoir_frozen_partitions` (partitions refusing admission while they owe
//! debt): published for every route on open and for each route a step changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reservoir_core::{
    try_apply_evicting, Event, EventBody, PartitionKey, Reservation, ReservationId, Usage,
};
use reservoir_log::fence::{valid_records, Validity};
use reservoir_log::{Claim, EventReader, LogEntry, Position, Record};
use rocksdb::{WriteBatch, WriteOptions, DB};
use tokio::sync::{watch, Notify};

use crate::model::{
    ClaimState, Cursor, EfficiencyHistogram, Finding, InputDrift, PartitionBalance,
    PartitionProjection, Refusal, ReservationRecord, Rollup, ShadowRecord,
};
use crate::sketch::RollingDigest;
use crate::store::{self, decode, encode, get, get_raw, scan_prefix, store_error};
use crate::{ProjectionError, Projections};

mod derive;
mod models;
mod moves;

use derive::apply_record;
use models::Models;
pub use models::{DIGESTS_CACHED_MAX, MODELS_CACHED_MAX};

/// The projector's in-memory maps: foldhash with a fixed seed, several
/// times cheaper than SipHash on these string keys, and the same in every
/// process. Nothing is written in their iteration order.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

/// How often a following projector publishes its lag (a look at the log's end
/// costs a broker round trip on Kafka).
pub const LAG_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct ProjectorConfig {
    /// Entries read per log partition per step (bounds one write batch). The
    /// default keeps a step's read buffer small: at 1,024 entries it was large
    /// enough for the allocator to hand out fresh (huge) pages on every step,
    /// and zeroing them was a third of the projector's time.
    pub read_entries_max: usize,
    /// Write each batch through RocksDB's WAL and sync it, so a restart after
    /// a crash resumes exactly where it stopped. Off by default: batches skip
    /// the WAL and a crash costs re-deriving the steps since the last
    /// (atomic) flush from the log (see the module docs).
    pub sync_writes: bool,
    /// How long an idle `run` waits for new entries before looking again.
    pub idle_wait: Duration,
    /// How long a following `run` lets entries accumulate after a step that
    /// drained the log, so the next step folds more of them into one batch: a
    /// reservation reserved, started and settled within the pause is written
    /// once instead of three times, and each touched partition head, digest
    /// and roll-up once per step. A query waiting for a position (`?min_position=`)
    /// cuts the pause short, so only unhurried readers see the extra lag.
    /// Measured under `scripts/bench-http` (64 clients): 0 ms ≈ 9.5k, 10 ms ≈
    /// 11.4k, 50 ms ≈ 12.2k cycles/s, the projector sharing two cores with
    /// the writer.
    pub linger: Duration,
    /// The retention rule for reservation records: a record of a reservation
    /// that finished longer than this before the newest event projected (log
    /// time, not the clock, so a rebuild prunes the same records) is deleted
    /// with its id index entry, at most [`PRUNED_PER_STEP`] a step, and
    /// [`store::PRUNED_BEFORE`] says before when every such record is gone. `None` (the default) keeps
    /// every record: about 600 bytes of disk a reservation (see
    /// bench-results/bounded-state.md). A pruned record is still in the log:
    /// `reservoir-replay state` answers from it. A record pruned while its
    /// partition still keeps it in memory (a partition gone idle inside the
    /// record's idempotency window) leaves that memory then, counted as
    /// evicted, so a projector restarted later holds what a rebuild holds.
    pub retention: Option<Duration>,
}

/// Records the retention rule deletes in one step at most (bounds one batch).
pub const PRUNED_PER_STEP: usize = 4_096;

impl Default for ProjectorConfig {
    fn default() -> Self {
        Self {
            read_entries_max: 256,
            sync_writes: false,
            idle_wait: Duration::from_millis(200),
            linger: Duration::from_millis(50),
            retention: None,
        }
    }
}

/// What one step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepOutcome {
    pub entries: usize,
    pub records: usize,
    pub events: usize,
}

struct LogCursor {
    next_offset: u64,
    validity: Validity,
}

pub struct Projector<L: EventReader> {
    log: Arc<L>,
    db: Arc<DB>,
    config: ProjectorConfig,
    cursors: Vec<LogCursor>,
    /// Every ledger partition touched since opening (committed state plus the
    /// step in progress).
    partitions: FastMap<PartitionKey, PartitionProjection>,
    /// Digests, histograms, drift and roll-ups, kept between steps.
    models: Models,
    positions: watch::Sender<Vec<u64>>,
    /// Signalled by queries waiting for a position: ends a linger at once.
    hurry: Arc<Notify>,
    poisoned: bool,
    commits: u64,
    fail_before_commit: Option<u64>,
    /// Newest event time projected since opening (the retention rule's "now").
    newest_at_ms: u64,
}

/// Rebuilds the fence state from the stored claim: `Validity` holds only the
/// current claim, and observing that claim from the default state restores it.
fn validity_from(claim: &Option<ClaimState>) -> Validity {
    let mut validity = Validity::default();
    if let Some(c) = claim {
        validity.observe(&LogEntry::Claim(Claim {
            writer_id: c.writer_id.clone(),
            epoch: c.epoch,
        }));
    }
    assert_eq!(
        validity
            .current_claim()
            .map(|c| (c.writer_id.as_str(), c.epoch)),
        claim.as_ref().map(|c| (c.writer_id.as_str(), c.epoch)),
        "fence state did not round-trip"
    );
    validity
}

impl<L: EventReader> Projector<L> {
    /// Opens the projector over `log`, resuming from the positions stored in `db`.
    pub fn open(
        log: Arc<L>,
        db: Arc<DB>,
        config: ProjectorConfig,
    ) -> Result<Self, ProjectionError> {
        let mut cursors = Vec::new();
        for lp in 0..log.log_partitions() {
            let cursor: Cursor =
                get(&*db, store::CURSORS, &store::cursor_key(lp))?.unwrap_or_default();
            cursors.push(LogCursor {
                next_offset: cursor.next_offset,
                validity: validity_from(&cursor.claim),
            });
        }
        let (positions, _) = watch::channel(cursors.iter().map(|c| c.next_offset).collect());
        for (route, value) in scan_prefix(&*db, store::ROUTE_BALANCES, "")? {
            let rollup: Rollup = decode(store::ROUTE_BALANCES, &route, &value)?;
            publish_route(&String::from_utf8_lossy(&route), &rollup);
        }
        Ok(Self {
            log,
            db,
            config,
            cursors,
            partitions: FastMap::default(),
            models: Models::default(),
            positions,
            hurry: Arc::new(Notify::new()),
            poisoned: false,
            commits: 0,
            fail_before_commit: None,
            newest_at_ms: 0,
        })
    }

    /// The query side over this projector's database, following its progress.
    pub fn projections(&self) -> Projections {
        Projections::new(
            self.db.clone(),
            self.positions.subscribe(),
            self.hurry.clone(),
        )
    }

    /// Next offset to consume, per log partition.
    pub fn positions(&self) -> Vec<u64> {
        self.cursors.iter().map(|c| c.next_offset).collect()
    }

    /// Test hook: the `n`-th commit from now (1 = the next) derives its whole
    /// batch and then fails instead of writing it, as a crash between apply and
    /// commit would. The projector is poisoned afterwards.
    pub fn fail_before_commit(&mut self, n: u64) {
        self.fail_before_commit = Some(self.commits + n);
    }

    /// Reads at most `read_entries_max` entries from each log partition and
    /// commits what they change in one batch.
    pub async fn step(&mut self) -> Result<StepOutcome, ProjectionError> {
        self.step_until(None).await
    }

    /// A step toward `ends` (one offset per log partition): partitions
    /// already consumed that far are not read (an empty read can cost a
    /// broker round trip), so a rebuild does not pay for the partitions it
    /// has finished while it reads the rest.
    pub async fn step_toward(&mut self, ends: &[u64]) -> Result<StepOutcome, ProjectionError> {
        self.step_until(Some(ends)).await
    }

    /// A step that skips log partitions already consumed up to `ends` (an
    /// empty read can cost a broker round trip).
    async fn step_until(&mut self, ends: Option<&[u64]>) -> Result<StepOutcome, ProjectionError> {
        if self.poisoned {
            return Err(ProjectionError::Poisoned);
        }
        // All I/O on the log first: a failed read leaves nothing half-applied.
        let mut read = Vec::with_capacity(self.cursors.len());
        for (lp, cursor) in self.cursors.iter().enumerate() {
            if ends.is_some_and(|ends| cursor.next_offset >= ends[lp]) {
                read.push(Vec::new());
                continue;
            }
            let entries = self
                .log
                .read(lp as u32, cursor.next_offset, self.config.read_entries_max)
                .await?;
            read.push(entries);
        }
        let mut outcome = StepOutcome::default();
        if read.iter().all(Vec::is_empty) {
            return Ok(outcome);
        }
        self.poisoned = true;
        let db = self.db.clone();
        let mut work = Work {
            models: std::mem::take(&mut self.models),
            ..Work::default()
        };
        for (lp, entries) in read.into_iter().enumerate() {
            let Some((last, _)) = entries.last() else {
                continue;
            };
            let cursor = &mut self.cursors[lp];
            assert!(
                entries[0].0.offset >= cursor.next_offset,
                "log returned entries before the requested offset"
            );
            cursor.next_offset = last.offset + 1;
            outcome.entries += entries.len();
            for (position, record) in valid_records(&mut cursor.validity, entries) {
                outcome.records += 1;
                outcome.events += record.events.len();
                let proj = load_partition(&db, &mut self.partitions, &record.key)?;
                apply_record(&db, &mut work, proj, position, &record)?;
                if let Some(last) = record.events.last() {
                    self.newest_at_ms = self.newest_at_ms.max(last.at_ms);
                }
            }
            let stored = Cursor {
                next_offset: cursor.next_offset,
                claim: cursor.validity.current_claim().map(|c| ClaimState {
                    writer_id: c.writer_id.clone(),
                    epoch: c.epoch,
                }),
            };
            work.put(
                store::CURSORS,
                store::cursor_key(lp as u32),
                encode(&stored),
            );
        }
        work.finish(&db, &mut self.partitions)?;
        if let Some(retention) = self.config.retention {
            let keep_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
            let pruned = prune(&db, &mut work, self.newest_at_ms.saturating_sub(keep_ms))?;
            work.forget_pruned(&db, &mut self.partitions, &pruned)?;
        }
        let routes = std::mem::take(&mut work.routes);
        // Back before the commit: on a failure the projector is poisoned
        // and reopened with empty models.
        self.models = std::mem::take(&mut work.models);
        self.commit(work)?;
        self.models.bound();
        for (route, rollup) in &routes {
            publish_route(route, rollup);
        }
        self.poisoned = false;
        let _ = self.positions.send(self.positions());
        Ok(outcome)
    }

    fn commit(&mut self, work: Work) -> Result<(), ProjectionError> {
        let mut batch = WriteBatch::default();
        for ((cf, key), value) in &work.puts {
            let handle = self
                .db
                .cf_handle(cf)
                .ok_or_else(|| store_error(format!("missing column family {cf}")))?;
            batch.put_cf(handle, key.as_bytes(), value);
        }
        for (cf, key) in &work.deletes {
            let handle = self
                .db
                .cf_handle(cf)
                .ok_or_else(|| store_error(format!("missing column family {cf}")))?;
            batch.delete_cf(handle, key.as_bytes());
        }
        self.commits += 1;
        if self.fail_before_commit == Some(self.commits) {
            return Err(ProjectionError::InjectedCrash);
        }
        let mut options = WriteOptions::default();
        options.set_sync(self.config.sync_writes);
        // Without `sync` the write-ahead log buys nothing the log cannot give
        // back (see the module docs): the batch goes to the memtables only.
        options.disable_wal(!self.config.sync_writes);
        self.db.write_opt(batch, &options).map_err(store_error)
    }

    /// Steps until every log partition is consumed up to its end offset as it
    /// was when called. Returns the events applied.
    pub async fn catch_up(&mut self) -> Result<u64, ProjectionError> {
        let mut ends = Vec::new();
        for lp in 0..self.cursors.len() {
            ends.push(self.log.end_offset(lp as u32).await?);
        }
        let mut events = 0;
        while self.positions().iter().zip(&ends).any(|(at, end)| at < end) {
            let outcome = self.step_until(Some(&ends)).await?;
            events += outcome.events as u64;
            if outcome.entries == 0 {
                break;
            }
        }
        Ok(events)
    }

    /// Publishes how far behind the log's end the projection is, per log
    /// partition, as the gauge `reservoir_projection_lag_entries` (a failed
    /// look at the end is skipped: the next sample retries).
    async fn sample_lag(&self) {
        for (lp, at) in self.positions().into_iter().enumerate() {
            if let Ok(end) = self.log.end_offset(lp as u32).await {
                metrics::gauge!("reservoir_projection_lag_entries", "log_partition" => lp.to_string())
                    .set(end.saturating_sub(at) as f64);
            }
        }
    }

    /// Follows the log until `stop` turns true, then flushes what it wrote.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), ProjectionError> {
        let mut lag_sampled: Option<Instant> = None;
        loop {
            if *stop.borrow_and_update() {
                return store::flush(&self.db);
            }
            let outcome = self.step().await?;
            metrics::counter!("reservoir_projected_events_total").increment(outcome.events as u64);
            if lag_sampled.is_none_or(|at| at.elapsed() >= LAG_SAMPLE_INTERVAL) {
                lag_sampled = Some(Instant::now());
                self.sample_lag().await;
            }
            if outcome.entries > 0 {
                // A full read means more is waiting: go on at once. Otherwise
                // the log is drained; let the next batch grow for a moment.
                let drained = outcome.entries < self.config.read_entries_max;
                if drained && !self.config.linger.is_zero() {
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.linger) => {}
                        _ = self.hurry.notified() => {}
                        _ = stop.changed() => {}
                    }
                }
                continue;
            }
            let per_partition = self.config.idle_wait / self.cursors.len().max(1) as u32;
            for (lp, at) in self.positions().into_iter().enumerate() {
                tokio::select! {
                    found = self.log.wait_for(lp as u32, at, per_partition) => if found? { break },
                    _ = stop.changed() => break,
                }
            }
        }
    }
}

/// A partition's stored projection: its head from PARTITIONS plus the
/// reservation records it holds in memory from RESERVATIONS (the head is
/// stored without them, so a step writes what it touched, not the whole
/// partition): the open ones and the finished ones inside the idempotency
/// window, as `reservoir_core::retention` keeps them. Reads every record of
/// the partition once (a prefix scan) to pick them.
pub fn stored_partition(
    db: &DB,
    key: &PartitionKey,
) -> Result<PartitionProjection, ProjectionError> {
    let mut stored: PartitionProjection =
        get(db, store::PARTITIONS, &store::partition_key(key))?.unwrap_or_default();
    let prefix = format!("{}|", store::partition_key(key));
    let cf = db
        .cf_handle(store::RESERVATIONS)
        .ok_or_else(|| store::store_error("missing column family reservations"))?;
    let mode = rocksdb::IteratorMode::From(prefix.as_bytes(), rocksdb::Direction::Forward);
    let mut records = Vec::new();
    for item in db.iterator_cf(&cf, mode) {
        let (k, v) = item.map_err(store::store_error)?;
        if !k.starts_with(prefix.as_bytes()) {
            break;
        }
        let record: ReservationRecord = store::decode(store::RESERVATIONS, &k, &v)?;
        records.push(record.reservation);
    }
    reservoir_core::retention::restore_in_memory(&mut stored.partition, records);
    Ok(stored)
}

/// The projection of `key`, from the cache or the database.
fn load_partition<'a>(
    db: &DB,
    cache: &'a mut FastMap<PartitionKey, PartitionProjection>,
    key: &PartitionKey,
) -> Result<&'a mut PartitionProjection, ProjectionError> {
    if !cache.contains_key(key) {
        let stored = stored_partition(db, key)?;
        cache.insert(key.clone(), stored);
    }
    Ok(cache.get_mut(key).expect("just inserted"))
}

/// Changes of one step, keyed so the batch is written in a fixed order.
#[derive(Default)]
struct Work {
    puts: BTreeMap<(&'static str, String), Vec<u8>>,
    /// Keys the retention rule deletes (never one this step puts).
    deletes: Vec<(&'static str, String)>,
    /// Balance of each touched partition before the step (for roll-up deltas).
    old_balances: BTreeMap<PartitionKey, Option<PartitionBalance>>,
    reservations: BTreeSet<(PartitionKey, ReservationId)>,
    /// Records that left the partitions' memory in this step (see
    /// `reservoir_core::retention`); the projection keeps every record.
    evicted: FastMap<(PartitionKey, ReservationId), Reservation>,
    /// Reservations created in this step: their id goes into the index.
    created: BTreeSet<(PartitionKey, ReservationId)>,
    /// The projector's models, lent to the step.
    models: Models,
    /// Route roll-ups this step changed, published once it is committed.
    routes: Vec<(String, Rollup)>,
}

/// A route's debt and frozen partitions, from its roll-up, as gauges.
fn publish_route(route: &str, rollup: &Rollup) {
    let route = route.to_string();
    metrics::gauge!("reservoir_debt_units", "route" => route.clone()).set(rollup.debt_units as f64);
    metrics::gauge!("reservoir_frozen_partitions", "route" => route)
        .set(rollup.frozen_partitions as f64);
}

impl Work {
    fn put(&mut self, cf: &'static str, key: String, value: Vec<u8>) {
        self.puts.insert((cf, key), value);
    }

    /// A partition's head: without its reservation records (stored one by
    /// one in RESERVATIONS) nor its finished queue (rebuilt from the records
    /// on load).
    fn put_head(&mut self, pkey: String, proj: &mut PartitionProjection) {
        let reservations = std::mem::take(&mut proj.partition.reservations);
        let finished = std::mem::take(&mut proj.partition.finished);
        self.put(store::PARTITIONS, pkey, encode(&*proj));
        proj.partition.reservations = reservations;
        proj.partition.finished = finished;
    }

    /// Records the retention rule deleted while their partition still kept
    /// them in memory (its idempotency window had not passed at its last
    /// event: an idle partition) leave that memory now, counted as evicted,
    /// and the partition's head is written again. Otherwise a projector that
    /// restores the partition from the store (after a restart) would hold
    /// fewer records, and count fewer evictions, than one that never
    /// restarted or a rebuild from the log (found by the simulator's
    /// `projection_disagrees`).
    fn forget_pruned(
        &mut self,
        db: &DB,
        partitions: &mut FastMap<PartitionKey, PartitionProjection>,
        pruned: &[String],
    ) -> Result<(), ProjectionError> {
        let mut touched = BTreeSet::new();
        // A partition not cached: whether its head keeps any of them at all.
        let mut heads: BTreeMap<&str, Option<PartitionProjection>> = BTreeMap::new();
        for finished in pruned {
            let corrupt = || corrupt_finished(finished);
            let (at, pkey, id) = store::finished_parts(finished).ok_or_else(corrupt)?;
            let key = store::parse_partition_key(pkey).ok_or_else(corrupt)?;
            let id = ReservationId::new(id).map_err(|_| corrupt())?;
            if !partitions.contains_key(&key) {
                let head = match heads.entry(pkey) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        e.insert(get(db, store::PARTITIONS, pkey)?)
                    }
                };
                let kept = head
                    .as_ref()
                    .is_some_and(|h| reservoir_core::retention::within_window(&h.partition, at));
                if !kept {
                    continue;
                }
                // Its records still hold this one (the delete is in this batch).
                load_partition(db, partitions, &key)?;
            }
            let proj = partitions.get_mut(&key).expect("cached or loaded above");
            if reservoir_core::retention::forget_finished(&mut proj.partition, &id) {
                touched.insert(key);
            }
        }
        for key in touched {
            let pkey = store::partition_key(&key);
            let proj = partitions.get_mut(&key).expect("touched above");
            self.put_head(pkey, proj);
        }
        Ok(())
    }

    /// Turns the touched state into puts: partitions, balances, roll-ups,
    /// reservation records, digests and histograms.
    fn finish(
        &mut self,
        db: &DB,
        partitions: &mut FastMap<PartitionKey, PartitionProjection>,
    ) -> Result<(), ProjectionError> {
        for (key, old) in std::mem::take(&mut self.old_balances) {
            let pkey = store::partition_key(&key);
            // The partition's head only: its reservation records are stored
            // one by one in RESERVATIONS (written below for every touched one),
            // so a step costs what it touched, not the partition's whole size.
            let proj = partitions
                .get_mut(&key)
                .expect("a touched partition is cached");
            self.put_head(pkey.clone(), proj);
            let proj = &partitions[&key];
            let new = PartitionBalance::of(proj);
            if let Some(new) = &new {
                self.put(store::BALANCES, pkey, encode(new));
            }
            if old == new {
                continue;
            }
            for (cf, owner) in [
                (store::TENANT_BALANCES, &key.subject),
                (store::ROUTE_BALANCES, &key.route),
            ] {
                let rollup = self.models.rollup(db, cf, owner)?;
                if let Some(old) = &old {
                    rollup.fold(old, false);
                }
                if let Some(new) = &new {
                    rollup.fold(new, true);
                }
            }
        }
        let mut evicted = std::mem::take(&mut self.evicted);
        for (key, id) in std::mem::take(&mut self.reservations) {
            let reservation = match partitions[&key].partition.reservation(&id) {
                Some(r) => r.clone(),
                None => evicted
                    .remove(&(key.clone(), id.clone()))
                    .expect("a touched reservation is in memory or left it in this step"),
            };
            // A record takes no event once finished: touched and finished
            // means it finished in this step.
            if let (true, Some(at)) = (reservation.state.is_terminal(), reservation.finished_at_ms)
            {
                self.put(
                    store::FINISHED,
                    store::finished_key(at, &key, id.as_str()),
                    Vec::new(),
                );
            }
            let record = ReservationRecord {
                key: key.clone(),
                reservation,
            };
            self.put(
                store::RESERVATIONS,
                store::reservation_key(&key, id.as_str()),
                encode(&record),
            );
            // Later changes of the record leave its index entry as it is:
            // the entry names the partition, not the state.
            if self.created.remove(&(key.clone(), id.clone())) {
                self.put(
                    store::RESERVATION_IDS,
                    store::reservation_id_key(id.as_str(), &key),
                    encode(&key),
                );
            }
        }
        assert!(
            self.created.is_empty(),
            "a created reservation is a touched reservation"
        );
        self.models.write_touched(&mut self.puts, &mut self.routes);
        Ok(())
    }
}

fn corrupt_finished(finished: &str) -> ProjectionError {
    ProjectionError::Corrupt {
        cf: store::FINISHED,
        key: finished.to_string(),
        reason: "not <time>|<partition key>|<id>".into(),
    }
}

/// The retention rule: deletes (in `work`) the records of reservations that
/// finished before `cutoff_ms`, oldest first, at most [`PRUNED_PER_STEP`].
fn prune(db: &DB, work: &mut Work, cutoff_ms: u64) -> Result<Vec<String>, ProjectionError> {
    let mut gone = Vec::new();
    if cutoff_ms == 0 {
        return Ok(gone);
    }
    let cf = db
        .cf_handle(store::FINISHED)
        .ok_or_else(|| store_error("missing column family finished"))?;
    let mut options = rocksdb::ReadOptions::default();
    options.set_iterate_upper_bound(format!("{cutoff_ms:020}|").into_bytes());
    // Records that finished in this very step and are already past the
    // cutoff are not written at all (the database does not hold them yet).
    let upper = (store::FINISHED, format!("{cutoff_ms:020}|"));
    let fresh: Vec<String> = work
        .puts
        .range((store::FINISHED, String::new())..upper)
        .map(|((_, k), _)| k.clone())
        .collect();
    for finished in fresh {
        let (record, id_entry) =
            store::keys_of_finished(&finished).expect("written by finished_key");
        work.puts.remove(&(store::FINISHED, finished.clone()));
        gone.push(finished);
        work.puts.remove(&(store::RESERVATIONS, record.clone()));
        work.puts
            .remove(&(store::RESERVATION_IDS, id_entry.clone()));
        work.deletes.push((store::RESERVATIONS, record));
        work.deletes.push((store::RESERVATION_IDS, id_entry));
    }
    let mut pruned = 0;
    // Everything that finished before `complete_before` is gone once this
    // batch lands: the cutoff if the range was exhausted, else the time of
    // the last record pruned (others may share it).
    let mut complete_before = cutoff_ms;
    for item in db.iterator_cf_opt(&cf, options, rocksdb::IteratorMode::Start) {
        let (k, _) = item.map_err(store_error)?;
        let finished = String::from_utf8_lossy(&k).into_owned();
        let corrupt = || corrupt_finished(&finished);
        let (at, _, _) = store::finished_parts(&finished).ok_or_else(corrupt)?;
        let (record, id_entry) = store::keys_of_finished(&finished).ok_or_else(corrupt)?;
        work.deletes.push((store::RESERVATIONS, record));
        work.deletes.push((store::RESERVATION_IDS, id_entry));
        work.deletes.push((store::FINISHED, finished.clone()));
        gone.push(finished);
        pruned += 1;
        if pruned == PRUNED_PER_STEP {
            complete_before = at;
            break;
        }
    }
    // Written every step, so the mark depends on the log only, not on how it
    // was cut into steps.
    let before: u64 = get(db, store::RETENTION, store::PRUNED_BEFORE)?.unwrap_or(0);
    work.put(
        store::RETENTION,
        store::PRUNED_BEFORE.to_string(),
        encode(&before.max(complete_before)),
    );
    metrics::counter!("reservoir_projection_pruned_total").increment(pruned as u64);
    Ok(gone)
}
