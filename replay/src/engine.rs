//! The replay engine: folds the log into per-partition state with the core's
//! own `try_apply`, through the log's one validity rule, and turns everything
//! that does not fit into a located [`Finding`].
//!
//! Per log partition, entries go in offset order through a
//! [`reservoir_log::fence::Validity`] (claims and fenced records change no
//! ledger state; fenced records are only counted). Each record that counts is
//! applied event by event to its ledger partition.
//!
//! What "continue" means (the default; `--strict` stops at the first finding
//! instead):
//! - an entry that does not decode (or a hole in the offsets) is reported and
//!   skipped; its events are unknown, so the next record of that partition
//!   will usually also report the sequence gap it left;
//! - a sequence gap (events missing before this one) is reported, then the
//!   partition accepts this event's sequence as the next one and applies it;
//! - an event `try_apply` refuses (a broken amount, conservation, an illegal
//!   transition, a repeated sequence) is reported and skipped: the partition
//!   stays as it was before that event, and the gap the skipped event leaves is
//!   not reported again;
//! - later events of the same partition are still applied (so one bad event can
//!   cause further findings, each reported with its own position).
//!
//! This differs on purpose from the live projector, which quarantines a
//! partition at its first refused event: an auditor wants every finding.

use rustc_hash::FxHashMap;

use std::collections::BTreeMap;

use reservoir_core::{
    try_apply_evicting, Event, EventBody, Ledger, Partition, PartitionKey, Reservation,
    ReservationId,
};
use reservoir_log::fence::{Validity, Verdict};
use reservoir_log::{LogEntry, Position, Record};
use serde::Serialize;

use crate::source::RawEntry;
use crate::Stop;

/// Something in the log that does not add up, with where it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub log_partition: u32,
    pub offset: u64,
    /// The ledger partition, when known (`subject|route|epoch|g<generation>`).
    pub partition: Option<String>,
    pub event_index: Option<u32>,
    pub sequence: Option<u64>,
    /// `undecodable`, `sequence_gap`, `refused`, `move_unpaired`,
    /// `move_mismatch`, `shard_remint_unbacked`, `shard_remint_mismatch` or
    /// `shard_reminted_twice`.
    pub kind: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at log partition {} offset {}",
            self.kind, self.log_partition, self.offset
        )?;
        if let Some(p) = &self.partition {
            write!(f, ", partition {p}")?;
        }
        if let Some(s) = self.sequence {
            write!(f, ", sequence {s}")?;
        }
        if let Some(i) = self.event_index {
            write!(f, " (event {i} of the record)")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// Replay state of one ledger partition.
#[derive(Clone, Debug, Default)]
pub struct PartState {
    pub partition: Partition,
    pub log_partition: u32,
    /// `at_ms` of the `PartitionOpened` event (the projector's `opened_at_ms`).
    pub opened_at_ms: u64,
    /// Highest sequence this replay refused: a gap up to it is our own doing.
    skipped_through: u64,
    pub skipped_events: u64,
    pub first_finding: Option<Finding>,
    /// Records that left the partition's memory (its idempotency window
    /// passed, `reservoir_core::retention`): an audit keeps every record, and
    /// sees a second reservation under an id that left memory.
    pub retired: BTreeMap<ReservationId, Reservation>,
}

impl PartState {
    /// A partition's state as some other fold left it (benchmarks, tools).
    pub fn folded(partition: Partition, log_partition: u32, opened_at_ms: u64) -> Self {
        Self {
            partition,
            log_partition,
            opened_at_ms,
            ..Self::default()
        }
    }
}

/// One applied event, as the visitor sees it.
pub struct Applied<'a> {
    pub position: Position,
    pub key: &'a PartitionKey,
    pub event_index: u32,
    pub event: &'a Event,
    pub before: Ledger,
    /// The further dimensions' ledgers before the event (policy order).
    pub before_further: Vec<Ledger>,
    pub state: &'a PartState,
}

/// What a replay run reports to its command.
pub trait Visit {
    /// A record that counts (fence rule), before its events are applied.
    fn record(&mut self, _position: Position, _record: &Record) {}
    /// An event `try_apply` accepted.
    fn event(&mut self, _applied: Applied<'_>) {}
}

/// A visitor that wants nothing.
pub struct Nothing;
impl Visit for Nothing {}

/// Where replay stops: per log partition an exclusive end offset, and
/// optionally a time (events with `at_ms` above it are not applied).
#[derive(Clone, Debug)]
pub struct Limit {
    pub ends: Vec<u64>,
    pub until_ms: Option<u64>,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub entries: u64,
    pub records: u64,
    pub events: u64,
    pub claims: u64,
    pub fenced_records: u64,
}

pub struct Engine<'f> {
    pub strict: bool,
    /// Only partitions for which this is true are folded (audit: one tenant).
    pub filter: Box<dyn Fn(&PartitionKey) -> bool + 'f>,
    pub until_ms: Option<u64>,
    pub partitions: FxHashMap<PartitionKey, PartState>,
    pub findings: Vec<Finding>,
    pub stats: Stats,
    /// Every move half applied, checked pairwise once the log is read.
    pub moves: crate::moves::Moves,
    /// Emergency shards across partitions (checked at the end).
    pub shards: crate::shards::Shards,
    validity: Vec<Validity>,
}

impl<'f> Engine<'f> {
    pub fn new(log_partitions: u32, strict: bool, until_ms: Option<u64>) -> Self {
        Self {
            strict,
            filter: Box::new(|_| true),
            until_ms,
            partitions: FxHashMap::default(),
            findings: Vec::new(),
            stats: Stats::default(),
            moves: crate::moves::Moves::default(),
            shards: crate::shards::Shards::default(),
            validity: vec![Validity::default(); log_partitions as usize],
        }
    }

