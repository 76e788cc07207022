//! Recovery: rebuild every shard's state by replaying the log from the start.
//!
//! Each log partition is read in offset order. When the log carries claims (the
//! Kafka log), every entry goes through [`fence::Validity`] and only records of
//! the current claim holder count; a log without any claim (the embedded log,
//! one process) counts every record. Events are folded with `try_apply`: an event
//! whose sequence is at or below the partition's last one is a duplicate and is
//! skipped; any other failure is a corrupt log and stops recovery, so the server
//! never serves from state it cannot explain.

use std::collections::HashMap;

use reservoir_core::{try_apply, PartitionKey, ReservationId};
use reservoir_log::fence::{Validity, Verdict};
use reservoir_log::{EventLog, LogEntry};

use crate::writer::{shard_of, ShardState};

/// Entries read from the log per call.
pub const RECOVERY_READ_BATCH: usize = 4_096;

/// What recovery rebuilt.
pub struct Recovered {
    pub shards: Vec<ShardState>,
    pub index: HashMap<ReservationId, PartitionKey>,
    pub records: u64,
    pub events: u64,
    pub skipped_records: u64,
}

/// Replays every log partition into `shards` shard states.
pub async fn recover<L: EventLog>(log: &L, shards: usize) -> Result<Recovered, String> {
    let mut out = Recovered {
        shards: (0..shards).map(|_| ShardState::default()).collect(),
        index: HashMap::new(),
        records: 0,
        events: 0,
        skipped_records: 0,
    };
    for log_partition in 0..log.log_partitions() {
        let end = log
            .end_offset(log_partition)
            .await
            .map_err(|e| e.to_string())?;
        let mut validity = Validity::default();
        let mut offset = 0;
        while offset < end {
            let entries = log
                .read(log_partition, offset, RECOVERY_READ_BATCH)
                .await
                .map_err(|e| format!("reading log partition {log_partition} at {offset}: {e}"))?;
            if entries.is_empty() {
                break;
            }
            for (position, entry) in entries {
                offset = position.offset + 1;
                let counts = match (&entry, validity.current_claim()) {
                    (LogEntry::Record(_), None) => true,
                    _ => validity.observe(&entry) == Verdict::Counts,
                };
                let LogEntry::Record(record) = entry else {
                    continue;
                };
                if !counts {
                    out.skipped_records += 1;
                    continue;
                }
                out.records += 1;
                let shard =
                    &mut out.shards[shard_of(&record.key.subject, &record.key.route, shards)];
                let ps = shard.partitions.entry(record.key.clone()).or_default();
                let mut applied = Vec::with_capacity(record.events.len());
                for event in &record.events {
                    if event.sequence <= ps.partition.last_sequence {
                        continue;
                    }
                    try_apply(&mut ps.partition, event).map_err(|e| {
                        format!(
                            "log partition {log_partition} offset {}: {}: {e}",
                            position.offset, record.key
                        )
                    })?;
                    applied.push(event);
                }
                out.events += applied.len() as u64;
                for event in applied {
                    if let reservoir_core::EventBody::Reserved { id, .. } = &event.body {
                        out.index.insert(id.clone(), record.key.clone());
                    }
                    shard.note_committed(&record.key, &event.body, position);
                }
            }
        }
    }
    for shard in &out.shards {
        for (key, ps) in &shard.partitions {
            ps.partition
                .check_invariants()
                .map_err(|e| format!("partition {key} breaks an invariant after recovery: {e}"))?;
        }
    }
    Ok(out)
}
