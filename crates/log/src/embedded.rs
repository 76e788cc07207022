//! The embedded log: [`EventLog`] on a local RocksDB, for one process and no
//! broker (the default deployment).
//!
//! One log partition (0). Column family `entries` maps the big-endian offset to
//! exactly the value bytes the Kafka log would carry ([`codec`]); column family
//! `meta` holds the format tag and the latest claim, written in the same batch as
//! the claim entry. So replay and projections read either log alike.
//!
//! Durability and group commit: every write happens under one lock, assigns
//! dense offsets in order, goes to RocksDB as ONE `WriteBatch` with
//! `sync = true`, publishes the new end offset and only then answers. `append`
//! queues, and a dedicated writer thread drains everything queued into one
//! synced write (group commit), so concurrent appenders share each fsync. (An
//! earlier version let an uncontended append write on the caller's thread with
//! `block_in_place`; it saved 4% of latency for one client but cost 15% of
//! throughput for 8 to 64, as it hands the tokio worker's core to another
//! thread on every write.) A batch is
//! acknowledged only after it is on disk, so after a crash the log holds every
//! acknowledged entry, and RocksDB's atomic batches mean nothing torn. Readers
//! never look past the published end, so they never see an entry whose write
//! failed. After a failed write the log refuses further writes (what reached
//! the disk is unknown until it is reopened).
//!
//! Fencing: RocksDB's lock file makes the process the only writer; the log still
//! takes a [`Claim`] like the Kafka log does, so readers apply the one validity
//! rule ([`crate::fence`]) to either log, and `append` refuses records that do
//! not carry the held claim.
//!
//! Another process reads a running log through [`SecondaryLog`] (a RocksDB
//! secondary instance: no lock, no writes), an [`EventReader`] only.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use reservoir_core::PartitionKey;
use rocksdb::{
    ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions, WriteBatch,
    WriteOptions, DB,
};
use tokio::sync::{mpsc, oneshot, watch};

use crate::{codec, Claim, EventLog, EventReader, LogEntry, LogError, Position, Record};

pub mod secondary;
mod tail;
pub use secondary::SecondaryLog;
use tail::Tail;
pub use tail::TAIL_ENTRIES_MAX;

/// Column family holding the entries, keyed by big-endian offset.
pub const ENTRIES_CF: &str = "entries";
/// Column family holding the format tag and the latest claim.
pub const META_CF: &str = "meta";
const META_FORMAT: &[u8] = b"format";
const META_CLAIM: &[u8] = b"latest_claim";
/// Written once at creation; a directory holding anything else is refused.
pub const FORMAT_TAG: &[u8] = b"reservoir.embedded-log.v1";

/// Most records one `append` takes (same bound as the Kafka log).
pub const APPEND_RECORDS_MAX: usize = 16_384;
/// Most entries the writer puts in one synced write (a group of appends).
pub const WRITE_GROUP_ENTRIES_MAX: usize = 65_536;
/// Batches at least this long are freed on the blocking pool (see `append`);
/// shorter ones are kept in the [`Tail`] for the first reader.
const FREE_ASIDE_RECORDS_MIN: usize = 64;
/// Initial buffer space per record; a one-event record encodes to ~180 bytes.
const ENCODED_RECORD_BYTES_GUESS: usize = 224;
/// Appends that may wait for the writer before `append` itself waits to queue.
pub const QUEUE_DEPTH_MAX: usize = 1_024;

/// The RocksDB options the embedded log opens its database with, so a baseline
/// (the append bench) compares like with like.
pub fn rocksdb_options() -> Options {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    // Entries are written once, in key order, and read sequentially. Memtables
    // are the log's memory: capped for the whole database, so a server's
    // resident size does not grow with the traffic it has seen (see
    // bench-results/bounded-state.md).
    options.set_max_write_buffer_number(3);
    options.set_write_buffer_size(16 << 20);
    options.set_db_write_buffer_size(MEMTABLE_BYTES_MAX);
    let cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    options.set_block_based_table_factory(&crate::rocks::table_options(&cache));
    // The `meta` column family is written rarely (claims), so without a cap it
    // is never flushed and pins every write-ahead log file since the first
    // claim: a 10M-event log kept 1.4 GB of WAL that every reader (replay,
    // a restart) had to replay on open. Past this size RocksDB flushes the
    // column families holding the oldest WAL, so old files are released.
    options.set_max_total_wal_size(WAL_TOTAL_BYTES_MAX);
    options
}

