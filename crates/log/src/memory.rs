//! An in-memory [`EventLog`] with fault injection, for tests of the writer at its
//! own trait boundary: `fail_next_appends(n)` makes the next `n` appends fail
//! with a transient error and write nothing, like a RocksDB write that was
//! refused; `fail_next_append_fatally()` fails one with a non-transient error.
//! Not durable; `reservoir serve --log memory` only, for trying the API.
//! Behind the cargo feature `memory`.
//!
//! `fail_next_append_in_doubt()` writes the next append and then fails it with
//! [`LogError::InDoubt`], like a Kafka append whose records landed but whose
//! acknowledgement was lost; the log then refuses appends (InDoubt) until it is
//! claimed again. `tear_next_append(per_mille)` does the same with only the
//! first records of the next append of two or more written, about
//! `per_mille`/1000 of them (at least one, never all): a Kafka append
//! produces its records one by one, so one that fails part way, or that a
//! newer claim lands in the middle of, keeps a prefix.
//! [`MemoryLog::ordered`] gives a log with
//! [`EventLog::ordered_appends`] (the writer pipelines on it): every failure
//! makes it refuse all later appends until it is claimed again, and
//! `set_append_delay` keeps each append in flight for a while.
//!
//! Claims, as on a Kafka topic: one log may be shared by several writers, and
//! [`MemoryLog::claim`] appends a claim above every earlier one. A record must
//! carry a claim made in this log, or the whole batch is refused
//! ([`LogError::Invalid`]) and nothing is written. A zombie (a writer whose
//! claim a later one superseded) behaves as on Kafka: its first batch after
//! the newer claim is written and answered [`LogError::Fenced`], every later
//! one under that claim is refused (`Fenced`, nothing written), and readers
//! skip what it wrote by the validity rule ([`crate::fence`]). One log
//! partition (0).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reservoir_core::PartitionKey;

use crate::{Claim, EventLog, EventReader, LogEntry, LogError, Position, Record};

#[derive(Default)]
pub struct MemoryLog {
    stored: Mutex<Stored>,
    failures: AtomicUsize,
    fatal: AtomicBool,
    in_doubt_next: AtomicBool,
    /// Armed by `tear_next_append`: the share of records kept, per mille.
    tear_next: Mutex<Option<u64>>,
    /// Why appends are refused until the next claim.
    refusing: Mutex<Option<LogError>>,
    ordered: bool,
    delay: Mutex<Duration>,
    /// While set, every append stays in flight (its outcome already fixed).
    held: Arc<AtomicBool>,
    calls: AtomicUsize,
    appended: tokio::sync::Notify,
}

/// The log itself, behind one lock: a claim and the records checked against
/// it are never interleaved.
#[derive(Default)]
struct Stored {
    entries: Vec<LogEntry>,
    /// Every claim made, by epoch (epochs only grow, so the last is the latest).
    claims: BTreeMap<u64, String>,
    /// Superseded claims whose writer was answered `Fenced` once already.
    told_fenced: BTreeSet<u64>,
    /// The first offset still readable ([`MemoryLog::delete_before`]).
    start: u64,
}

