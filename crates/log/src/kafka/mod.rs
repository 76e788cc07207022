//! The Kafka log: [`EventLog`] on a Kafka topic (`reservoir.events` by default),
//! for any Kafka-protocol broker, including ones without transactions (tansu).
//!
//! - **Placement.** A ledger partition's records always go to one Kafka
//!   partition, chosen by us ([`log_partition_of_route`]: murmur2, as Kafka's
//!   Java default partitioner computes it, of `subject|route`, so every epoch and
//!   generation of a subject/route shares one Kafka partition and one owner in
//!   cluster mode), never by librdkafka's partitioner.
//! - **Atomicity.** One Kafka record holds one command's events ([`Record`]), so a
//!   command is never split, on any broker.
//! - **Durability.** The producer is idempotent (`enable.idempotence=true`,
//!   `acks=all`): no duplicates and no reordering within a Kafka partition. A
//!   batch is acknowledged only once every record was acknowledged by the broker.
//! - **Single writer.** [`KafkaLog::claim`] appends a [`Claim`] (this writer's id,
//!   an epoch above every claim in the partition) and reads the partition up to
//!   and including it; only if the claim took effect may the writer append.
//!   [`EventLog::append`] reads every batch back and reports it appended only if
//!   no foreign claim took the partition before it; otherwise it returns
//!   [`LogError::Fenced`] and refuses every later append to that partition. What
//!   counts is decided by [`fence::Validity`], the rule every reader applies.
//! - **Pipelining.** Appends are ordered ([`EventLog::ordered_appends`]): an
//!   append's records are handed to the producer when `append` is called, so a
//!   writer can decide its next batch while this one is in flight. An append is
//!   acknowledged only after every earlier append to the same log partition was
//!   (a failed one fails every later one: their records were decided on top of
//!   it), and the read-back of one append reads everything acknowledged so far,
//!   so appends in flight together are read back together.
//! - **Ambiguous failures.** An append that fails after records may have been
//!   written (a delivery timeout, a failed read-back) cannot say whether they
//!   will count. Its error is transient, and every later append to that
//!   partition is refused with [`LogError::InDoubt`] until the writer claims it
//!   again and rebuilds its state from the log; otherwise a retry would decide
//!   against state missing records that count (duplicate sequence numbers).
//!
//! Blocking librdkafka calls (metadata, watermarks, consumer polls) run on
//! tokio's blocking pool; each log partition has its own lazily created reader.
//!
//! **Broker quirks.** On Apache Kafka (and any broker that follows the
//! protocol) the standard path is taken. Workarounds for a broker's bugs are
//! named in [`BrokerQuirks`] and switched on only when the operator says so
//! ([`BrokerQuirks::ENV`]); today that is tansu 0.6.
//!
//! This file holds the log itself (ownership, claims, producing); `append`
//! (the append path: standing, ordering, read-back), `config`, `placement`,
//! `read` (decoding, [`EventReader`]) and `clients` (librdkafka clients, the
//! topic, error classification) beside it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use reservoir_core::PartitionKey;
use tracing::{debug, info, warn};

use crate::fence::{Validity, Verdict};
use crate::{codec, fence, Claim, EventLog, EventReader, LogEntry, LogError, Position, Record};

mod append;
mod clients;
mod config;
mod placement;
mod read;

use append::Standing;
pub use clients::log_error;
use clients::{blocking, build_consumer, build_producer, ensure_topic, leadership_moving};
pub use config::{BrokerQuirks, KafkaConfig};
#[cfg(test)]
use placement::murmur2;
pub use placement::{log_partition_of_route, murmur2_partition};
use read::{decode_claim, Decode, ReadTo, READ_PROBE};

/// Default topic name.
pub const TOPIC_DEFAULT: &str = "reservoir.events";
/// Most entries a read allocates room for before it has seen them.
const READ_PREALLOC_ENTRIES_MAX: usize = 16_384;
/// Most records one `append` takes; a larger batch is refused as invalid.
pub const APPEND_RECORDS_MAX: usize = 16_384;

