//! The projector in the loop: in one run of three, the real
//! `reservoir_projections::Projector` follows the simulated log as the
//! server's in-process projector does, one step at a time (of 1–64 entries
//! per log partition, fixed per run), and now and then crashes: between
//! deriving a step and committing it (its test hook; it is then reopened
//! over the same database), or as a process would, its database closed and
//! opened again. Some runs prune finished
//! reservation records (the retention rule, by log time).
//!
//! At the end of a run it catches up, and the checker holds it
//! (`projection_disagrees`) to:
//! - a projector rebuilt from the whole log in one go: every key and value
//!   of the two databases equal, byte for byte (the design's "replaying the
//!   log reproduces state byte for byte", across crashes and small steps);
//! - the ledger: every partition it projected equals the writers' live one
//!   (balances in every dimension, records, moves, shards), and it projected
//!   every live partition;
//! - no findings: no event its apply refused.
//!
//! Its moments come from a generator of its own (seeded from the run's
//! seed), never the world's, and it writes to the trace only on a finding:
//! the world's interleavings, and their trace hashes, are the same with or
//! without it.

use std::path::PathBuf;
use std::time::Duration;

use reservoir_log::{EventReader, LogEntry, LogError, Position};
use reservoir_projections::{dump, store, Projections, Projector, ProjectorConfig};
use rocksdb::DB;

use super::*;

/// One run in this many has the projector: each opens two RocksDB
/// databases or more (a few tens of ms each), which in every run doubled
/// the simulator's time.
const RUNS_PROJECTED: u64 = 3;

/// Coverage: entries the followed projector read, step by step and when
/// it caught up at the end (a crashed step's entries are read again).
const ENTRIES_READ: &str = "projector: entries read";

pub(super) struct Projection {
    rng: Rng,
    path: PathBuf,
    db: Option<Arc<DB>>,
    projector: Option<Projector<Followed>>,
    config: ProjectorConfig,
    log: Arc<SimLog>,
    /// The plant `projector-skips`: the followed projector's reads lose an entry.
    skip: Option<Position>,
}

/// What the followed projector reads: the log, or (planted) the log without
/// one of its entries.
pub(super) struct Followed {
    log: Arc<SimLog>,
    skip: Option<Position>,
}

impl EventReader for Followed {
    fn log_partition_for(&self, key: &PartitionKey) -> u32 {
        self.log.log_partition_for(key)
    }

    fn log_partitions(&self) -> u32 {
        self.log.log_partitions()
    }

    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        let mut entries = self.log.read(log_partition, from_offset, max).await?;
        entries.retain(|(at, _)| Some(*at) != self.skip);
        Ok(entries)
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        self.log.end_offset(log_partition).await
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        self.log.wait_for(log_partition, offset, timeout).await
    }
}

impl Projection {
    /// The run's projector, in one run of [`RUNS_PROJECTED`] (`None` in the
    /// others).
    pub(super) fn open(
        seed: u64,
        dir: &std::path::Path,
        log: Arc<SimLog>,
        planted_skip: bool,
    ) -> Result<Option<Self>, String> {
        let mut rng = Rng::new(seed ^ 0x7072_6f6a_6563_746f);
        if rng.below(RUNS_PROJECTED) != 0 {
            return Ok(None);
        }
        let config = ProjectorConfig {
            read_entries_max: rng.range(1, 64) as usize,
            retention: rng
                .chance(300)
                .then(|| Duration::from_secs(rng.range(10, 600))),
            ..ProjectorConfig::default()
        };
        let mut projection = Projection {
            rng,
            path: dir.join("projections"),
            db: None,
            projector: None,
            config,
            log,
            skip: planted_skip.then_some(Position {
                log_partition: 0,
                offset: 9,
            }),
        };
        projection.reopen(true)?;
        Ok(Some(projection))
    }

    /// Its database (the tool's verify reads it, `run`'s `replay`).
    pub(super) fn db(&self) -> Arc<DB> {
        self.db.clone().expect("open")
    }

    pub(super) fn log(&self) -> Arc<SimLog> {
        self.log.clone()
    }

    /// The projector over the database as committed; with `close`, the
    /// database is closed and opened again first (a process restart).
    fn reopen(&mut self, close: bool) -> Result<(), String> {
        self.projector = None;
        if close || self.db.is_none() {
            self.db = None;
            self.db = Some(store::open(&self.path).map_err(|e| format!("open projections: {e}"))?);
        }
        let db = self.db.clone().expect("opened above");
        self.projector = Some(
            Projector::open(
                Arc::new(Followed {
                    log: self.log.clone(),
                    skip: self.skip,
                }),
                db,
                self.config.clone(),
            )
            .map_err(|e| format!("open projector: {e}"))?,
        );
        Ok(())
    }
}

impl World {
    /// After a round: the projector may take a step, crash, or restart.
    pub(super) async fn project(&mut self, round: usize) {
        let Some(p) = self.projection.as_mut() else {
            return;
        };
        let result = match p.rng.below(1000) {
            // A crash between derive and commit: the step fails, the
            // projector refuses further work until reopened.
            0..=4 => {
                let projector = p.projector.as_mut().expect("open");
                projector.fail_before_commit(1);
                match projector.step().await {
                    // Nothing to commit: the hook did not fire; a restart
                    // disarms it.
                    Ok(step) if step.entries == 0 => p.reopen(false),
                    Ok(_) => Err("a step committed past the crash hook".to_string()),
                    Err(_) => {
                        *self
                            .coverage
                            .entry("projector: crash before commit")
                            .or_default() += 1;
                        p.reopen(false)
                    }
                }
            }
            // A process restart: the database closed and opened again.
            5..=9 => {
                *self.coverage.entry("projector: restart").or_default() += 1;
                p.reopen(true)
            }
            10..=599 => match p.projector.as_mut().expect("open").step().await {
                Ok(step) => {
                    *self.coverage.entry(ENTRIES_READ).or_default() += step.entries as u64;
                    Ok(())
                }
                Err(e) => Err(format!("step: {e}")),
            },
            _ => Ok(()),
        };
        if let Err(err) = result {
            self.fail(round, vec![finding(Gate::ProjectionDisagrees, err)]);
        }
    }