impl MemoryLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// A log with ordered appends (see the module doc).
    pub fn ordered() -> Self {
        MemoryLog {
            ordered: true,
            ..Self::default()
        }
    }

    /// Each append resolves `delay` after its call (its outcome is fixed at the call).
    pub fn set_append_delay(&self, delay: Duration) {
        *self.delay.lock().expect("memory log lock") = delay;
    }

    /// Holds every append in flight until `release_appends`: lets a test order
    /// events without depending on timing.
    pub fn hold_appends(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    pub fn release_appends(&self) {
        self.held.store(false, Ordering::SeqCst);
    }

    /// Retention deleted every entry before `offset`, as Kafka does with a
    /// topic's old segments: a read from below it fails (`Storage`, like
    /// Kafka's offset out of range); offsets and the end are unchanged.
    pub fn delete_before(&self, offset: u64) {
        let mut stored = self.stored.lock().expect("memory log lock");
        stored.start = stored.start.max(offset);
    }

    /// The next append is written, then answered `InDoubt`.
    pub fn fail_next_append_in_doubt(&self) {
        self.in_doubt_next.store(true, Ordering::SeqCst);
    }

    /// The next append of two or more records writes a prefix of them
    /// (about `per_mille`/1000, at least one, never all), then is answered
    /// `InDoubt` like `fail_next_append_in_doubt`. `None` disarms it.
    pub fn tear_next_append(&self, per_mille: Option<u64>) {
        *self.tear_next.lock().expect("memory log lock") = per_mille;
    }

    /// How many times `append` was called (with records or not).
    pub fn append_calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn fail_next_appends(&self, n: usize) {
        self.fatal.store(false, Ordering::SeqCst);
        self.failures.store(n, Ordering::SeqCst);
    }

    /// The next append fails with a non-transient storage error, like a failed
    /// synced RocksDB write after which the embedded log refuses writes.
    pub fn fail_next_append_fatally(&self) {
        self.fatal.store(true, Ordering::SeqCst);
        self.failures.store(1, Ordering::SeqCst);
    }

    /// Appends a claim with an epoch above every claim in the log, as the
    /// embedded and Kafka logs do; records must then carry it. Clears a
    /// refusal left by a failed append.
    pub fn claim(&self, writer_id: &str) -> Claim {
        let mut stored = self.stored.lock().expect("memory log lock");
        let top = stored
            .claims
            .last_key_value()
            .map_or(0, |(epoch, _)| *epoch);
        let claim = Claim {
            writer_id: writer_id.to_string(),
            epoch: top.checked_add(1).expect("claim epochs exhausted"),
        };
        stored.claims.insert(claim.epoch, claim.writer_id.clone());
        stored.entries.push(LogEntry::Claim(claim.clone()));
        drop(stored);
        *self.refusing.lock().expect("memory log lock") = None;
        self.appended.notify_waiters();
        claim
    }

    /// The latest claim in the log, if any.
    pub fn latest_claim(&self) -> Option<Claim> {
        let stored = self.stored.lock().expect("memory log lock");
        stored
            .claims
            .last_key_value()
            .map(|(epoch, writer_id)| Claim {
                writer_id: writer_id.clone(),
                epoch: *epoch,
            })
    }

    pub fn len(&self) -> usize {
        self.stored.lock().expect("memory log lock").entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn records(&self) -> Vec<Record> {
        let stored = self.stored.lock().expect("memory log lock");
        stored
            .entries
            .iter()
            .filter_map(|e| match e {
                LogEntry::Record(r) => Some(r.clone()),
                LogEntry::Claim(_) => None,
            })
            .collect()
    }
}

impl Stored {
    /// Whether `batch` may be written: `Ok(None)` under the latest claim,
    /// `Ok(Some(epoch))` under `epoch`, a claim a later one superseded (a
    /// zombie's write).
    fn check(&self, batch: &[Record]) -> Result<Option<u64>, LogError> {
        let Some((&latest, _)) = self.claims.last_key_value() else {
            return Err(LogError::Invalid(
                "log partition 0 is not claimed by any writer".into(),
            ));
        };
        let mut superseded = None;
        for record in batch {
            if self.claims.get(&record.claim_epoch) != Some(&record.writer_id) {
                return Err(LogError::Invalid(format!(
                    "record written as {}@{} but no such claim was made in this log",
                    record.writer_id, record.claim_epoch
                )));
            }
            if record.claim_epoch < latest {
                superseded = Some(record.claim_epoch);
            }
        }
        Ok(superseded)
    }
}

impl MemoryLog {
    fn append_now(&self, batch: Vec<Record>) -> Result<Vec<Position>, LogError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut refusing = self.refusing.lock().expect("memory log lock");
        if let Some(why) = refusing.as_ref() {
            return Err(match why {
                LogError::InDoubt {
                    log_partition,
                    reason,
                } => LogError::InDoubt {
                    log_partition: *log_partition,
                    reason: reason.clone(),
                },
                other => LogError::Unavailable(format!(
                    "refusing appends after a failed one until claimed again ({other})"
                )),
            });
        }
        let mut stored = self.stored.lock().expect("memory log lock");
        // A batch the log refuses is the caller's mistake, not a fault: it
        // does not use up an injected failure.
        let superseded = stored.check(&batch)?;
        if let Some(epoch) = superseded {
            // Like a Kafka writer that read back a newer claim: told once (its
            // batch written), it refuses everything later under that claim.
            if stored.told_fenced.contains(&epoch) {
                return Err(fenced(&batch[0].writer_id));
            }
        }
        let failed = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failed {
            let err = if self.fatal.load(Ordering::SeqCst) {
                LogError::Storage("injected fatal append failure".into())
            } else {
                LogError::Unavailable("injected append failure".into())
            };
            if self.ordered {
                *refusing = Some(LogError::Unavailable(err.to_string()));
            }
            return Err(err);
        }
        let writer_id = batch[0].writer_id.clone();
        let torn = match batch.len() {
            0 | 1 => None,
            len => self
                .tear_next
                .lock()
                .expect("memory log lock")
                .take()
                .map(|per_mille| (len as u64 * per_mille / 1000).clamp(1, len as u64 - 1)),
        };
        let kept = torn.map_or(batch.len(), |kept| kept as usize);
        let positions: Vec<Position> = batch
            .into_iter()
            .take(kept)
            .map(|record| {
                stored.entries.push(LogEntry::Record(record));
                Position {
                    log_partition: 0,
                    offset: stored.entries.len() as u64 - 1,
                }
            })
            .collect();
        if let Some(epoch) = superseded {
            stored.told_fenced.insert(epoch);
        }
        drop(stored);
        self.appended.notify_waiters();
        if superseded.is_some() {
            return Err(fenced(&writer_id));
        }
        if torn.is_some() {
            *refusing = Some(LogError::InDoubt {
                log_partition: 0,
                reason: "an earlier append is in doubt".into(),
            });
            return Err(LogError::InDoubt {
                log_partition: 0,
                reason: format!("injected: {kept} records written, the rest lost"),
            });
        }
        let in_doubt = self.in_doubt_next.swap(false, Ordering::SeqCst);
        if in_doubt {
            *refusing = Some(LogError::InDoubt {
                log_partition: 0,
                reason: "an earlier append is in doubt".into(),
            });
            return Err(LogError::InDoubt {
                log_partition: 0,
                reason: "injected: written, acknowledgement lost".into(),
            });
        }
        Ok(positions)
    }
}

