//! `reservoir-replay verify` in the loop: in the runs with the projector,
//! once it caught up at the end of the run, the audit tool's own code
//! (`reservoir_replay`) re-derives every partition from the log and
//! compares it with the followed projector's database, as `reservoir-replay
//! verify` does against a server's projections: its engine folds the log
//! through the log's validity rule (claims, fenced records) and core's
//! `try_apply`, keeping every finding instead of stopping at the first;
//! replay stops at the projection's cursors; then every stored balance and
//! every reservation record is compared with the derived one (records the
//! projection's retention pruned are not expected of it).
//!
//! Gate `replay_disagrees`: a finding of the engine (an event it refused, a
//! sequence gap, a move without its other half) or a difference between
//! the tool and the projection. The projector and the tool derive state by
//! different code (the projector's apply and store; the engine's fold and
//! the tool's encoding), so a bug in either, or a log they read differently,
//! shows here. The plant `replay-skips` makes the tool read the log without
//! one entry.

use reservoir_log::{EventReader, Position};
use reservoir_projections::store;
use reservoir_replay::engine::{Engine, Nothing};
use reservoir_replay::source::RawEntry;
use reservoir_replay::{verify, Stop};
use rocksdb::DB;

use super::*;

/// Entries read from the log at a time.
const READ_MAX: usize = 4_096;

/// Coverage: events the tool re-derived.
const EVENTS_REPLAYED: &str = "replay verify: events re-derived";

impl World {
    /// The tool's verify against the followed projector, after it caught up.
    pub(super) async fn check_replay(&mut self, round: usize) {
        let Some(p) = self.projection.as_ref() else {
            return;
        };
        let (db, log) = (p.db(), p.log());
        let skip = (self.plant == Some(Plant::ReplaySkips)).then_some(Position {
            log_partition: 0,
            offset: 9,
        });
        match verify_with_replay(&log, &db, skip).await {
            Ok(events) => *self.coverage.entry(EVENTS_REPLAYED).or_default() += events,
            Err(err) => self.fail(round, vec![finding(Gate::ReplayDisagrees, err)]),
        }
    }
}

/// `reservoir-replay verify` of `db` over `log` (see the module docs): the
/// events re-derived, or the first finding or difference.
async fn verify_with_replay(log: &SimLog, db: &DB, skip: Option<Position>) -> Result<u64, String> {
    let stop = |s: Stop| s.to_string();
    let partitions = log.log_partitions();
    let mut ends = Vec::new();
    for lp in 0..partitions {
        ends.push(log.end_offset(lp).await.map_err(|e| e.to_string())?);
    }
    let (consumed, mut differences) = verify::projection_ends(db, &ends).map_err(stop)?;
    let mut engine = Engine::new(partitions, false, None);
    for (lp, &end) in consumed.iter().enumerate() {
        let mut from = 0;
        while from < end {
            let read = log
                .read(lp as u32, from, READ_MAX)
                .await
                .map_err(|e| e.to_string())?;
            let Some(last) = read.last() else {
                return Err(format!(
                    "log partition {lp} ends at {from}, its projection's cursor at {end}"
                ));
            };
            from = last.0.offset + 1;
            let entries = read
                .into_iter()
                .filter(|(at, _)| at.offset < end && Some(*at) != skip)
                .map(|(position, entry)| RawEntry {
                    position,
                    entry: Ok(entry),
                })
                .collect();
            engine.feed(entries, &mut Nothing).map_err(stop)?;
        }
    }
    let mut findings = std::mem::take(&mut engine.findings);
    findings.extend(engine.moves.findings());
    if let Some(f) = findings.first() {
        return Err(format!(
            "{} findings of the replay engine, the first: {f}",
            findings.len()
        ));
    }
    let events = engine.stats.events;
    let mut expected = verify::Expected::of(&mut engine);
    if let Some(before) = verify::pruned_before_ms(db).map_err(stop)? {
        expected.without_pruned(before);
    }
    verify::compare_column(
        "balance",
        &expected.balances,
        db,
        store::BALANCES,
        &mut differences,
    )
    .map_err(stop)?;
    verify::compare_reservations(&expected, db, &mut differences).map_err(stop)?;
    match differences.first() {
        None => Ok(events),
        Some(d) => Err(format!(
            "{} differences between the replay tool and the projection, the first: {} {}: \
             from the log {}, in the projection {}",
            differences.len(),
            d.partition,
            d.term,
            d.expected,
            d.found
        )),
    }
}
