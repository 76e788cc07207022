//! Where replay reads from: the embedded log's RocksDB directory, opened as a
//! *secondary* instance (read-only, no lock: the server may keep running and
//! writing), or a Kafka topic through [`KafkaLog`].
//!
//! Replay needs what [`EventReader::read`] does not give: an entry that does not
//! decode must become a finding at its position, not an error that ends the
//! read. So [`Source::scan`] gives every position with either its entry or
//! why it is unreadable: it takes the raw values (from a [`SecondaryLog`]'s
//! `for_each_value`, or `KafkaLog::read_values_blocking`) and decodes them on
//! every core, so a value that does not decode becomes a finding (and so does
//! a hole, on the embedded log).
//!
//! [`Source`] is an [`EventReader`] (and not an `EventLog`: replay never
//! appends or claims), so the projector itself can run over it (`rebuild`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use reservoir_core::PartitionKey;
use reservoir_log::codec;
use reservoir_log::embedded::SecondaryLog;
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::{EventReader, LogEntry, LogError, Position};

/// Why an entry could not be read, and the ledger partition it names if the
/// start of the value still says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    pub reason: String,
    pub key: Option<PartitionKey>,
}

/// One position of the log: its entry, or why there is none.
#[derive(Clone, Debug)]
pub struct RawEntry {
    pub position: Position,
    pub entry: Result<LogEntry, Unreadable>,
}

/// Entries decoded per parallel chunk on the embedded log.
const DECODE_CHUNK_MIN: usize = 512;

/// A read-only view of the embedded log directory, fixed at the end it had
/// when opened (the server may go on writing).
pub struct EmbeddedReader {
    log: SecondaryLog,
    /// Reused between reads: fresh multi-megabyte buffers per slice cost more
    /// in page faults than the decoding itself.
    scratch: std::sync::Mutex<RawSlice>,
    /// The secondary instance's own directory (removed on drop, after `log`).
    _secondary: tempfile::TempDir,
    end: u64,
}

