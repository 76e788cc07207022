//! Reading the topic: how stored values are decoded, how far a read goes, and
//! [`EventReader`] for the Kafka log (the reads themselves are `Inner`'s).

use super::*;

/// How long a read waits for a first sign of data before it concludes it sits
/// inside a batch the broker will not serve from there (see `read_locked`).
pub(super) const READ_PROBE: Duration = Duration::from_millis(100);

/// What a read makes of each stored value.
pub(super) type Decode<T> = fn(Position, &[u8]) -> Result<T, LogError>;

pub(super) fn decode_entry(position: Position, value: &[u8]) -> Result<LogEntry, LogError> {
    codec::decode(value).map_err(|e| LogError::Corrupt {
        position,
        reason: e.to_string(),
    })
}

/// Claims only: a record never changes validity state, so the writer's own
/// checks (claiming, reading back) look at the frame header and decode claims
/// alone. A value that is not even framed is still reported corrupt.
pub(super) fn decode_claim(position: Position, value: &[u8]) -> Result<Option<Claim>, LogError> {
    let corrupt = |reason: String| LogError::Corrupt { position, reason };
    let (id, _datum) = codec::split_frame(value).map_err(|e| corrupt(e.to_string()))?;
    let schema = codec::registry()
        .get(id)
        .ok_or_else(|| corrupt(format!("unknown schema id {id}")))?;
    if schema.subject.strip_prefix(codec::NAMESPACE) != Some(".Claim") {
        return Ok(None);
    }
    match codec::decode(value).map_err(|e| corrupt(e.to_string()))? {
        LogEntry::Claim(claim) => Ok(Some(claim)),
        LogEntry::Record(_) => Err(corrupt(format!(
            "schema id {id} is a claim but decoded as a record"
        ))),
    }
}

/// How far a read goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadTo {
    /// Entries known to exist (acknowledged): wait for every one before this offset.
    Acknowledged(u64),
    /// To the end of the log, as the broker's fetch responses report it.
    EndOfLog,
}

impl EventReader for KafkaLog {
    fn log_partition_for(&self, key: &PartitionKey) -> u32 {
        log_partition_of_route(&key.subject, &key.route, self.inner.log_partitions)
    }

    fn log_partitions(&self) -> u32 {
        self.inner.log_partitions
    }

    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        self.check_partition(log_partition)?;
        let inner = self.inner.clone();
        blocking(move || {
            inner.read_blocking(
                log_partition,
                from_offset,
                max,
                ReadTo::EndOfLog,
                decode_entry,
            )
        })
        .await?
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        self.check_partition(log_partition)?;
        let inner = self.inner.clone();
        blocking(move || inner.end_offset_blocking(log_partition)).await?
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        const POLL_INTERVAL: Duration = Duration::from_millis(20);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.end_offset(log_partition).await? > offset {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
        }
    }
}
