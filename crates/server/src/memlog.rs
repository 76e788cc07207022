//! An in-memory [`EventLog`] with fault injection, for tests of the writer at its
//! own trait boundary: `fail_next_appends(n)` makes the next `n` appends fail
//! with a transient error and write nothing, like a RocksDB write that was
//! refused; `fail_next_append_fatally()` fails one with a non-transient error.
//! Not durable; `reservoir serve --log memory` only, for trying the API.
//!
//! `fail_next_append_in_doubt()` writes the next append and then fails it with
//! [`LogError::InDoubt`], like a Kafka append whose records landed but whose
//! acknowledgement was lost; the log then refuses appends (InDoubt) until it is
//! claimed again. [`MemoryLog::ordered`] gives a log with
//! [`EventLog::ordered_appends`] (the writer pipelines on it): every failure
//! makes it refuse all later appends until it is claimed again, and
//! `set_append_delay` keeps each append in flight for a while.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use reservoir_core::PartitionKey;
use reservoir_log::{Claim, EventLog, LogEntry, LogError, Position, Record};

#[derive(Default)]
pub struct MemoryLog {
    entries: Mutex<Vec<LogEntry>>,
    failures: AtomicUsize,
    fatal: std::sync::atomic::AtomicBool,
    in_doubt_next: std::sync::atomic::AtomicBool,
    /// Why appends are refused until the next claim.
    refusing: Mutex<Option<LogError>>,
    ordered: bool,
    delay: Mutex<Duration>,
    /// While set, every append stays in flight (its outcome already fixed).
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
    calls: AtomicUsize,
    /// The writer id of the latest claim (for `reclaim`).
    claimant: Mutex<Option<String>>,
    appended: tokio::sync::Notify,
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
        *self.delay.lock().expect("memlog lock") = delay;
    }

    /// Holds every append in flight until `release_appends`: lets a test order
    /// events without depending on timing.
    pub fn hold_appends(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    pub fn release_appends(&self) {
        self.held.store(false, Ordering::SeqCst);
    }

    /// The next append is written, then answered `InDoubt`.
    pub fn fail_next_append_in_doubt(&self) {
        self.in_doubt_next.store(true, Ordering::SeqCst);
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
    /// embedded and Kafka logs do; records must then carry it.
    pub fn claim(&self, writer_id: &str) -> Claim {
        let mut entries = self.entries.lock().expect("memlog lock");
        let top = entries
            .iter()
            .filter_map(|e| match e {
                LogEntry::Claim(c) => Some(c.epoch),
                LogEntry::Record(_) => None,
            })
            .max()
            .unwrap_or(0);
        let claim = Claim {
            writer_id: writer_id.to_string(),
            epoch: top + 1,
        };
        entries.push(LogEntry::Claim(claim.clone()));
        drop(entries);
        *self.refusing.lock().expect("memlog lock") = None;
        *self.claimant.lock().expect("memlog lock") = Some(writer_id.to_string());
        claim
    }

    pub fn len(&self) -> usize {
        self.entries.lock().expect("memlog lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn records(&self) -> Vec<Record> {
        let entries = self.entries.lock().expect("memlog lock");
        entries
            .iter()
            .filter_map(|e| match e {
                LogEntry::Record(r) => Some(r.clone()),
                LogEntry::Claim(_) => None,
            })
            .collect()
    }
}

impl MemoryLog {
    fn append_now(&self, batch: Vec<Record>) -> Result<Vec<Position>, LogError> {
        let mut refusing = self.refusing.lock().expect("memlog lock");
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
        let in_doubt = self.in_doubt_next.swap(false, Ordering::SeqCst);
        let mut entries = self.entries.lock().expect("memlog lock");
        let positions = batch
            .into_iter()
            .map(|record| {
                entries.push(LogEntry::Record(record));
                Position {
                    log_partition: 0,
                    offset: entries.len() as u64 - 1,
                }
            })
            .collect();
        drop(entries);
        self.appended.notify_waiters();
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

impl EventLog for MemoryLog {
    fn log_partition_for(&self, _key: &PartitionKey) -> u32 {
        0
    }

    fn log_partitions(&self) -> u32 {
        1
    }

    fn ordered_appends(&self) -> bool {
        self.ordered
    }

    async fn reclaim(&self, _log_partition: u32) -> Result<Claim, LogError> {
        let claimant = self.claimant.lock().expect("memlog lock").clone();
        match claimant {
            Some(writer_id) => Ok(self.claim(&writer_id)),
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
        let delay = *self.delay.lock().expect("memlog lock");
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

    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        if log_partition != 0 {
            return Err(LogError::Invalid(format!(
                "no log partition {log_partition}"
            )));
        }
        let entries = self.entries.lock().expect("memlog lock");
        Ok(entries
            .iter()
            .enumerate()
            .skip(from_offset as usize)
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

    async fn end_offset(&self, _log_partition: u32) -> Result<u64, LogError> {
        Ok(self.len() as u64)
    }

    async fn wait_for(
        &self,
        _log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
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
