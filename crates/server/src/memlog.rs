//! An in-memory [`EventLog`] with fault injection, for tests of the writer at its
//! own trait boundary: `fail_next_appends(n)` makes the next `n` appends fail
//! with a transient error and write nothing, like a RocksDB write that was
//! refused; `fail_next_append_fatally()` fails one with a non-transient error.
//! Not durable; `reservoir serve --log memory` only, for trying the API.

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
    appended: tokio::sync::Notify,
}

impl MemoryLog {
    pub fn new() -> Self {
        Self::default()
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

impl EventLog for MemoryLog {
    fn log_partition_for(&self, _key: &PartitionKey) -> u32 {
        0
    }

    fn log_partitions(&self) -> u32 {
        1
    }

    async fn append(&self, batch: Vec<Record>) -> Result<Vec<Position>, LogError> {
        let failed = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failed {
            if self.fatal.load(Ordering::SeqCst) {
                return Err(LogError::Storage("injected fatal append failure".into()));
            }
            return Err(LogError::Unavailable("injected append failure".into()));
        }
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
        Ok(positions)
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