/// This writer's standing in one log partition.
#[derive(Debug)]
enum Ownership {
    Unclaimed,
    Held {
        claim: Claim,
        claim_offset: u64,
        /// Validity state after every entry before `scanned_to`.
        validity: Validity,
        /// Next offset the read-back has not looked at yet.
        scanned_to: u64,
        /// Offset of the first foreign claim that took the partition, once seen:
        /// our records before it count, none after it does.
        lost_at: Option<u64>,
    },
}

/// A consumer assigned to one log partition, remembering where its fetch
/// position is so sequential reads do not move it (and re-fetch).
///
/// Its assignment is set once, by the first read, and never changed: later
/// reads move it with a seek, and resting pauses it. librdkafka 2.12 aborts
/// the process (librdkafka#5573) when a partition's assignment changes again
/// while the fetch stop of the previous change is still in flight, and a read
/// that answers at once (at the end of the log) can be followed by another
/// change within that window. A seek or a pause is not an assignment change.
/// A consumer a seek cannot move (its fetcher stopped, after an offset out
/// of range) is replaced by a fresh one.
struct PartitionReader {
    consumer: BaseConsumer,
    /// Whether the consumer's one assignment has been made.
    assigned: bool,
    /// Whether [`Inner::rest_reader`] paused its fetcher.
    paused: bool,
    next_offset: Option<u64>,
    /// The highest end of the partition ListOffsets reported through this
    /// reader: entries before it exist, whatever a fetch said earlier.
    listed_end: u64,
}

struct Inner {
    config: KafkaConfig,
    log_partitions: u32,
    /// Replaced when librdkafka reports a fatal (idempotence) error.
    producer: RwLock<Arc<FutureProducer>>,
    readers: Vec<Mutex<Option<PartitionReader>>>,
    /// Held across the read-backs (claiming, verifying appends).
    ownership: Vec<tokio::sync::Mutex<Ownership>>,
    /// What an append may go under, checked when `append` is called.
    standing: Vec<Mutex<Standing>>,
    /// Entries the appends' read-backs have read (see [`KafkaLog::read_back_entries`]).
    read_back_entries: AtomicU64,
}

/// The Kafka implementation of [`EventLog`]. Cheap to clone.
#[derive(Clone)]
pub struct KafkaLog {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KafkaLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaLog")
            .field("topic", &self.inner.config.topic)
            .field("log_partitions", &self.inner.log_partitions)
            .field("writer_id", &self.inner.config.writer_id)
            .finish()
    }
}

fn kafka_offset(offset: u64) -> i64 {
    i64::try_from(offset).expect("offsets fit in i64")
}

impl KafkaLog {
    /// Connects, creating the topic if it is missing (some brokers, tansu among
    /// them, do not auto-create topics), and learns its partition count.
    pub async fn connect(config: KafkaConfig) -> Result<Self, LogError> {
        if config.writer_id.is_empty() {
            return Err(LogError::Invalid("writer id is empty".into()));
        }
        if let Err(invalid) = &config.quirks {
            return Err(LogError::Invalid(invalid.clone()));
        }
        let log_partitions = ensure_topic(&config).await?;
        let producer = build_producer(&config)?;
        info!(topic = %config.topic, log_partitions, writer_id = %config.writer_id, "kafka log connected");
        Ok(Self {
            inner: Arc::new(Inner {
                readers: (0..log_partitions).map(|_| Mutex::new(None)).collect(),
                ownership: (0..log_partitions)
                    .map(|_| tokio::sync::Mutex::new(Ownership::Unclaimed))
                    .collect(),
                standing: (0..log_partitions)
                    .map(|_| Mutex::new(Standing::default()))
                    .collect(),
                producer: RwLock::new(Arc::new(producer)),
                read_back_entries: AtomicU64::new(0),
                log_partitions,
                config,
            }),
        })
    }