/// Memtable bytes of the whole log database (both column families).
pub const MEMTABLE_BYTES_MAX: usize = 32 << 20;
/// Block cache of each column family (index and filter blocks included).
pub const BLOCK_CACHE_BYTES: usize = 16 << 20;

/// Write-ahead log kept before the oldest files' column families are flushed.
pub const WAL_TOTAL_BYTES_MAX: u64 = 256 << 20;

enum Request {
    Append {
        /// The encoded values, back to back; `ends[i]` is where value `i` ends.
        bytes: Vec<u8>,
        ends: Vec<usize>,
        /// The records encoded, for the [`Tail`]; `None` for a batch too
        /// large to keep there.
        records: Option<Vec<Record>>,
        reply: oneshot::Sender<Result<u64, LogError>>,
    },
    Claim {
        writer_id: String,
        reply: oneshot::Sender<Result<(Claim, u64), LogError>>,
    },
}

/// The embedded RocksDB implementation of [`EventLog`].
pub struct EmbeddedLog {
    path: PathBuf,
    writer_id: String,
    db: Arc<DB>,
    shared: Arc<Shared>,
    queue: Option<mpsc::Sender<Request>>,
    /// Offset one past the last acknowledged entry.
    end: watch::Receiver<u64>,
    held: Mutex<Option<Claim>>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EmbeddedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedLog")
            .field("path", &self.path)
            .field("writer_id", &self.writer_id)
            .field("end", &*self.end.borrow())
            .finish()
    }
}

fn storage(context: &str, e: impl std::fmt::Display) -> LogError {
    LogError::Storage(format!("{context}: {e}"))
}

fn offset_key(offset: u64) -> [u8; 8] {
    offset.to_be_bytes()
}