    /// At the end of a run: the projector caught up, against a rebuild and
    /// the ledger.
    pub(super) async fn check_projection(&mut self, round: usize) {
        if self.projection.is_none() {
            return;
        }
        if let Err(err) = self.projection_agrees().await {
            self.fail(round, vec![finding(Gate::ProjectionDisagrees, err)]);
        }
    }

    async fn projection_agrees(&mut self) -> Result<(), String> {
        let live = self.node.partitions().await?;
        let p = self.projection.as_mut().expect("checked by the caller");
        let db = p.db.clone().expect("open");
        let followed = p.projector.as_mut().expect("open");
        let from: u64 = followed.positions().iter().sum();
        followed
            .catch_up()
            .await
            .map_err(|e| format!("catch up: {e}"))?;
        let caught_up = followed.positions().iter().sum::<u64>() - from;

        let rebuilt_path = p.path.with_file_name("projections-rebuilt");
        let rebuilt_db =
            store::open(&rebuilt_path).map_err(|e| format!("open the rebuild: {e}"))?;
        let mut rebuild = Projector::open(
            p.log.clone(),
            rebuilt_db.clone(),
            ProjectorConfig {
                read_entries_max: 4_096,
                ..p.config.clone()
            },
        )
        .map_err(|e| format!("open the rebuild: {e}"))?;
        rebuild
            .catch_up()
            .await
            .map_err(|e| format!("rebuild: {e}"))?;
        *self.coverage.entry(ENTRIES_READ).or_default() += caught_up;

        let (a, b) = (
            dump(&db).map_err(|e| format!("dump: {e}"))?,
            dump(&rebuilt_db).map_err(|e| format!("dump the rebuild: {e}"))?,
        );
        if a != b {
            let at = a
                .iter()
                .zip(&b)
                .position(|(x, y)| x != y)
                .unwrap_or(a.len().min(b.len()));
            return Err(format!(
                "followed ({} entries) and rebuilt ({}) differ at entry {at}: {}",
                a.len(),
                b.len(),
                first_difference(a.get(at), b.get(at))
            ));
        }

        let projections = Projections::detached(db.clone());
        let findings = projections
            .at()
            .findings()
            .map_err(|e| format!("findings: {e}"))?;
        if let Some(f) = findings.first() {
            return Err(format!("{} findings, the first: {f:?}", findings.len()));
        }
        let pruned = p.config.retention.is_some();
        let mut projected = Partitions::new();
        for balance in projections
            .at()
            .all_balances()
            .map_err(|e| format!("balances: {e}"))?
        {
            let stored = reservoir_projections::projector::stored_partition(&db, &balance.key)
                .map_err(|e| format!("partition {}: {e}", balance.key))?;
            projected.insert(balance.key, comparable(stored.partition, pruned));
        }
        let live: Partitions = live
            .into_iter()
            .map(|(k, p)| (k, comparable(p, pruned)))
            .collect();
        let mut out = Vec::new();
        check::compare(
            Gate::ProjectionDisagrees,
            "projected",
            &projected,
            "live",
            &live,
            &mut out,
        );
        match out.into_iter().next() {
            Some(f) => Err(f.detail),
            None => Ok(()),
        }
    }
}

/// A partition as the projection can restore it: finished records that
/// finished in the same millisecond in id order (the projection reads them
/// back in key order; `reservoir_core::retention::restore_in_memory`), and,
/// when the run prunes, without finished records or the count of those that
/// left memory (a pruned record leaves the projection's memory when it is
/// pruned, not when its window passes, as it does the ledger's).
fn comparable(mut p: reservoir_core::Partition, pruned: bool) -> reservoir_core::Partition {
    if pruned {
        for (_, id) in std::mem::take(&mut p.finished) {
            p.reservations.remove(&id);
        }
        p.evicted_reservations = 0;
    } else {
        p.finished.make_contiguous().sort();
    }
    p
}

/// Where two dump entries differ: the column family and key, and each value
/// around its first differing byte.
fn first_difference(a: Option<&store::DumpEntry>, b: Option<&store::DumpEntry>) -> String {
    let (Some((cf_a, key_a, a)), Some((cf_b, key_b, b))) = (a, b) else {
        return format!(
            "one ends first ({:?} / {:?})",
            a.map(|e| &e.0),
            b.map(|e| &e.0)
        );
    };
    if (cf_a, key_a) != (cf_b, key_b) {
        let key = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        return format!("{cf_a} {} / {cf_b} {}", key(key_a), key(key_b));
    }
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let around = |v: &[u8]| {
        String::from_utf8_lossy(&v[at.saturating_sub(120)..(at + 120).min(v.len())]).into_owned()
    };
    format!(
        "{cf_a} {} at byte {at}: ...{}... / ...{}...",
        String::from_utf8_lossy(key_a),
        around(a),
        around(b)
    )
}
