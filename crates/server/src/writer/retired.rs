//! The idempotency index: every reservation record that left the writer's
//! memory ([`reservoir_core::retention`]), on disk, so a retry of any id ever
//! used is answered from its original record and never makes a second one.
//!
//! A RocksDB database of its own (`<data dir>/retired`, one per log partition
//! in cluster mode), keyed by reservation id (ids are unique across the
//! server), with a bloom filter on keys and on the memtable so that the lookup
//! every new reserve makes (a miss) is answered from memory. Values are JSON
//! of [`Retired`]: the partition, the position of the record's last event and
//! the record itself.
//!
//! Durability follows the snapshot: writes go to RocksDB's WAL unsynced, and
//! [`RetiredIndex::sync`] runs before a snapshot is written, so everything a
//! snapshot no longer holds in memory is on disk. Records evicted after the
//! snapshot are evicted again when recovery replays the log past it, and
//! written again (the same bytes). Without a snapshot, recovery replays the
//! whole log and rewrites all of it: the log stays the only truth.

use std::path::Path;

use reservoir_core::{PartitionKey, Reservation, ReservationId};
use reservoir_log::Position;
use rocksdb::{Options, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};

/// Records written per batch when recovery rewrites the index.
pub const RETIRED_WRITE_BATCH: usize = 4_096;

/// One record that left memory, as the index keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    pub key: PartitionKey,
    /// `(log partition, offset)` of the record's last event.
    pub position: (u32, u64),
    pub reservation: Reservation,
}

impl Retired {
    pub fn new(key: PartitionKey, position: Position, reservation: Reservation) -> Retired {
        Retired {
            key,
            position: (position.log_partition, position.offset),
            reservation,
        }
    }

    pub fn position(&self) -> Position {
        Position {
            log_partition: self.position.0,
            offset: self.position.1,
        }
    }
}

/// The on-disk index (see the module docs). Shared by the shards and the API.
pub struct RetiredIndex {
    db: DB,
}

impl std::fmt::Debug for RetiredIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetiredIndex").finish_non_exhaustive()
    }
}

impl RetiredIndex {
    /// Opens (or creates) the index in `dir`.
    pub fn open(dir: &Path) -> Result<RetiredIndex, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the idempotency index {}: {e}", dir.display()))?;
        let mut table =
            reservoir_log::rocks::table_options(&rocksdb::Cache::new_lru_cache(16 << 20));
        table.set_bloom_filter(10.0, false);
        table.set_whole_key_filtering(true);
        let mut options = Options::default();
        options.create_if_missing(true);
        // Memory stays small whatever the index holds: 16 MiB of memtables.
        options.set_write_buffer_size(8 << 20);
        options.set_max_write_buffer_number(2);
        options.set_block_based_table_factory(&table);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        options.set_memtable_whole_key_filtering(true);
        options.set_memtable_prefix_bloom_ratio(0.1);
        let db = DB::open(&options, dir)
            .map_err(|e| format!("cannot open the idempotency index {}: {e}", dir.display()))?;
        Ok(RetiredIndex { db })
    }

    /// Writes `records` in one batch (WAL, unsynced: see [`RetiredIndex::sync`]).
    pub fn put_all<'a>(
        &self,
        records: impl IntoIterator<Item = &'a Retired>,
    ) -> Result<(), String> {
        let mut batch = WriteBatch::default();
        for r in records {
            let value = serde_json::to_vec(r).expect("records serialize");
            batch.put(r.reservation.id.as_str().as_bytes(), value);
        }
        if batch.is_empty() {
            return Ok(());
        }
        let mut options = WriteOptions::default();
        options.set_sync(false);
        self.db
            .write_opt(batch, &options)
            .map_err(|e| format!("idempotency index write: {e}"))
    }

    /// The record of `id`, if it left memory.
    pub fn get(&self, id: &ReservationId) -> Result<Option<Retired>, String> {
        self.get_with(id, |bytes| Self::decode(id, bytes))?
            .transpose()
    }

    /// The stored bytes of `id`'s record, if it left memory, handed to
    /// `read` without a copy (decode them with [`RetiredIndex::decode`]).
    /// For a reader that keeps what it decoded and decodes again only when
    /// the bytes change: the simulator's checker, which reads every retired
    /// record again after each restart.
    pub fn get_with<T>(
        &self,
        id: &ReservationId,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>, String> {
        let found = self
            .db
            .get_pinned(id.as_str().as_bytes())
            .map_err(|e| format!("idempotency index read: {e}"))?;
        metrics::counter!(
            "reservoir_retired_lookups_total",
            "result" => if found.is_some() { "hit" } else { "miss" }
        )
        .increment(1);
        Ok(found.map(|bytes| read(&bytes)))
    }

    /// A record as [`RetiredIndex::get_with`] hands it over.
    pub fn decode(id: &ReservationId, bytes: &[u8]) -> Result<Retired, String> {
        serde_json::from_slice(bytes)
            .map_err(|e| format!("idempotency index entry for {id} is corrupt: {e}"))
    }

    /// Makes every write so far durable (before a snapshot is written).
    pub fn sync(&self) -> Result<(), String> {
        self.db
            .flush_wal(true)
            .map_err(|e| format!("idempotency index sync: {e}"))
    }
}