impl EmbeddedLog {
    /// Opens (or creates) the log at `path`, as writer `writer_id`. Fails with
    /// [`LogError::Unavailable`] if another process (or another `EmbeddedLog` in
    /// this one) has it open.
    pub fn open(path: impl AsRef<Path>, writer_id: impl Into<String>) -> Result<Self, LogError> {
        let path = path.as_ref().to_path_buf();
        let cfs =
            [ENTRIES_CF, META_CF].map(|name| ColumnFamilyDescriptor::new(name, rocksdb_options()));
        let db = DB::open_cf_descriptors(&rocksdb_options(), &path, cfs).map_err(|e| {
            let text = e.to_string();
            if text.contains("lock") || text.contains("Resource temporarily unavailable") {
                LogError::Unavailable(format!(
                    "embedded log {} is locked by another process (or already open in this one): {text}",
                    path.display()
                ))
            } else {
                storage(&format!("opening {}", path.display()), text)
            }
        })?;
        let (end, latest_claim) = recover(&db, &path)?;
        let db = Arc::new(db);
        let (end_tx, end_rx) = watch::channel(end);
        let (queue_tx, queue_rx) = mpsc::channel(QUEUE_DEPTH_MAX);
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                db: db.clone(),
                next_offset: end,
                latest_claim,
                end: end_tx,
                failed: None,
            }),
            synced_writes: AtomicU64::new(0),
            tail: Mutex::new(Tail::default()),
        });
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("reservoir-embedded-log".into())
            .spawn(move || run_writer(&writer_shared, queue_rx))
            .map_err(|e| storage("spawning the writer thread", e))?;
        tracing::info!(path = %path.display(), end, "opened embedded log");
        Ok(Self {
            path,
            writer_id: writer_id.into(),
            db,
            shared,
            queue: Some(queue_tx),
            end: end_rx,
            held: Mutex::new(None),
            writer: Some(writer),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn writer_id(&self) -> &str {
        &self.writer_id
    }

    /// Takes the log partition: appends a claim with an epoch above every claim
    /// in the log. Records appended afterwards must carry the returned claim.
    /// Same contract as the Kafka log's `claim`.
    pub async fn claim(&self, log_partition: u32) -> Result<Claim, LogError> {
        check_partition(log_partition)?;
        let (reply, answer) = oneshot::channel();
        self.send(Request::Claim {
            writer_id: self.writer_id.clone(),
            reply,
        })
        .await?;
        let (claim, _offset) = answer.await.map_err(|_| writer_gone())??;
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(claim.clone());
        Ok(claim)
    }

    /// Synced RocksDB writes since open. Below the number of appends when
    /// concurrent appends were committed together.
    pub fn synced_writes(&self) -> u64 {
        self.shared.synced_writes.load(Ordering::Relaxed)
    }

    /// Entries held in the tail for their first reader (see [`tail`]).
    pub fn tail_entries(&self) -> usize {
        self.shared
            .tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The claim this log instance holds, if it has claimed.
    pub fn held_claim(&self) -> Option<Claim> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queues a request for the writer thread without waiting; gives it back
    /// when the queue is full.
    fn try_queue(&self, request: Request) -> Result<Option<Request>, LogError> {
        let queue = self.queue.as_ref().ok_or_else(writer_gone)?;
        match queue.try_send(request) {
            Ok(()) => Ok(None),
            Err(mpsc::error::TrySendError::Full(request)) => Ok(Some(request)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(writer_gone()),
        }
    }

    /// Queues a request for the writer thread.
    async fn send(&self, request: Request) -> Result<(), LogError> {
        let queue = self.queue.as_ref().ok_or_else(writer_gone)?;
        queue.send(request).await.map_err(|_| writer_gone())
    }
}

/// Reads and decodes the entries `[from, until)` of an embedded log's
/// database (this process's, or a [`SecondaryLog`]'s): a
/// missing entry below `until` is `Corrupt` (a hole), as is a value that does
/// not decode; `storage` says what a RocksDB error means to the caller.
pub(crate) fn read_range(
    db: &DB,
    from: u64,
    until: u64,
    storage: impl Fn(rocksdb::Error) -> LogError,
) -> Result<Vec<(Position, LogEntry)>, LogError> {
    let entries = db
        .cf_handle(ENTRIES_CF)
        .ok_or_else(|| LogError::Invalid("no entries column family".into()))?;
    let mut options = ReadOptions::default();
    options.set_iterate_upper_bound(offset_key(until).to_vec());
    let start = offset_key(from);
    let iter = db.iterator_cf_opt(
        entries,
        options,
        IteratorMode::From(&start, Direction::Forward),
    );
    let mut out = Vec::with_capacity(until.saturating_sub(from) as usize);
    let mut expected = from;
    for item in iter {
        let (key, value) = item.map_err(&storage)?;
        let position = Position {
            log_partition: 0,
            offset: expected,
        };
        if key.as_ref() != offset_key(expected) {
            return Err(LogError::Corrupt {
                position,
                reason: format!("hole: found key {key:?}"),
            });
        }
        let entry = codec::decode(&value).map_err(|e| LogError::Corrupt {
            position,
            reason: e.to_string(),
        })?;
        out.push((position, entry));
        expected += 1;
    }
    if expected != until {
        return Err(LogError::Corrupt {
            position: Position {
                log_partition: 0,
                offset: expected,
            },
            reason: "entry below the end missing".into(),
        });
    }
    Ok(out)
}

fn writer_gone() -> LogError {
    LogError::Unavailable("the embedded log's writer thread has stopped".into())
}

fn check_partition(log_partition: u32) -> Result<(), LogError> {
    if log_partition == 0 {
        Ok(())
    } else {
        Err(LogError::Invalid(format!(
            "the embedded log has only log partition 0, not {log_partition}"
        )))
    }
}

/// End offset and latest claim of an existing log; tags a new one.
fn recover(db: &DB, path: &Path) -> Result<(u64, Option<Claim>), LogError> {
    let meta = db
        .cf_handle(META_CF)
        .ok_or_else(|| storage("recover", "no meta column family"))?;
    let entries = db
        .cf_handle(ENTRIES_CF)
        .ok_or_else(|| storage("recover", "no entries column family"))?;
    match db
        .get_cf(meta, META_FORMAT)
        .map_err(|e| storage("recover", e))?
    {
        Some(tag) if tag == FORMAT_TAG => {}
        Some(tag) => {
            return Err(LogError::Invalid(format!(
                "{} holds format {:?}, not {:?}",
                path.display(),
                String::from_utf8_lossy(&tag),
                String::from_utf8_lossy(FORMAT_TAG)
            )))
        }
        None => {
            let mut options = WriteOptions::default();
            options.set_sync(true);
            db.put_cf_opt(meta, META_FORMAT, FORMAT_TAG, &options)
                .map_err(|e| storage("tagging a new log", e))?;
        }
    }
    let end = match db.iterator_cf(entries, IteratorMode::End).next() {
        None => 0,
        Some(Ok((key, _))) => {
            let key: [u8; 8] = key
                .as_ref()
                .try_into()
                .map_err(|_| storage("recover", "entry key is not 8 bytes"))?;
            u64::from_be_bytes(key) + 1
        }
        Some(Err(e)) => return Err(storage("recover", e)),
    };
    let latest_claim = match db
        .get_cf(meta, META_CLAIM)
        .map_err(|e| storage("recover", e))?
    {
        None => None,
        Some(bytes) => match codec::decode(&bytes) {
            Ok(LogEntry::Claim(claim)) => Some(claim),
            other => {
                return Err(storage(
                    "recover",
                    format!("latest claim is unreadable: {other:?}"),
                ))
            }
        },
    };
    Ok((end, latest_claim))
}

/// What every write needs, behind one lock: holding it is being the writer.
struct Core {
    db: Arc<DB>,
    next_offset: u64,
    latest_claim: Option<Claim>,
    end: watch::Sender<u64>,
    /// Set after a failed write: what reached the disk is unknown, so nothing
    /// more is written until the log is reopened and recovered.
    failed: Option<String>,
}

struct Shared {
    core: Mutex<Core>,
    /// Synced writes made since open (each one group of appends and claims).
    synced_writes: AtomicU64,
    /// The newest entries, for their first reader.
    tail: Mutex<Tail>,
}

/// The writer thread: drains everything queued into one group per synced write.
fn run_writer(shared: &Shared, mut queue: mpsc::Receiver<Request>) {
    while let Some(first) = queue.blocking_recv() {
        let mut group = vec![first];
        let mut entries = group_entries(&group[0]);
        while entries < WRITE_GROUP_ENTRIES_MAX {
            match queue.try_recv() {
                Ok(request) => {
                    entries += group_entries(&request);
                    group.push(request);
                }
                Err(_) => break,
            }
        }
        let wrote = shared
            .core
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_group(group, &shared.tail);
        if wrote {
            shared.synced_writes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Core {
    /// Writes one group in one synced write, keeps its entries in `tail` and
    /// answers it; false if nothing was written.
    fn write_group(&mut self, mut group: Vec<Request>, tail: &Mutex<Tail>) -> bool {
        if let Some(reason) = &self.failed {
            let reason = reason.clone();
            reply_all(group, || {
                LogError::Unavailable(format!(
                    "an earlier write failed ({reason}); reopen the log"
                ))
            });
            return false;
        }
        let (Some(entries_cf), Some(meta_cf)) =
            (self.db.cf_handle(ENTRIES_CF), self.db.cf_handle(META_CF))
        else {
            reply_all(group, || storage("write", "column family missing"));
            return false;
        };
        let mut batch = WriteBatch::default();
        let mut offset = self.next_offset;
        // Per request: its first offset, or the claim it makes.
        let mut outcomes: Vec<Result<(u64, Option<Claim>), LogError>> =
            Vec::with_capacity(group.len());
        let mut latest_claim = self.latest_claim.clone();
        for request in &group {
            match request {
                Request::Append { bytes, ends, .. } => {
                    outcomes.push(Ok((offset, None)));
                    let mut start = 0;
                    for &end in ends {
                        batch.put_cf(entries_cf, offset_key(offset), &bytes[start..end]);
                        start = end;
                        offset += 1;
                    }
                }
                Request::Claim { writer_id, .. } => {
                    let epoch = latest_claim.as_ref().map_or(0, |c| c.epoch) + 1;
                    let claim = Claim {
                        writer_id: writer_id.clone(),
                        epoch,
                    };
                    match codec::encode(&LogEntry::Claim(claim.clone())) {
                        Ok(value) => {
                            batch.put_cf(entries_cf, offset_key(offset), &value);
                            batch.put_cf(meta_cf, META_CLAIM, &value);
                            outcomes.push(Ok((offset, Some(claim.clone()))));
                            latest_claim = Some(claim);
                            offset += 1;
                        }
                        Err(e) => outcomes.push(Err(LogError::Invalid(e.to_string()))),
                    }
                }
            }
        }
        let mut options = WriteOptions::default();
        options.set_sync(true);
        if let Err(e) = self.db.write_opt(batch, &options) {
            let reason = e.to_string();
            tracing::error!(error = %reason, "embedded log write failed; refusing further writes");
            self.failed = Some(reason.clone());
            reply_all(group, || {
                LogError::Storage(format!("synced write failed: {reason}"))
            });
            return false;
        }
        assert!(offset >= self.next_offset, "offsets only grow");
        // Durable now: into the tail before the end that makes them readable.
        let dropped = keep_in_tail(&mut group, &outcomes, tail);
        self.next_offset = offset;
        self.latest_claim = latest_claim;
        // Published before anyone is answered: an acknowledged entry is readable.
        self.end.send_replace(offset);
        for (request, outcome) in group.into_iter().zip(outcomes) {
            match (request, outcome) {
                (Request::Append { reply, .. }, Ok((first, _))) => {
                    let _ = reply.send(Ok(first));
                }
                (Request::Claim { reply, .. }, Ok((at, Some(claim)))) => {
                    let _ = reply.send(Ok((claim, at)));
                }
                (Request::Append { reply, .. }, Err(e)) => {
                    let _ = reply.send(Err(e));
                }
                (Request::Claim { reply, .. }, Err(e)) => {
                    let _ = reply.send(Err(e));
                }
                (Request::Claim { reply, .. }, Ok((_, None))) => {
                    let _ = reply.send(Err(storage("claim", "no claim recorded")));
                }
            }
        }
        drop(dropped);
        true
    }
}

/// Moves the written entries of `group` (its first offsets in `outcomes`) into
/// the tail; returns what the tail let go, to be freed once everyone is answered.
fn keep_in_tail(
    group: &mut [Request],
    outcomes: &[Result<(u64, Option<Claim>), LogError>],
    tail: &Mutex<Tail>,
) -> Vec<LogEntry> {
    let mut dropped = Vec::new();
    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
    for (request, outcome) in group.iter_mut().zip(outcomes) {
        match (request, outcome) {
            (Request::Append { records, .. }, Ok((first, _))) => {
                let Some(records) = records.take() else {
                    // Not kept (a large batch): the tail cannot go on past it.
                    tail.clear(&mut dropped);
                    continue;
                };
                for (offset, record) in (*first..).zip(records) {
                    tail.push(offset, LogEntry::Record(record), &mut dropped);
                }
            }
            (Request::Claim { .. }, Ok((at, Some(claim)))) => {
                tail.push(*at, LogEntry::Claim(claim.clone()), &mut dropped);
            }
            // Nothing written at this request's place.
            _ => {}
        }
    }
    dropped
}

fn group_entries(request: &Request) -> usize {
    match request {
        Request::Append { ends, .. } => ends.len(),
        Request::Claim { .. } => 1,
    }
}

/// Answers every request of a group with the same error.
fn reply_all(group: Vec<Request>, error: impl Fn() -> LogError) {
    for request in group {
        match request {
            Request::Append { reply, .. } => {
                let _ = reply.send(Err(error()));
            }
            Request::Claim { reply, .. } => {
                let _ = reply.send(Err(error()));
            }
        }
    }
}

impl Drop for EmbeddedLog {
    fn drop(&mut self) {
        // Closing the queue stops the writer after it has answered everything
        // queued; joining it means the database is closed (and its lock
        // released) once no reader holds it either.
        self.queue.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        // Flush every column family on a clean close, so the next open (or a
        // read-only replay) finds no write-ahead log to replay. Synced writes
        // made everything durable already; a failure here loses nothing.
        for cf in [ENTRIES_CF, META_CF] {
            if let Some(handle) = self.db.cf_handle(cf) {
                let _ = self.db.flush_cf(&handle);
            }
        }
    }
}

/// An append queued at the call: its answer, its record count,
/// and the request still to be queued if the queue was full.
type Enqueued = (
    oneshot::Receiver<Result<u64, LogError>>,
    u64,
    Option<Request>,
);

impl EmbeddedLog {
    /// The synchronous half of `append`: checks, encodes and queues the batch.
    fn enqueue_append(&self, batch: Vec<Record>) -> Result<Option<Enqueued>, LogError> {
        if batch.is_empty() {
            return Ok(None);
        }
        if batch.len() > APPEND_RECORDS_MAX {
            return Err(LogError::Invalid(format!(
                "batch of {} records exceeds {APPEND_RECORDS_MAX}",
                batch.len()
            )));
        }
        let Some(claim) = self.held_claim() else {
            return Err(LogError::Invalid(
                "log partition 0 is not claimed by this writer".into(),
            ));
        };
        // Encoded back to back into one buffer: two allocations per append, not
        // one per record.
        let mut bytes = Vec::with_capacity(batch.len() * ENCODED_RECORD_BYTES_GUESS);
        let mut ends = Vec::with_capacity(batch.len());
        for record in &batch {
            if record.writer_id != claim.writer_id || record.claim_epoch != claim.epoch {
                return Err(LogError::Invalid(format!(
                    "record written as {}@{} but this writer holds {}@{}",
                    record.writer_id, record.claim_epoch, claim.writer_id, claim.epoch
                )));
            }
            codec::encode_record_into(record, &mut bytes)
                .map_err(|e| LogError::Invalid(e.to_string()))?;
            ends.push(bytes.len());
        }
        let count = ends.len() as u64;
        // A small batch goes to the tail, for the first reader. Freeing a
        // large one costs about as much as encoding it: do it on the blocking
        // pool, alongside the fsync, not before or after it.
        let records = if batch.len() < FREE_ASIDE_RECORDS_MIN {
            Some(batch)
        } else {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn_blocking(move || drop(batch));
            }
            None
        };
        let (reply, answer) = oneshot::channel();
        let later = self.try_queue(Request::Append {
            bytes,
            ends,
            records,
            reply,
        })?;
        Ok(Some((answer, count, later)))
    }
}

impl EventReader for EmbeddedLog {
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
        let end = *self.end.borrow();
        if from_offset >= end || max == 0 {
            return Ok(Vec::new());
        }
        let until = end.min(from_offset.saturating_add(max as u64));
        let mut dropped = Vec::new();
        let mut entries = self
            .shared
            .tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(from_offset, until, &mut dropped);
        // Freed outside the lock, which the writer thread takes too.
        drop(dropped);
        // What the tail did not hold comes from the disk.
        let next = entries.last().map_or(from_offset, |(p, _)| p.offset + 1);
        if next < until {
            entries.extend(read_range(&self.db, next, until, |e| storage("read", e))?);
        }
        Ok(entries)
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        check_partition(log_partition)?;
        Ok(*self.end.borrow())
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        check_partition(log_partition)?;
        let mut end = self.end.clone();
        let reached = tokio::time::timeout(timeout, async {
            end.wait_for(|end| *end > offset).await.is_ok()
        })
        .await;
        match reached {
            Ok(true) => Ok(true),
            Ok(false) => Err(writer_gone()),
            Err(_) => Ok(false),
        }
    }
}

impl EventLog for EmbeddedLog {
    /// Ordered appends (see [`EventLog::ordered_appends`]): the batch is
    /// encoded and queued during the call; the returned future only waits for
    /// the synced write. One FIFO queue feeds
    /// the writer thread, and after a failed write every later one is refused.
    fn ordered_appends(&self) -> bool {
        true
    }

    async fn reclaim(&self, log_partition: u32) -> Result<Claim, LogError> {
        self.claim(log_partition).await
    }

    fn append(
        &self,
        batch: Vec<Record>,
    ) -> impl std::future::Future<Output = Result<Vec<Position>, LogError>> + Send {
        let queued = self.enqueue_append(batch);
        async move {
            let (answer, count, later) = match queued? {
                None => return Ok(Vec::new()),
                Some(q) => q,
            };
            if let Some(request) = later {
                // The queue was full at the call: this caller's earlier appends
                // are already queued, so its order is kept.
                self.send(request).await?;
            }
            let first = answer.await.map_err(|_| writer_gone())??;
            Ok((first..first + count)
                .map(|offset| Position {
                    log_partition: 0,
                    offset,
                })
                .collect())
        }
    }
}
