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
//! tokio's blocking pool; each log partition has its own lazily created
//! reader, assigned once and then moved by seeks (see `read.rs`: librdkafka
//! 2.12 aborts on quick successive assignment changes).
//!
//! **Broker quirks.** On Apache Kafka (and any broker that follows the
//! protocol) the standard path is taken. Workarounds for a broker's bugs are
//! named in [`BrokerQuirks`] and switched on only when the operator says so
//! ([`BrokerQuirks::ENV`]); today that is tansu 0.6.
//!
//! This file holds the log itself (ownership, claims, producing); `append`
//! (the append path: standing, ordering, read-back), `config`,
//! `read` (the partition readers, the read loop, the partition's ends,
//! decoding, [`EventReader`]) and `clients` (librdkafka clients, the topic,
//! error classification) beside it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

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
mod read;
mod topic;

use append::Standing;
pub use clients::log_error;
use clients::{blocking, build_consumer, build_producer, leadership_moving, release};
pub use config::{BrokerQuirks, KafkaConfig};
use read::{decode_claim, PartitionReader, Read, ReadTo};
pub use reservoir_core::placement::{log_partition_of_route, murmur2_partition};
use topic::ensure_topic;
pub use topic::{settings_that_delete, KEEP_EVERY_RECORD};

/// Default topic name.
pub const TOPIC_DEFAULT: &str = "reservoir.events";
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

impl Drop for Inner {
    /// Hands the producer and the readers' consumers to [`release`]: each
    /// `rd_kafka_destroy` waits about 100 ms for the client's threads, and a
    /// node shutting down or a replay ending has nothing to wait for. The
    /// producer holds no unacknowledged record anyone was told is written:
    /// an append answers only after its deliveries.
    fn drop(&mut self) {
        let producer = self.producer.get_mut().map(|p| p.clone()).ok();
        let readers: Vec<PartitionReader> = self
            .readers
            .iter_mut()
            .filter_map(|r| r.get_mut().ok()?.take())
            .collect();
        release((producer, readers));
    }
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
        let read = Read {
            log_partition,
            from: from_offset,
            max: count,
            to: ReadTo::Acknowledged(from_offset + count as u64),
        };
        blocking(move || {
            inner.with_reader(log_partition, |reader| {
                inner.read_locked(reader, read, decode_claim)
            })
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

#[cfg(test)]
mod tests {
    use super::*;

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