    pub fn config(&self) -> &KafkaConfig {
        &self.inner.config
    }

    /// Entries read back to check appends since this log was connected. A
    /// writer alone on its partitions reads none: its records follow each
    /// other, so nothing foreign can lie between them (see `append`).
    pub fn read_back_entries(&self) -> u64 {
        self.inner.read_back_entries.load(Ordering::Relaxed)
    }

    /// Takes over a log partition: appends a claim with an epoch above every
    /// claim in it, reads up to and including that claim, and succeeds only if
    /// the claim took effect there (no claim with an equal or higher epoch landed
    /// first). Afterwards this writer may append records carrying the returned
    /// claim's epoch; to rebuild state, read the partition with
    /// [`fence::read_valid`].
    pub async fn claim(&self, log_partition: u32) -> Result<Claim, LogError> {
        self.check_partition(log_partition)?;
        let mut ownership = self.inner.ownership[log_partition as usize].lock().await;
        let mut validity = Validity::default();
        let mut scanned_to = 0;
        // Claims are decided by the latest accepted epoch, which is also the
        // highest epoch of every claim seen (stale claims never exceed it).
        let end = self.end_offset(log_partition).await?;
        self.scan(log_partition, &mut validity, &mut scanned_to, end)
            .await?;
        let epoch = validity.current_claim().map_or(0, |c| c.epoch) + 1;
        let claim = Claim {
            writer_id: self.inner.config.writer_id.clone(),
            epoch,
        };

        let positions = self
            .produce(log_partition, &[LogEntry::Claim(claim.clone())])
            .await?;
        let claim_offset = positions[0].offset;
        self.scan(
            log_partition,
            &mut validity,
            &mut scanned_to,
            claim_offset + 1,
        )
        .await?;
        if validity.current_claim() != Some(&claim) {
            *ownership = Ownership::Unclaimed;
            self.set_unclaimed(log_partition);
            warn!(log_partition, epoch, winner = ?validity.current_claim(), "lost the race for a log partition");
            return Err(LogError::Fenced {
                writer_id: claim.writer_id,
                log_partition,
            });
        }
        info!(log_partition, epoch, claim_offset, "claimed log partition");
        *ownership = Ownership::Held {
            claim: claim.clone(),
            claim_offset,
            validity,
            scanned_to,
            lost_at: None,
        };
        self.set_claimed(log_partition, claim.clone(), claim_offset);
        Ok(claim)
    }

    /// The claim this writer holds on a log partition, if it has not lost it.
    pub async fn held_claim(&self, log_partition: u32) -> Option<Claim> {
        match &*self
            .inner
            .ownership
            .get(log_partition as usize)?
            .lock()
            .await
        {
            Ownership::Held {
                claim,
                lost_at: None,
                ..
            } => Some(claim.clone()),
            _ => None,
        }
    }

    fn check_partition(&self, log_partition: u32) -> Result<(), LogError> {
        if log_partition < self.inner.log_partitions {
            Ok(())
        } else {
            Err(LogError::Invalid(format!(
                "log partition {log_partition} out of range (topic has {})",
                self.inner.log_partitions
            )))
        }
    }

    /// Feeds entries `[*scanned_to, until)` through `validity`.
    async fn scan(
        &self,
        log_partition: u32,
        validity: &mut Validity,
        scanned_to: &mut u64,
        until: u64,
    ) -> Result<(), LogError> {
        while *scanned_to < until {
            let want = usize::try_from(until - *scanned_to)
                .unwrap_or(usize::MAX)
                .min(fence::ValidReader::READ_ENTRIES_MAX);
            for (position, claim) in self.read_claims(log_partition, *scanned_to, want).await? {
                if let Some(claim) = claim {
                    validity.observe(&LogEntry::Claim(claim));
                }
                *scanned_to = position.offset + 1;
            }
        }
        Ok(())
    }