    fn report(&mut self, finding: Finding) -> Result<(), Stop> {
        if self.strict {
            return Err(Stop::Strict(finding));
        }
        self.findings.push(finding);
        Ok(())
    }

    /// Feeds consecutive entries of one log partition.
    pub fn feed(&mut self, entries: Vec<RawEntry>, visit: &mut dyn Visit) -> Result<(), Stop> {
        for raw in entries {
            self.stats.entries += 1;
            let position = raw.position;
            let entry = match raw.entry {
                Ok(entry) => entry,
                Err(unreadable) => {
                    if unreadable.key.as_ref().is_some_and(|k| !(self.filter)(k)) {
                        continue;
                    }
                    self.report(Finding {
                        log_partition: position.log_partition,
                        offset: position.offset,
                        partition: unreadable.key.as_ref().map(|k| k.to_string()),
                        event_index: None,
                        sequence: None,
                        kind: "undecodable",
                        detail: unreadable.reason,
                    })?;
                    continue;
                }
            };
            let validity = &mut self.validity[position.log_partition as usize];
            match validity.observe(&entry) {
                Verdict::Counts => {}
                Verdict::ClaimAccepted | Verdict::StaleClaim => {
                    self.stats.claims += 1;
                    continue;
                }
                Verdict::Fenced => {
                    self.stats.fenced_records += 1;
                    continue;
                }
            }
            let LogEntry::Record(record) = entry else {
                unreachable!("only records count")
            };
            if (self.filter)(&record.key) {
                visit.record(position, &record);
            }
            self.record(position, &record, visit)?;
        }
        Ok(())
    }

    fn record(
        &mut self,
        position: Position,
        record: &Record,
        visit: &mut dyn Visit,
    ) -> Result<(), Stop> {
        if !(self.filter)(&record.key) {
            return Ok(());
        }
        self.stats.records += 1;
        for (index, event) in record.events.iter().enumerate() {
            if self.until_ms.is_some_and(|t| event.at_ms > t) {
                continue;
            }
            self.stats.events += 1;
            let finding = |kind, detail: String| Finding {
                log_partition: position.log_partition,
                offset: position.offset,
                partition: Some(record.key.to_string()),
                event_index: Some(index as u32),
                sequence: Some(event.sequence),
                kind,
                detail,
            };
            let state = match self.partitions.get_mut(&record.key) {
                Some(s) => s,
                None => self
                    .partitions
                    .entry(record.key.clone())
                    .or_insert_with(|| PartState {
                        log_partition: position.log_partition,
                        ..PartState::default()
                    }),
            };
            let expected = state.partition.last_sequence + 1;
            let mut gap = None;
            if event.sequence > expected {
                if state.skipped_through < event.sequence - 1 {
                    gap = Some(finding(
                        "sequence_gap",
                        format!(
                            "events {expected}..={} of this partition are missing",
                            event.sequence - 1
                        ),
                    ));
                }
                // Continue: accept this event's sequence as the next one.
                state.partition.last_sequence = event.sequence - 1;
            }
            let before = state.partition.ledger;
            let before_further: Vec<Ledger> =
                state.partition.further.iter().map(|d| d.ledger).collect();
            let result = match &event.body {
                EventBody::PartitionOpened { key, .. } if *key != record.key => {
                    Err("PartitionOpened names another partition than its record".to_string())
                }
                EventBody::Reserved { id, .. } if state.retired.contains_key(id) => Err(format!(
                    "reservation {id} created twice (the first had left memory)"
                )),
                _ => {
                    let mut evicted = Vec::new();
                    let applied = try_apply_evicting(&mut state.partition, event, &mut evicted)
                        .map_err(|e| e.to_string());
                    for r in evicted {
                        state.retired.insert(r.id.clone(), r);
                    }
                    applied
                }
            };
            let refused = match result {
                Ok(()) => {
                    if let EventBody::PartitionOpened { .. } = event.body {
                        state.opened_at_ms = event.at_ms;
                    }
                    let policy = state.partition.policy.as_ref();
                    self.moves
                        .note(position, &record.key, policy, index as u32, event);
                    self.shards.note(position, &record.key, index as u32, event);
                    visit.event(Applied {
                        position,
                        key: &record.key,
                        event_index: index as u32,
                        event,
                        before,
                        before_further,
                        state,
                    });
                    None
                }
                Err(error) => {
                    state.skipped_through = state.skipped_through.max(event.sequence);
                    state.skipped_events += 1;
                    Some(finding("refused", error))
                }
            };
            for f in [gap, refused].into_iter().flatten() {
                if let Some(state) = self.partitions.get_mut(&record.key) {
                    state.first_finding.get_or_insert_with(|| f.clone());
                }
                self.report(f)?;
            }
        }
        Ok(())
    }
}

/// Replays `source` up to `limit`, calling `visit` for every applied event and
/// `progress` with the entries read so far.
pub async fn run(
    source: &crate::source::Source,
    engine: &mut Engine<'_>,
    limit: &Limit,
    visit: &mut dyn Visit,
    progress: &dyn Fn(u64),
) -> Result<(), Stop> {
    for (lp, &end) in limit.ends.iter().enumerate() {
        source
            .scan(lp as u32, end, |slice| {
                let n = slice.len() as u64;
                engine.feed(slice, visit)?;
                progress(n);
                Ok(())
            })
            .await?;
    }
    // Moves pair, and shards are reminted once, across partitions: checked
    // once every event could be seen.
    for finding in engine.moves.findings() {
        engine.report(finding)?;
    }
    for finding in engine.shards.findings() {
        engine.report(finding)?;
    }
    Ok(())
}