fn fenced(writer_id: &str) -> LogError {
    LogError::Fenced {
        writer_id: writer_id.to_string(),
        log_partition: 0,
    }
}

fn check_partition(log_partition: u32) -> Result<(), LogError> {
    if log_partition == 0 {
        Ok(())
    } else {
        Err(LogError::Invalid(format!(
            "the memory log has only log partition 0, not {log_partition}"
        )))
    }
}

impl EventReader for MemoryLog {
    fn log_partition_for(&self, _key: &PartitionKey) -> u32 {
        0
    }

    fn log_partitions(&self) -> u32 {
        1
    }

    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        check_partition(log_partition)?;
        let stored = self.stored.lock().expect("memory log lock");
        if from_offset < stored.start {
            return Err(LogError::Storage(format!(
                "offset {from_offset} was deleted: the log starts at {}",
                stored.start
            )));
        }
        Ok(stored
            .entries
            .iter()
            .enumerate()
            .skip(usize::try_from(from_offset).unwrap_or(usize::MAX))
            .take(max)
            .map(|(i, e)| {
                (
                    Position {
                        log_partition: 0,
                        offset: i as u64,
                    },
                    e.clone(),
                )
            })
            .collect())
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        check_partition(log_partition)?;
        Ok(self.len() as u64)
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        check_partition(log_partition)?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.appended.notified();
            if (self.len() as u64) > offset {
                return Ok(true);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(false);
            }
        }
    }
}

impl EventLog for MemoryLog {
    fn ordered_appends(&self) -> bool {
        self.ordered
    }

    /// Superseded: a later claim than `claim` is in the log.
    async fn confirm_claim(&self, log_partition: u32, claim: &Claim) -> Result<(), LogError> {
        check_partition(log_partition)?;
        match self.latest_claim() {
            Some(latest) if latest == *claim => Ok(()),
            _ => Err(fenced(&claim.writer_id)),
        }
    }

    /// Claims again for the writer of the latest claim.
    async fn reclaim(&self, _log_partition: u32) -> Result<Claim, LogError> {
        match self.latest_claim() {
            Some(latest) => Ok(self.claim(&latest.writer_id)),
            None => Err(LogError::Invalid("never claimed".into())),
        }
    }

    /// The outcome is decided at the call (ordered appends); the future only
    /// waits for the configured delay.
    fn append(
        &self,
        batch: Vec<Record>,
    ) -> impl std::future::Future<Output = Result<Vec<Position>, LogError>> + Send {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let outcome = self.append_now(batch);
        let delay = *self.delay.lock().expect("memory log lock");
        let held = self.held.clone();
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            while held.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            outcome
        }
    }
}