    /// The claims among `count` entries known to exist (acknowledged) from
    /// `from_offset`: waits up to the request timeout for them rather than
    /// returning short. Records are not decoded: they never change validity.
    async fn read_claims(
        &self,
        log_partition: u32,
        from_offset: u64,
        count: usize,
    ) -> Result<Vec<(Position, Option<Claim>)>, LogError> {
        let inner = self.inner.clone();
        blocking(move || {
            inner.read_blocking(
                log_partition,
                from_offset,
                count,
                ReadTo::Acknowledged(from_offset + count as u64),
                decode_claim,
            )
        })
        .await?
    }

    /// Produces entries to one log partition and waits for every acknowledgement.
    async fn produce(
        &self,
        log_partition: u32,
        entries: &[LogEntry],
    ) -> Result<Vec<Position>, LogError> {
        let targets: Vec<(u32, &LogEntry)> = entries.iter().map(|e| (log_partition, e)).collect();
        self.enqueue(&targets)?.acknowledged(self).await
    }

    /// Hands entries to the producer, in order: librdkafka keeps a partition's
    /// records in the order they are handed over, and the idempotent producer
    /// keeps that order on the broker. Every entry is encoded first, so an
    /// entry that cannot be encoded refuses the lot with nothing handed over.
    fn enqueue(&self, targets: &[(u32, &LogEntry)]) -> Result<Enqueued, LogError> {
        let producer = self.inner.producer.read().expect("producer lock").clone();
        let topic = self.inner.config.topic.as_str();
        let mut encoded = Vec::with_capacity(targets.len());
        for &(log_partition, entry) in targets {
            let value =
                codec::encode(entry).map_err(|e| LogError::Invalid(format!("encode: {e}")))?;
            encoded.push((
                log_partition,
                codec::record_key(entry),
                value,
                codec::headers(entry),
            ));
        }
        let mut deliveries = Vec::with_capacity(encoded.len());
        let mut failure = None;
        for (log_partition, key, value, header_values) in &encoded {
            let mut headers = OwnedHeaders::new_with_capacity(header_values.len());
            for (name, header_value) in header_values {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(header_value.as_bytes()),
                });
            }
            let record = FutureRecord::to(topic)
                .partition(*log_partition as i32)
                .key(key.as_bytes())
                .payload(value.as_slice())
                .headers(headers);
            match producer.send_result(record) {
                Ok(delivery) => deliveries.push((*log_partition, delivery)),
                Err((error, _)) => {
                    // Stop enqueuing; what is in flight is still awaited so
                    // nothing of this batch is left unaccounted for.
                    failure = Some(log_error("enqueue", &error));
                    break;
                }
            }
        }
        Ok(Enqueued {
            producer,
            deliveries,
            failure,
        })
    }

    /// An idempotent producer that hit a fatal error (e.g. a sequence gap it
    /// cannot repair) refuses every later record; start a fresh one.
    fn replace_producer_if_fatal(&self, failed: &Arc<FutureProducer>) {
        let Some((code, reason)) = failed.client().fatal_error() else {
            return;
        };
        let mut producer = self.inner.producer.write().expect("producer lock");
        if Arc::ptr_eq(&producer, failed) {
            warn!(?code, %reason, "producer hit a fatal error; replacing it");
            match build_producer(&self.inner.config) {
                Ok(fresh) => *producer = Arc::new(fresh),
                Err(error) => warn!(%error, "could not replace the producer"),
            }
        }
    }
}

/// Entries handed to the producer, waiting for the broker's acknowledgements.
struct Enqueued {
    producer: Arc<FutureProducer>,
    deliveries: Vec<(u32, DeliveryFuture)>,
    /// The producer refused an entry (nothing after it was handed over).
    failure: Option<LogError>,
}

