//! Local snapshots of the writer's state, so a restart replays only the log
//! after the snapshot instead of all of it. The log stays the only truth: a
//! snapshot that is missing, unreadable, of another format, or ahead of the log
//! is ignored, and recovery replays from offset 0.
//!
//! Consistency without stopping the writers: the snapshotter first reads the
//! log's end offset `E`, then asks each shard for its state between two batches.
//! A shard handles requests in order and has at most one batch in flight, so
//! every record of its partitions below `E` is already in the state it hands
//! over; records at or after `E` may or may not be. Recovery therefore replays
//! from `E` and skips events whose sequence the partition already has.
//! A snapshot request decided in a batch may see that batch's speculative
//! events; its answer is sent only if the batch's append succeeded (else it is
//! a 503 and no snapshot is written), so a snapshot never holds an event the
//! log does not.
//!
//! Only for a log this process alone writes (the embedded log, under RocksDB's
//! lock): the validity state at `E` is then this process's own claim.

use std::io::Write;
use std::path::{Path, PathBuf};

use reservoir_core::{Partition, PartitionKey, ReservationId};
use serde::{Deserialize, Serialize};

use crate::writer::{PartitionState, ShardState};

/// v2: partitions hold only the records in memory (open, and finished inside
/// the idempotency window) and the finished queue; a v1 file (every record)
/// is ignored and the log replayed.
pub const FORMAT: &str = "reservoir.snapshot.v2";

/// Where a log partition's replay resumes, and the claim in force there.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cut {
    pub log_partition: u32,
    pub next_offset: u64,
    pub claim_writer_id: String,
    pub claim_epoch: u64,
}

/// A log position as the snapshot file spells it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct SnapPosition {
    pub log_partition: u32,
    pub offset: u64,
}

impl From<reservoir_log::Position> for SnapPosition {
    fn from(p: reservoir_log::Position) -> Self {
        SnapPosition {
            log_partition: p.log_partition,
            offset: p.offset,
        }
    }
}

impl From<SnapPosition> for reservoir_log::Position {
    fn from(p: SnapPosition) -> Self {
        reservoir_log::Position {
            log_partition: p.log_partition,
            offset: p.offset,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapPartition {
    pub key: PartitionKey,
    pub partition: Partition,
    pub positions: Vec<(ReservationId, SnapPosition)>,
    pub opened_at: Option<SnapPosition>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    pub format: String,
    pub cuts: Vec<Cut>,
    pub partitions: Vec<SnapPartition>,
    /// (subject, route) → active partition.
    pub active: Vec<(String, String, PartitionKey)>,
}

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshot.json")
}

/// One shard's part of a snapshot.
pub fn capture(state: &ShardState) -> (Vec<SnapPartition>, Vec<(String, String, PartitionKey)>) {
    let partitions = state
        .partitions
        .iter()
        .map(|(key, ps)| SnapPartition {
            key: key.clone(),
            partition: ps.partition.clone(),
            positions: ps
                .positions
                .iter()
                .map(|(id, p)| (id.clone(), (*p).into()))
                .collect(),
            opened_at: ps.opened_at.map(Into::into),
        })
        .collect();
    let active = state
        .active
        .iter()
        .map(|((s, r), k)| (s.clone(), r.clone(), k.clone()))
        .collect();
    (partitions, active)
}

/// Writes atomically: a temporary file, fsynced, renamed over the old one, and
/// the directory fsynced, so a crash leaves either snapshot, never half of one.
pub fn write(data_dir: &Path, snapshot: &Snapshot) -> std::io::Result<u64> {
    let final_path = path(data_dir);
    let tmp = data_dir.join("snapshot.json.tmp");
    let bytes = serde_json::to_vec(snapshot).map_err(std::io::Error::other)?;
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &final_path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok(bytes.len() as u64)
}

/// The snapshot in `data_dir`, if there is a usable one.
pub fn read(data_dir: &Path) -> Option<Snapshot> {
    let bytes = match std::fs::read(path(data_dir)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(%e, "snapshot unreadable; replaying the whole log");
            return None;
        }
    };
    match serde_json::from_slice::<Snapshot>(&bytes) {
        Ok(s) if s.format == FORMAT => Some(s),
        Ok(s) => {
            tracing::warn!(format = %s.format, "snapshot of another format; replaying the whole log");
            None
        }
        Err(e) => {
            tracing::warn!(%e, "snapshot corrupt; replaying the whole log");
            None
        }
    }
}

impl SnapPartition {
    pub fn into_state(self) -> (PartitionKey, PartitionState) {
        let state = PartitionState {
            partition: self.partition,
            positions: self
                .positions
                .into_iter()
                .map(|(id, p)| (id, p.into()))
                .collect(),
            opened_at: self.opened_at.map(Into::into),
        };
        (self.key, state)
    }
}
