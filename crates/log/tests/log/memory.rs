//! The memory log (feature `memory`, enabled for this test binary): the shared
//! suite, as a log several writers share; and what only it offers, fault
//! injection.

use std::sync::Arc;
use std::time::Duration;

use reservoir_core::PartitionKey;
use reservoir_log::memory::MemoryLog;
use reservoir_log::{Claim, EventLog, EventReader, LogEntry, LogError, Position, Record};

use crate::fixtures;
use crate::suite::Harness;

/// One `MemoryLog`, shared by every writer the suite opens.
pub struct MemoryHarness {
    log: Arc<MemoryLog>,
}

impl MemoryHarness {
    pub fn new() -> Self {
        Self {
            log: Arc::new(MemoryLog::new()),
        }
    }
}

/// One writer's handle on the shared log. Opening again after a drop gives a
/// new handle on the same entries: what a restart is for a log that lives as
/// long as its process.
pub struct MemoryWriter {
    log: Arc<MemoryLog>,
    writer_id: String,
}

impl EventReader for MemoryWriter {
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
        self.log.read(log_partition, from_offset, max).await
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

impl EventLog for MemoryWriter {
    async fn append(&self, batch: Vec<Record>) -> Result<Vec<Position>, LogError> {
        self.log.append(batch).await
    }
}

impl Harness for MemoryHarness {
    type Log = MemoryWriter;

    async fn open(&self, writer_id: &str) -> MemoryWriter {
        MemoryWriter {
            log: self.log.clone(),
            writer_id: writer_id.to_string(),
        }
    }

    async fn claim(log: &MemoryWriter, log_partition: u32) -> Result<Claim, LogError> {
        if log_partition != 0 {
            return Err(LogError::Invalid(format!(
                "the memory log has only log partition 0, not {log_partition}"
            )));
        }
        Ok(log.log.claim(&log.writer_id))
    }
}

crate::log_suite!(
    suite,
    crate::memory::MemoryHarness::new(),
    shared_by_writers
);

#[tokio::test]
async fn appends_before_any_claim_are_refused_and_write_nothing() {
    let log = MemoryLog::new();
    let err = log
        .append(vec![fixtures::record("t", "a", 1, 1, 1)])
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Invalid(_)), "{err:?}");
    assert!(log.is_empty());
    assert!(matches!(log.read(1, 0, 1).await, Err(LogError::Invalid(_))));
    assert!(matches!(log.end_offset(1).await, Err(LogError::Invalid(_))));
}

#[tokio::test]
async fn a_refused_batch_does_not_use_up_an_injected_failure() {
    let log = MemoryLog::new();
    let claim = log.claim("a");
    log.fail_next_appends(1);
    let foreign = fixtures::record("t", "b", claim.epoch, 1, 1);
    assert!(matches!(
        log.append(vec![foreign]).await,
        Err(LogError::Invalid(_))
    ));
    let ours = || fixtures::record("t", "a", claim.epoch, 1, 1);
    assert!(matches!(
        log.append(vec![ours()]).await,
        Err(LogError::Unavailable(_))
    ));
    assert_eq!(log.append(vec![ours()]).await.unwrap().len(), 1);
}

/// As the Kafka log's zombie test: the first batch after the newer claim is
/// written (and answered `Fenced`), later ones are refused outright; a claim
/// by the zombie's writer makes it a writer again.
#[tokio::test]
async fn a_zombie_s_first_batch_lands_and_later_ones_write_nothing() {
    for log in [MemoryLog::new(), MemoryLog::ordered()] {
        let old = log.claim("zombie");
        let new = log.claim("usurper");
        let zombie = |sequence| fixtures::record("t", "zombie", old.epoch, sequence, 1);
        let len = log.len();
        assert!(matches!(
            log.append(vec![zombie(1)]).await,
            Err(LogError::Fenced { .. })
        ));
        assert_eq!(log.len(), len + 1, "the first zombie batch is in the log");
        for sequence in 2..4 {
            assert!(matches!(
                log.append(vec![zombie(sequence)]).await,
                Err(LogError::Fenced { .. })
            ));
        }
        assert_eq!(log.len(), len + 1, "later zombie batches are not");
        let usurper = fixtures::record("t", "usurper", new.epoch, 1, 1);
        assert_eq!(log.append(vec![usurper]).await.unwrap().len(), 1);
        let back = log.claim("zombie");
        let record = fixtures::record("t", "zombie", back.epoch, 2, 1);
        assert_eq!(log.append(vec![record]).await.unwrap().len(), 1);
    }
}

/// A writer confirms its claim before answering from memory alone: the
/// holder of the latest claim is confirmed, a superseded one is `Fenced`.
#[tokio::test]
async fn only_the_latest_claim_is_confirmed() {
    let log = MemoryLog::new();
    let old = log.claim("zombie");
    log.confirm_claim(0, &old).await.expect("the only claim");
    let new = log.claim("usurper");
    assert!(matches!(
        log.confirm_claim(0, &old).await,
        Err(LogError::Fenced { .. })
    ));
    log.confirm_claim(0, &new).await.expect("the latest claim");
    assert!(log.confirm_claim(1, &new).await.is_err(), "one partition");
}