impl Enqueued {
    /// Waits for every delivery; the positions in order, or the first failure.
    async fn acknowledged(self, log: &KafkaLog) -> Result<Vec<Position>, LogError> {
        let Enqueued {
            producer,
            deliveries,
            mut failure,
        } = self;
        let mut positions = Vec::with_capacity(deliveries.len());
        for (log_partition, delivery) in deliveries {
            match delivery.await {
                Ok(Ok(delivery)) => {
                    assert_eq!(
                        delivery.partition, log_partition as i32,
                        "record landed in another partition"
                    );
                    let offset = u64::try_from(delivery.offset)
                        .expect("acknowledged offsets are not negative");
                    positions.push(Position {
                        log_partition,
                        offset,
                    });
                }
                Ok(Err((error, _))) => {
                    failure.get_or_insert_with(|| log_error("produce", &error));
                }
                Err(_canceled) => {
                    failure
                        .get_or_insert_with(|| LogError::Unavailable("producer shut down".into()));
                }
            }
        }
        if let Some(error) = failure {
            log.replace_producer_if_fatal(&producer);
            return Err(error);
        }
        Ok(positions)
    }
}

impl Inner {
    fn reader<'a>(
        &self,
        slot: &'a mut Option<PartitionReader>,
    ) -> Result<&'a mut PartitionReader, LogError> {
        if slot.is_none() {
            *slot = Some(PartitionReader {
                consumer: build_consumer(&self.config)?,
                assigned: false,
                paused: false,
                next_offset: None,
                listed_end: 0,
            });
        }
        Ok(slot.as_mut().expect("reader just created"))
    }

    /// Stops the background fetching of a log partition's reader, if no read
    /// holds it (`false` if one does). An assigned librdkafka consumer keeps
    /// fetching into its queue (up to `queued.min.messages` entries) whether
    /// or not anyone polls it; a writer reads its partitions only on demand
    /// (the claim, recovery, a read-back over a gap), so after those its
    /// reader would fetch, and hold, everything appended since: broker work
    /// and memory for nothing. The reader is paused, which also drops what it
    /// had queued; the next read resumes it where it seeks to.
    pub(super) fn rest_reader(&self, log_partition: u32) -> bool {
        let Ok(mut slot) = self.readers[log_partition as usize].try_lock() else {
            return false;
        };
        if let Some(reader) = slot.as_mut().filter(|r| r.assigned && !r.paused) {
            match reader.consumer.pause(&self.partition_list(log_partition)) {
                Ok(()) => {
                    reader.paused = true;
                    reader.next_offset = None;
                }
                Err(error) => {
                    warn!(log_partition, %error, "could not pause a reader; it is replaced");
                    *slot = None;
                }
            }
        }
        true
    }

    /// Offset one past the last acknowledged entry.
    fn high_watermark(
        &self,
        reader: &PartitionReader,
        log_partition: u32,
    ) -> Result<u64, LogError> {
        let (_low, high) = self.watermarks(reader, log_partition)?;
        Ok(u64::try_from(high).unwrap_or(0))
    }

    /// The partition's low and high watermarks. A broker that has just
    /// elected a leader can still answer NotLeaderForPartition for a moment
    /// (its own metadata lags what it told us), so leadership errors are
    /// retried until the request timeout has passed.
    fn watermarks(
        &self,
        reader: &PartitionReader,
        log_partition: u32,
    ) -> Result<(i64, i64), LogError> {
        let deadline = Instant::now() + self.config.request_timeout;
        loop {
            match reader.consumer.fetch_watermarks(
                &self.config.topic,
                log_partition as i32,
                self.config.request_timeout,
            ) {
                Ok(marks) => return Ok(marks),
                Err(e) if leadership_moving(&e) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(log_error("watermarks", &e)),
            }
        }
    }

    /// Reads up to `max` entries from `from_offset`, as far as `to` says.
    fn read_blocking<T>(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
        to: ReadTo,
        decode: Decode<T>,
    ) -> Result<Vec<(Position, T)>, LogError> {
        let mut slot = self.readers[log_partition as usize]
            .lock()
            .expect("reader lock");
        let reader = self.reader(&mut slot)?;
        self.read_locked(reader, log_partition, from_offset, max, to, decode)
    }

    /// The read loop. The end of the log is where a fetch says so
    /// (PartitionEOF, or the high watermark of the last fetch response).
    ///
    /// With [`BrokerQuirks::Tansu`] only: a fetch from an offset inside a
    /// multi-record batch returns only the batches that *start* at or after it:
    /// the rest of the batch never comes, and no PartitionEOF either. So when
    /// nothing arrives for a probe interval, or the first offset that arrives is
    /// past the one we need, the read steps back (1, 2, 4, ... offsets) until a
    /// batch covers it, skipping what it already has. A broker that follows the
    /// protocol returns the whole batch and librdkafka skips the offsets before
    /// the one asked for, so neither case arises there.
    fn read_locked<T>(
        &self,
        reader: &mut PartitionReader,
        log_partition: u32,
        from_offset: u64,
        max: usize,
        to: ReadTo,
        decode: Decode<T>,
    ) -> Result<Vec<(Position, T)>, LogError> {
        let timeout = self.config.request_timeout;
        let step_back_to_batch = self.config.broker_quirks() == BrokerQuirks::Tansu;
        let deadline = Instant::now() + timeout;
        let mut limit = from_offset.saturating_add(max as u64);
        if let ReadTo::Acknowledged(until) = to {
            limit = limit.min(until);
        }
        if from_offset >= limit {
            return Ok(Vec::new());
        }
        let continuing = reader.next_offset == Some(from_offset);
        reader.next_offset = None;
        let mut assigned_at = from_offset;
        let mut step_back = 1;
        if !continuing {
            self.assign(reader, log_partition, from_offset)?;
        }
        // What is known to exist when the read is called (acknowledged to this
        // process's own producer, or reported by ListOffsets through this
        // reader) is there, whatever the last fetch response said: the end
        // below is never taken before it. Otherwise a read right after an
        // append, or after `end_offset`, would answer short from a fetch that
        // predates them.
        let known_end = self.standing[log_partition as usize]
            .lock()
            .expect("standing lock")
            .acknowledged_to()
            .max(reader.listed_end);
        let mut heard_since_assign = continuing;
        let mut assigned = Instant::now();
        // Sized for the read up front: growing a vector of entries copies
        // every entry again (a tenth of a drained read's time in `perf`).
        let wanted = usize::try_from(limit - from_offset).unwrap_or(usize::MAX);
        let mut entries = Vec::with_capacity(wanted.min(READ_PREALLOC_ENTRIES_MAX));
        let mut expected = from_offset;
        let mut last_transient: Option<LogError> = None;
        while expected < limit {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(LogError::Timeout(format!(
                    "reading log partition {log_partition} at offset {expected}: nothing within {timeout:?}{}",
                    last_transient.map(|e| format!(" (last error: {e})")).unwrap_or_default()
                )));
            }
            let at_end = |reader: &PartitionReader| {
                to == ReadTo::EndOfLog
                    && expected >= known_end
                    && self
                        .fetched_high_watermark(reader, log_partition)
                        .is_some_and(|high| expected >= high)
            };
            // What is queued first. With nothing queued and the read at the
            // end the last fetch response reported, answer now rather than
            // wait a probe for records that may never come (a projector step
            // paid READ_PROBE for every partition with nothing new). Not on
            // tansu, whose ListOffsets end `end_offset_blocking` corrects by
            // waiting for a fetch here.
            let polled = match reader.consumer.poll(Duration::ZERO) {
                Some(queued) => Some(queued),
                None if at_end(reader) && !step_back_to_batch => break,
                None => reader.consumer.poll(remaining.min(READ_PROBE)),
            };
            let message = match polled {
                None => {
                    if at_end(reader) {
                        break; // at the end, as the last fetch response says
                    }
                    if step_back_to_batch
                        && !heard_since_assign
                        && assigned.elapsed() >= READ_PROBE
                        && assigned_at > 0
                    {
                        (assigned_at, step_back) =
                            (expected.saturating_sub(step_back), step_back * 2);
                        self.assign(reader, log_partition, assigned_at)?;
                        assigned = Instant::now();
                    }
                    continue;
                }
                Some(Ok(message)) => message,
                // An end-of-partition event may have waited in the queue since
                // a fetch before entries known to exist were written.
                Some(Err(KafkaError::PartitionEOF(_))) => match to {
                    ReadTo::EndOfLog if expected >= known_end => break,
                    _ => continue,
                },
                Some(Err(error)) => {
                    let code = error.rdkafka_error_code();
                    if matches!(
                        code,
                        Some(
                            RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange
                        )
                    ) && to == ReadTo::EndOfLog
                    {
                        return self.beyond_end(reader, log_partition, from_offset, entries);
                    }
                    let error = log_error("fetch", &error);
                    if !error.transient() {
                        return Err(error);
                    }
                    // librdkafka reconnects and refetches by itself; keep polling
                    // until the deadline.
                    last_transient = Some(error);
                    continue;
                }
            };
            heard_since_assign = true;
            let offset = u64::try_from(message.offset()).expect("fetched offsets are not negative");
            if offset < expected {
                continue; // before what we need: left over, or stepped back over it
            }
            if step_back_to_batch && offset > expected && assigned_at > 0 {
                // The batch holding `expected` starts before where we assigned.
                (assigned_at, step_back) = (expected.saturating_sub(step_back), step_back * 2);
                self.assign(reader, log_partition, assigned_at)?;
                (heard_since_assign, assigned) = (false, Instant::now());
                continue;
            }
            let position = Position {
                log_partition,
                offset,
            };
            let entry = decode(position, message.payload().unwrap_or_default())?;
            entries.push((position, entry));
            expected = offset + 1;
        }
        reader.next_offset = Some(expected);
        Ok(entries)
    }

    /// Moves `reader` to fetch `log_partition` from `offset`, dropping what
    /// it had queued: the consumer's one assignment the first time, a seek
    /// after that (see [`PartitionReader`]).
    fn assign(
        &self,
        reader: &mut PartitionReader,
        log_partition: u32,
        offset: u64,
    ) -> Result<(), LogError> {
        reader.next_offset = None;
        let at = Offset::Offset(kafka_offset(offset));
        if reader.assigned {
            match reader.consumer.seek(
                &self.config.topic,
                log_partition as i32,
                at,
                self.config.request_timeout,
            ) {
                Ok(()) => {
                    if reader.paused {
                        reader
                            .consumer
                            .resume(&self.partition_list(log_partition))
                            .map_err(|e| log_error("resume", &e))?;
                        reader.paused = false;
                    }
                    return Ok(());
                }
                Err(error) => {
                    debug!(log_partition, %error, "a reader could not seek; a fresh one is assigned");
                    reader.consumer = build_consumer(&self.config)?;
                    reader.paused = false;
                }
            }
        }
        let mut assignment = self.partition_list(log_partition);
        assignment
            .set_all_offsets(at)
            .map_err(|e| log_error("assign", &e))?;
        reader
            .consumer
            .assign(&assignment)
            .map_err(|e| log_error("assign", &e))?;
        reader.assigned = true;
        Ok(())
    }

    /// This log's topic and one of its partitions.
    fn partition_list(&self, log_partition: u32) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.config.topic, log_partition as i32);
        list
    }

    /// The high watermark of the last fetch response (`None` before any), as
    /// librdkafka caches it (`rd_kafka_get_watermark_offsets`, which the rdkafka
    /// crate does not wrap). No broker round trip.
    fn fetched_high_watermark(&self, reader: &PartitionReader, log_partition: u32) -> Option<u64> {
        let topic =
            std::ffi::CString::new(self.config.topic.as_str()).expect("topic names hold no NUL");
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: the client pointer is valid while `reader` is borrowed; the
        // topic string outlives the call; low/high are valid out-pointers.
        let error = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                reader.consumer.client().native_ptr(),
                topic.as_ptr(),
                log_partition as i32,
                &mut low,
                &mut high,
            )
        };
        if error != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        u64::try_from(high).ok()
    }

    /// An end-of-log read asked for an offset the broker does not have: nothing
    /// there yet if it is at or past the end, an error if it is before the start
    /// (deleted by retention: this log never deletes).
    fn beyond_end<T>(
        &self,
        reader: &PartitionReader,
        log_partition: u32,
        from_offset: u64,
        entries: Vec<(Position, T)>,
    ) -> Result<Vec<(Position, T)>, LogError> {
        let (low, _high) = self.watermarks(reader, log_partition)?;
        if from_offset < u64::try_from(low).unwrap_or(0) {
            return Err(LogError::Storage(format!(
                "log partition {log_partition} starts at {low}, after the requested offset {from_offset}"
            )));
        }
        Ok(entries)
    }

    /// One past the last entry: the high watermark ListOffsets reports. With
    /// [`BrokerQuirks::Tansu`] that answer is a lower bound (tansu 0.6 answers
    /// one past the *first* offset of the last record batch) while the high
    /// watermark in fetch responses is exact, so it reads from there to the end.
    fn end_offset_blocking(&self, log_partition: u32) -> Result<u64, LogError> {
        let mut slot = self.readers[log_partition as usize]
            .lock()
            .expect("reader lock");
        let reader = self.reader(&mut slot)?;
        let listed = self.high_watermark(reader, log_partition)?;
        reader.listed_end = reader.listed_end.max(listed);
        if self.config.broker_quirks() != BrokerQuirks::Tansu {
            return Ok(listed);
        }
        // One before it is the last batch's first offset on tansu, the last
        // entry on Kafka: a fetch from there sees the true end either way.
        let tail = self.read_locked(
            reader,
            log_partition,
            listed.saturating_sub(1),
            usize::MAX,
            ReadTo::EndOfLog,
            decode_claim,
        )?;
        Ok(tail
            .last()
            .map_or(listed, |(position, _)| position.offset + 1)
            .max(listed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own murmur2 test vectors (`UtilsTest.testMurmur2` in Apache
    /// Kafka): our placement agrees with Java clients' default partitioner.
    #[test]
    fn murmur2_matches_kafka() {
        let vectors: [(&str, i32); 6] = [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            ("abc", 479470107),
        ];
        for (input, expected) in vectors {
            assert_eq!(murmur2(input.as_bytes()) as i32, expected, "{input}");
        }
        assert_eq!(
            murmur2_partition(b"abc", 8),
            (479470107u32 & 0x7fff_ffff) % 8
        );
    }

    #[test]
    fn broker_quirks_by_name() {
        let rows: [(&str, Option<BrokerQuirks>); 6] = [
            ("", Some(BrokerQuirks::None)),
            ("none", Some(BrokerQuirks::None)),
            (" tansu\n", Some(BrokerQuirks::Tansu)),
            ("tansu", Some(BrokerQuirks::Tansu)),
            ("Tansu", None),
            ("redpanda", None),
        ];
        for (name, expected) in rows {
            assert_eq!(BrokerQuirks::parse(name).ok(), expected, "{name:?}");
        }
    }

    #[test]
    fn error_classification() {
        use rdkafka::error::KafkaError as K;
        let rows: Vec<(KafkaError, bool)> = vec![
            (
                K::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
                true,
            ),
            (K::MessageProduction(RDKafkaErrorCode::QueueFull), true),
            (
                K::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure),
                true,
            ),
            (
                K::MessageProduction(RDKafkaErrorCode::NotEnoughReplicas),
                true,
            ),
            (
                K::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
                false,
            ),
            (
                K::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed),
                false,
            ),
            (K::Canceled, true),
        ];
        for (error, transient) in rows {
            assert_eq!(log_error("test", &error).transient(), transient, "{error}");
        }
    }
}