impl EmbeddedReader {
    /// Opens `path` (the `log` directory under the server's `--data-dir`) as a
    /// RocksDB secondary: sees everything the primary had written when opened,
    /// never writes, never takes the lock.
    pub fn open(path: &Path) -> Result<Self, LogError> {
        let secondary = tempfile::Builder::new()
            .prefix("reservoir-replay-secondary")
            .tempdir()
            .map_err(|e| LogError::Storage(e.to_string()))?;
        let log = SecondaryLog::open(path, secondary.path())?;
        let end = log.caught_up_end();
        Ok(Self {
            log,
            scratch: std::sync::Mutex::new(RawSlice::default()),
            _secondary: secondary,
            end,
        })
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Raw values of `[from, until)`, back to back in one buffer (one
    /// allocation per slice, not per entry); a missing offset has no bytes.
    fn raw(&self, from: u64, until: u64, slice: &mut RawSlice) -> Result<(), LogError> {
        slice.clear(0);
        let mut expected = from;
        self.log.for_each_value(from, until, |offset, value| {
            while expected < offset {
                slice.items.push((expected, None));
                expected += 1;
            }
            slice.push(offset, value);
            expected = offset + 1;
        })?;
        while expected < until {
            slice.items.push((expected, None));
            expected += 1;
        }
        Ok(())
    }

    /// Entries of `[from, from + max)`, decoded on every core.
    pub fn read_raw(&self, from: u64, max: usize) -> Result<Vec<RawEntry>, LogError> {
        let until = self.end.min(from.saturating_add(max as u64));
        if from >= until {
            return Ok(Vec::new());
        }
        let mut raw = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.raw(from, until, &mut raw)?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = raw.items.len().div_ceil(threads).max(DECODE_CHUNK_MIN);
        if raw.items.len() <= chunk {
            return Ok(raw.decode(&raw.items));
        }
        let raw = &*raw;
        let parts: Vec<Vec<RawEntry>> = std::thread::scope(|s| {
            let handles: Vec<_> = raw
                .items
                .chunks(chunk)
                .map(|items| s.spawn(move || raw.decode(items)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("decoder thread"))
                .collect()
        });
        Ok(parts.into_iter().flatten().collect())
    }

    /// Reads `[0, until)` in slices of `slice` offsets and hands them,
    /// decoded and in order, to `each` (see [`scan_pipelined`]).
    pub fn scan_pipelined(
        &self,
        until: u64,
        slice: usize,
        each: impl FnMut(Vec<RawEntry>) -> Result<(), crate::Stop>,
    ) -> Result<(), crate::Stop> {
        scan_pipelined(
            until.min(self.end),
            slice,
            |from, to, raw| self.raw(from, to, raw),
            each,
        )
    }
}

/// Reads `[0, until)` in slices of `slice` offsets and hands them, decoded
/// and in order, to `each` — pipelined: one thread reads raw values (`fill`
/// puts those of `[from, to)` into a buffer; fewer, possibly none, at the
/// end of the log, which ends the scan), a persistent pool (one decoder per
/// core) decodes whole slices, and the caller's thread only applies. Records
/// are built on the decoders, so the reading thread only copies bytes.
/// Channels are bounded (a few slices in flight), and raw buffers go back to
/// the reader for reuse. An error from `each` stops the pipeline (its threads
/// see the closed channels).
fn scan_pipelined(
    until: u64,
    slice: usize,
    fill: impl Fn(u64, u64, &mut RawSlice) -> Result<(), LogError> + Sync,
    mut each: impl FnMut(Vec<RawEntry>) -> Result<(), crate::Stop>,
) -> Result<(), crate::Stop> {
    use std::collections::BTreeMap;
    use std::sync::mpsc::{channel, sync_channel, Receiver};
    use std::sync::Mutex;

    if until == 0 {
        return Ok(());
    }
    let decoders = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Raw slices waiting for a decoder, and decoded slices waiting for the
    // caller: bounded, so memory stays a few slices whatever the log size.
    let (raw_tx, raw_rx) = sync_channel::<(u64, RawSlice)>(2);
    // Shared by the decoders; dropped with the last of them, which frees a
    // reader blocked on a full channel when the caller stops early.
    let raw_rx = std::sync::Arc::new(Mutex::new(raw_rx));
    let (done_tx, done_rx) = sync_channel::<(u64, Vec<RawEntry>)>(decoders + 2);
    let (free_tx, free_rx) = channel::<RawSlice>();
    let (error_tx, error_rx) = channel::<LogError>();
    std::thread::scope(|s| {
        {
            let (error_tx, fill) = (error_tx.clone(), &fill);
            s.spawn(move || {
                let mut at = 0u64;
                let mut seq = 0u64;
                while at < until {
                    let to = until.min(at.saturating_add(slice as u64));
                    let mut buf = free_rx.try_recv().unwrap_or_default();
                    if let Err(e) = fill(at, to, &mut buf) {
                        let _ = error_tx.send(e);
                        return;
                    }
                    let Some(&(last, _)) = buf.items.last() else {
                        return; // the end of the log, before `until`
                    };
                    if raw_tx.send((seq, buf)).is_err() {
                        return; // the caller stopped
                    }
                    seq += 1;
                    at = last + 1;
                }
            });
        }
        for _ in 0..decoders {
            let (raw_rx, done_tx, free_tx) = (raw_rx.clone(), done_tx.clone(), free_tx.clone());
            s.spawn(move || loop {
                let next = raw_rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok((seq, buf)) = next else { return };
                let decoded = buf.decode(&buf.items);
                let _ = free_tx.send(buf);
                if done_tx.send((seq, decoded)).is_err() {
                    return;
                }
            });
        }
        drop((raw_rx, done_tx, free_tx, error_tx));
        let mut consume = |done_rx: Receiver<(u64, Vec<RawEntry>)>| -> Result<(), crate::Stop> {
            let mut waiting = BTreeMap::new();
            let mut next = 0u64;
            for (seq, decoded) in done_rx {
                waiting.insert(seq, decoded);
                while let Some(decoded) = waiting.remove(&next) {
                    next += 1;
                    each(decoded)?;
                }
            }
            Ok(())
        };
        // Returning drops the receiver, which stops the other threads.
        consume(done_rx)
    })?;
    match error_rx.try_recv() {
        Ok(e) => Err(crate::Stop::Error(e.to_string())),
        Err(_) => Ok(()),
    }
}

impl RawSlice {
    /// Empty, for the values of `log_partition`.
    fn clear(&mut self, log_partition: u32) {
        self.log_partition = log_partition;
        self.bytes.clear();
        self.items.clear();
    }

    /// Appends the value stored at `offset`.
    fn push(&mut self, offset: u64, value: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(value);
        self.items.push((offset, Some((start, self.bytes.len()))));
    }

    fn decode(&self, items: &[(u64, Option<(usize, usize)>)]) -> Vec<RawEntry> {
        let bytes = &self.bytes;
        items
            .iter()
            .map(|(offset, span)| RawEntry {
                position: Position {
                    log_partition: self.log_partition,
                    offset: *offset,
                },
                entry: match span {
                    None => Err(Unreadable {
                        reason: "entry missing: a hole in the log's offsets".into(),
                        key: None,
                    }),
                    Some((start, end)) => {
                        let value = &bytes[*start..*end];
                        codec::decode(value).map_err(|e| Unreadable {
                            reason: e.to_string(),
                            key: codec::peek_key(value),
                        })
                    }
                },
            })
            .collect()
    }
}

/// Raw values read in one go: the bytes, and per offset its span in them.
#[derive(Default)]
struct RawSlice {
    log_partition: u32,
    bytes: Vec<u8>,
    items: Vec<(u64, Option<(usize, usize)>)>,
}

/// The log replay reads.
pub enum Source {
    /// Boxed: the reader is large next to a `KafkaLog` (a pointer).
    Embedded(Box<EmbeddedReader>),
    Kafka(KafkaLog),
}

/// How to reach the log, from the command line.
#[derive(Clone, Debug)]
pub enum SourceSpec {
    Embedded { log_dir: PathBuf },
    Kafka { brokers: String, topic: String },
}

impl Source {
    /// Entries a scan hands over at a time.
    const SLICE: usize = 16_384;

    /// For a tool about to exit: removes the embedded reader's secondary
    /// directory and leaves the database's memory to the process exit
    /// instead of closing it. A Kafka source is dropped: its clients are
    /// destroyed on a thread of their own (`KafkaLog`'s `Drop`), which the
    /// exit does not wait for.
    pub fn leak(self) {
        match self {
            Source::Embedded(e) => {
                let EmbeddedReader {
                    log, _secondary, ..
                } = *e;
                std::mem::forget(log);
                drop(_secondary);
            }
            Source::Kafka(k) => drop(k),
        }
    }

    pub async fn open(spec: &SourceSpec) -> Result<Source, LogError> {
        match spec {
            SourceSpec::Embedded { log_dir } => {
                // Accept the server's --data-dir as well as its log directory.
                let dir = if log_dir.join("log").join("CURRENT").exists() {
                    log_dir.join("log")
                } else {
                    log_dir.clone()
                };
                Ok(Source::Embedded(Box::new(EmbeddedReader::open(&dir)?)))
            }
            SourceSpec::Kafka { brokers, topic } => {
                // The writer id only names the client: replay never claims or appends.
                let mut config =
                    KafkaConfig::new(brokers, format!("replay-{}", std::process::id()));
                config.topic = topic.clone();
                Ok(Source::Kafka(KafkaLog::connect(config).await?))
            }
        }
    }

    /// Reads one log partition from offset 0 up to `until` (exclusive), in
    /// slices handed to `each`.
    pub async fn scan(
        &self,
        log_partition: u32,
        until: u64,
        each: impl FnMut(Vec<RawEntry>) -> Result<(), crate::Stop>,
    ) -> Result<(), crate::Stop> {
        match self {
            Source::Embedded(e) => {
                check_zero(log_partition).map_err(|e| crate::Stop::Error(e.to_string()))?;
                e.scan_pipelined(until, Self::SLICE, each)
            }
            Source::Kafka(log) => scan_pipelined(
                until,
                Self::SLICE,
                |from, to, raw| {
                    raw.clear(log_partition);
                    let want = usize::try_from(to - from).unwrap_or(usize::MAX);
                    log.read_values_blocking(log_partition, from, want, |position, value| {
                        raw.push(position.offset, value)
                    })
                },
                each,
            ),
        }
    }
}

fn check_zero(log_partition: u32) -> Result<(), LogError> {
    if log_partition == 0 {
        Ok(())
    } else {
        Err(LogError::Invalid(format!(
            "the embedded log has only log partition 0, not {log_partition}"
        )))
    }
}

impl EventReader for Source {
    fn log_partition_for(&self, key: &PartitionKey) -> u32 {
        match self {
            Source::Embedded(_) => 0,
            Source::Kafka(k) => k.log_partition_for(key),
        }
    }

    fn log_partitions(&self) -> u32 {
        match self {
            Source::Embedded(_) => 1,
            Source::Kafka(k) => k.log_partitions(),
        }
    }

    /// Decoded reads with `EventReader`'s contract: an unreadable entry is a
    /// `LogError::Corrupt` at its position (what the projector expects).
    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        match self {
            Source::Embedded(e) => {
                check_zero(log_partition)?;
                e.read_raw(from_offset, max)?
                    .into_iter()
                    .map(|raw| match raw.entry {
                        Ok(entry) => Ok((raw.position, entry)),
                        Err(u) => Err(LogError::Corrupt {
                            position: raw.position,
                            reason: u.reason,
                        }),
                    })
                    .collect()
            }
            Source::Kafka(k) => k.read(log_partition, from_offset, max).await,
        }
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        match self {
            Source::Embedded(e) => {
                check_zero(log_partition)?;
                Ok(e.end())
            }
            Source::Kafka(k) => k.end_offset(log_partition).await,
        }
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        match self {
            Source::Embedded(e) => {
                check_zero(log_partition)?;
                // A snapshot: nothing new arrives.
                let _ = timeout;
                Ok(offset < e.end())
            }
            Source::Kafka(k) => k.wait_for(log_partition, offset, timeout).await,
        }
    }
}
