//! A running embedded log read from another process: [`SecondaryLog`] opens
//! the log directory as a RocksDB *secondary* instance, which takes no lock
//! (the writing process keeps its primary open) and writes nothing to it; new
//! entries appear as the secondary catches up with the primary's write-ahead
//! log. It is an [`EventReader`] and nothing more, so a process reading
//! through it (`reservoir project`, replay) can never append or claim.
//!
//! Same layout as the primary (column family `entries`, big-endian offset
//! keys, [`crate::codec`] values); one log partition.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reservoir_core::PartitionKey;
use rocksdb::{ColumnFamilyDescriptor, IteratorMode, Options, ReadOptions, DB};

use super::{check_partition, read_range, ENTRIES_CF, FORMAT_TAG, META_CF, META_FORMAT};
use crate::{EventReader, LogEntry, LogError, Position};

/// Shortest interval between two catch-ups of a secondary with the primary.
pub const CATCH_UP_INTERVAL: Duration = Duration::from_millis(20);
/// Read-ahead of a bulk scan ([`SecondaryLog::for_each_value`]).
pub const SCAN_READAHEAD_BYTES: usize = 4 << 20;

/// An embedded log's directory, followed read-only as a RocksDB secondary.
pub struct SecondaryLog {
    db: DB,
    /// End offset as of the last catch-up, and when that was.
    caught_up: Mutex<(u64, Instant)>,
    path: PathBuf,
}

impl std::fmt::Debug for SecondaryLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecondaryLog")
            .field("path", &self.path)
            .field("caught_up_end", &self.caught_up_end())
            .finish()
    }
}

impl SecondaryLog {
    /// Opens `log_dir` (a server's `<data-dir>/log`) as a secondary whose own
    /// files go to `secondary_dir` (created if missing), caught up with the
    /// primary. Refuses a directory that is not an embedded log (no RocksDB
    /// files, or another format tag) with [`LogError::Invalid`].
    pub fn open(log_dir: &Path, secondary_dir: &Path) -> Result<Self, LogError> {
        if !log_dir.join("CURRENT").exists() {
            return Err(LogError::Invalid(format!(
                "{} is not an embedded log directory (no RocksDB CURRENT file)",
                log_dir.display()
            )));
        }
        std::fs::create_dir_all(secondary_dir).map_err(|e| {
            LogError::Storage(format!("cannot create {}: {e}", secondary_dir.display()))
        })?;
        let storage = |e: rocksdb::Error| LogError::Storage(format!("{}: {e}", log_dir.display()));
        let mut options = Options::default();
        // Keep every table file open: the primary may compact (delete) one while
        // this instance still lists it.
        options.set_max_open_files(-1);
        let cfs = [ENTRIES_CF, META_CF].map(|n| ColumnFamilyDescriptor::new(n, Options::default()));
        let db = DB::open_cf_descriptors_as_secondary(&options, log_dir, secondary_dir, cfs)
            .map_err(storage)?;
        db.try_catch_up_with_primary().map_err(storage)?;
        let meta = db
            .cf_handle(META_CF)
            .ok_or_else(|| LogError::Invalid("no meta column family".into()))?;
        match db.get_cf(meta, META_FORMAT).map_err(storage)? {
            Some(tag) if tag == FORMAT_TAG => {}
            other => {
                return Err(LogError::Invalid(format!(
                    "{} is not a reservoir embedded log (format tag {:?})",
                    log_dir.display(),
                    other.map(|t| String::from_utf8_lossy(&t).into_owned())
                )))
            }
        }
        let log = SecondaryLog {
            db,
            caught_up: Mutex::new((0, Instant::now())),
            path: log_dir.to_path_buf(),
        };
        let end = log.last_end()?;
        *log.caught_up.lock().unwrap_or_else(|e| e.into_inner()) = (end, Instant::now());
        Ok(log)
    }

    /// The primary's log directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The end offset as of the last catch-up, without catching up: for a
    /// reader that wants a fixed snapshot (replay reads to the end it saw at
    /// open, while the server goes on writing).
    pub fn caught_up_end(&self) -> u64 {
        self.caught_up.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Catches up with the primary (at most every [`CATCH_UP_INTERVAL`]) and
    /// returns the end offset. Entries are written in offset order in atomic
    /// batches, so everything below the end is there.
    pub fn end(&self) -> Result<u64, LogError> {
        let mut caught_up = self.caught_up.lock().unwrap_or_else(|e| e.into_inner());
        if caught_up.1.elapsed() < CATCH_UP_INTERVAL {
            return Ok(caught_up.0);
        }
        self.db
            .try_catch_up_with_primary()
            .map_err(|e| self.unavailable(e))?;
        let end = self.last_end()?.max(caught_up.0);
        *caught_up = (end, Instant::now());
        Ok(end)
    }

    /// Hands each stored value of `[from, until)` to `each` with its offset, in
    /// offset order and undecoded: for a reader that decodes in bulk and
    /// reports a value that does not decode at its position (replay). An
    /// offset without a value (a hole) is skipped, so `each` sees a gap. A bulk
    /// scan: it bypasses the block cache and reads ahead
    /// [`SCAN_READAHEAD_BYTES`].
    pub fn for_each_value(
        &self,
        from: u64,
        until: u64,
        mut each: impl FnMut(u64, &[u8]),
    ) -> Result<(), LogError> {
        let entries = self.entries_cf()?;
        let mut options = ReadOptions::default();
        options.set_iterate_upper_bound(until.to_be_bytes().to_vec());
        options.fill_cache(false);
        options.set_readahead_size(SCAN_READAHEAD_BYTES);
        let mut iter = self.db.raw_iterator_cf_opt(entries, options);
        iter.seek(from.to_be_bytes());
        while iter.valid() {
            let (Some(key), Some(value)) = (iter.key(), iter.value()) else {
                break;
            };
            // A key that is not an offset is not an entry: its offset shows
            // as a hole.
            if let Some(offset) = offset_of(key) {
                each(offset, value);
            }
            iter.next();
        }
        iter.status().map_err(|e| self.unavailable(e))
    }

    fn entries_cf(&self) -> Result<&rocksdb::ColumnFamily, LogError> {
        self.db
            .cf_handle(ENTRIES_CF)
            .ok_or_else(|| LogError::Invalid("no entries column family".into()))
    }

    fn unavailable(&self, e: impl std::fmt::Display) -> LogError {
        // Transient: the next catch-up may succeed (the primary moved a file).
        LogError::Unavailable(format!("{}: {e}", self.path.display()))
    }

    /// One past the last entry this instance sees.
    fn last_end(&self) -> Result<u64, LogError> {
        match self
            .db
            .iterator_cf(self.entries_cf()?, IteratorMode::End)
            .next()
        {
            None => Ok(0),
            Some(Ok((key, _))) => Ok(offset_of(&key).map_or(0, |o| o + 1)),
            Some(Err(e)) => Err(self.unavailable(e)),
        }
    }
}

fn offset_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

impl EventReader for SecondaryLog {
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
        let end = self.end()?;
        if from_offset >= end || max == 0 {
            return Ok(Vec::new());
        }
        let until = end.min(from_offset.saturating_add(max as u64));
        read_range(&self.db, from_offset, until, |e| self.unavailable(e))
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        check_partition(log_partition)?;
        self.end()
    }

    /// Polls: a secondary learns of new entries only by catching up.
    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        check_partition(log_partition)?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.end()? > offset {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(CATCH_UP_INTERVAL.min(deadline - now)).await;
        }
    }
}
