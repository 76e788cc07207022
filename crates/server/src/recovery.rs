//! Recovery: rebuild every shard's state by replaying the log from the start.
//!
//! Each log partition is read in offset order, and every entry goes through the
//! one validity rule ([`reservoir_log::fence::valid_records`]): only records of
//! the writer holding the latest claim before them count. Every log the server
//! writes is claimed first (embedded, Kafka, and the in-memory test log). Events are folded with `try_apply`: an event
//! whose sequence is at or below the partition's last one is a duplicate and is
//! skipped; any other failure is a corrupt log and stops recovery, so the server
//! never serves from state it cannot explain.
//!
//! With a [`Snapshot`] (see [`crate::snapshot`]) the shards start from it and
//! each log partition is read from the snapshot's cut, with the validity state
//! seeded by the claim in force there. A snapshot ahead of the log is ignored.
//!
//! Records that leave memory while the log is replayed (their idempotency
//! window passed, by the same rule as live) are written to the idempotency
//! index again, so it holds everything the log says left memory even if the
//! process died before its own write reached the disk.

use std::collections::HashMap;

use reservoir_core::{try_apply_evicting, PartitionKey, ReservationId};
use reservoir_log::fence::{valid_records, Validity};
use reservoir_log::{Claim, EventReader, LogEntry};

use crate::snapshot::Snapshot;
use crate::writer::retired::RETIRED_WRITE_BATCH;
use crate::writer::{shard_of, DueKind, FastMap, Retired, RetiredIndex, ShardState};

/// Entries read from the log per call.
pub const RECOVERY_READ_BATCH: usize = 4_096;

/// What recovery rebuilt.
pub struct Recovered {
    pub shards: Vec<ShardState>,
    pub index: FastMap<ReservationId, PartitionKey>,
    pub records: u64,
    pub events: u64,
    pub skipped_records: u64,
    /// Records that left memory during the replay (written to the index,
    /// except by [`replay_state`]).
    pub evicted: u64,
    /// Whether recovery started from a snapshot.
    pub from_snapshot: bool,
}

/// Rebuilds `shards` shard states from `snapshot` (if usable) and the log.
pub async fn recover<L: EventReader>(
    log: &L,
    shards: usize,
    snapshot: Option<Snapshot>,
    retired: &RetiredIndex,
) -> Result<Recovered, String> {
    if let Some(snapshot) = snapshot {
        let mut usable = true;
        for cut in &snapshot.cuts {
            if cut.log_partition >= log.log_partitions() {
                usable = false;
                continue;
            }
            let end = log
                .end_offset(cut.log_partition)
                .await
                .map_err(|e| e.to_string())?;
            if cut.next_offset > end {
                tracing::warn!(
                    cut.log_partition,
                    cut.next_offset,
                    end,
                    "snapshot is ahead of the log; ignored"
                );
                usable = false;
            }
        }
        if usable {
            return replay(log, shards, Some(snapshot), Some(retired)).await;
        }
    }
    replay(log, shards, None, Some(retired)).await
}

/// The state a replay of the whole log gives, with nothing written to any
/// idempotency index: for a check that holds live state to a replay (the
/// simulator's checker), where those writes would only be thrown away.
/// `evicted` still counts what left memory.
pub async fn replay_state<L: EventReader>(log: &L, shards: usize) -> Result<Recovered, String> {
    replay(log, shards, None, None).await
}

async fn replay<L: EventReader>(
    log: &L,
    shards: usize,
    snapshot: Option<Snapshot>,
    retired: Option<&RetiredIndex>,
) -> Result<Recovered, String> {
    let mut out = Recovered {
        shards: (0..shards).map(|_| ShardState::default()).collect(),
        index: FastMap::default(),
        records: 0,
        events: 0,
        skipped_records: 0,
        evicted: 0,
        from_snapshot: snapshot.is_some(),
    };
    let mut evicted = Vec::new();
    let mut to_write: Vec<Retired> = Vec::new();
    let mut starts: HashMap<u32, (u64, Validity)> = HashMap::new();
    if let Some(snapshot) = snapshot {
        for cut in snapshot.cuts {
            let mut validity = Validity::default();
            validity.observe(&LogEntry::Claim(Claim {
                writer_id: cut.claim_writer_id,
                epoch: cut.claim_epoch,
            }));
            starts.insert(cut.log_partition, (cut.next_offset, validity));
        }
        for part in snapshot.partitions {
            let (key, ps) = part.into_state();
            let shard = &mut out.shards[shard_of(&key.subject, &key.route, shards)];
            for (id, r) in &ps.partition.reservations {
                out.index.insert(id.clone(), key.clone());
                use reservoir_core::ReservationState as S;
                match (r.state, r.execution_deadline_ms) {
                    (S::Reserved | S::Expiring, _) => {
                        shard.due.insert((
                            r.expires_at_ms,
                            DueKind::LeaseExpiry,
                            key.clone(),
                            id.clone(),
                        ));
                    }
                    (S::Started, Some(due)) => {
                        shard
                            .due
                            .insert((due, DueKind::ExecutionLimit, key.clone(), id.clone()));
                    }
                    _ => {}
                }
            }
            shard.partitions.insert(key, ps);
        }
        for (subject, route, key) in snapshot.active {
            let shard = &mut out.shards[shard_of(&subject, &route, shards)];
            shard.active.insert((subject, route), key);
        }
    }
    for log_partition in 0..log.log_partitions() {
        let end = log
            .end_offset(log_partition)
            .await
            .map_err(|e| e.to_string())?;
        let (mut offset, mut validity) = starts.remove(&log_partition).unwrap_or_default();
        while offset < end {
            let entries = log
                .read(log_partition, offset, RECOVERY_READ_BATCH)
                .await
                .map_err(|e| format!("reading log partition {log_partition} at {offset}: {e}"))?;
            if entries.is_empty() {
                break;
            }
            offset = entries.last().map_or(offset, |(p, _)| p.offset + 1);
            let records_read = entries
                .iter()
                .filter(|(_, e)| matches!(e, LogEntry::Record(_)))
                .count();
            // The one validity rule every reader applies (`reservoir_log::fence`).
            let counting = valid_records(&mut validity, entries);
            out.skipped_records += (records_read - counting.len()) as u64;
            for (position, record) in counting {
                out.records += 1;
                let shard =
                    &mut out.shards[shard_of(&record.key.subject, &record.key.route, shards)];
                let ps = shard.partitions.entry(record.key.clone()).or_default();
                let mut applied = Vec::with_capacity(record.events.len());
                for event in &record.events {
                    if event.sequence <= ps.partition.last_sequence {
                        continue;
                    }
                    try_apply_evicting(&mut ps.partition, event, &mut evicted).map_err(|e| {
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
                for r in evicted.drain(..) {
                    out.index.remove(&r.id);
                    let last = shard.forget(&record.key, &r).ok_or_else(|| {
                        format!(
                            "{}: evicted record {} has no log position",
                            record.key, r.id
                        )
                    })?;
                    out.evicted += 1;
                    if retired.is_some() {
                        to_write.push(Retired::new(record.key.clone(), last, r));
                    }
                }
                if let Some(retired) = retired.filter(|_| to_write.len() >= RETIRED_WRITE_BATCH) {
                    retired.put_all(&to_write)?;
                    to_write.clear();
                }
            }
        }
    }
    if let Some(retired) = retired {
        retired.put_all(&to_write)?;
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
