//! The librdkafka side: creating the producer and consumers, running
//! blocking calls off the async threads, and classifying librdkafka's errors
//! as ours (whether a retry may succeed). The topic itself is `topic.rs`.

use super::*;

/// Whether the error says a partition's leadership is settling (right after
/// topic creation or a leader change): the same call succeeds shortly.
pub fn leadership_moving(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::NotLeaderForPartition | C::LeaderNotAvailable | C::UnknownTopicOrPartition)
    )
}

/// Maps a librdkafka error to ours, keeping whether a retry may succeed.
pub fn log_error(context: &str, error: &KafkaError) -> LogError {
    use RDKafkaErrorCode as C;
    let message = format!("{context}: {error}");
    match error {
        KafkaError::Canceled => return LogError::Unavailable(message),
        KafkaError::ClientCreation(_) | KafkaError::ClientConfig(..) => {
            return LogError::Invalid(message)
        }
        _ => {}
    }
    match error.rdkafka_error_code() {
        Some(C::MessageTimedOut | C::RequestTimedOut | C::OperationTimedOut | C::TimedOutQueue) => {
            LogError::Timeout(message)
        }
        Some(
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::Resolve
            | C::Retry
            | C::QueueFull
            | C::PurgeQueue
            | C::PurgeInflight
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
            | C::BrokerNotAvailable
            | C::ReplicaNotAvailable
            | C::NetworkException
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend
            | C::KafkaStorageError
            | C::FencedLeaderEpoch
            | C::UnknownLeaderEpoch
            | C::OffsetNotAvailable
            | C::UnknownTopicOrPartition
            | C::UnknownPartition
            | C::UnknownTopic
            | C::ThrottlingQuotaExceeded
            | C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::WaitingForCoordinator
            | C::NodeUpdate
            | C::InProgress
            | C::ISRInsufficient
            | C::RebootstrapRequired
            | C::UnknownProducerId
            | C::OutOfOrderSequenceNumber
            | C::InvalidProducerEpoch
            | C::Fatal,
        ) => LogError::Unavailable(message),
        _ => LogError::Storage(message),
    }
}

/// Runs blocking librdkafka work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, LogError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| LogError::Unavailable(format!("blocking task failed: {e}")))
}

/// Destroys a librdkafka client on a thread of its own. `rd_kafka_destroy`
/// waits for the client's threads to end, about 100 ms on loopback (measured
/// on Apache Kafka 4.2.2: dropping the probe's consumer and the admin client
/// were 200 of the 290 ms a replay took to connect); nothing here needs to
/// wait for it: the probe and admin client of `connect`, a reader replaced
/// after a failed seek, and every client of a [`KafkaLog`] dropped (a node
/// shutting down, a replay ending).
pub(super) fn release<T: Send + 'static>(client: T) {
    let spawned = std::thread::Builder::new()
        .name("rdkafka-release".into())
        .spawn(move || drop(client));
    if let Err(e) = spawned {
        // No thread to spare: the client was dropped with the closure.
        tracing::debug!(error = %e, "destroyed a Kafka client in place");
    }
}

pub(super) fn build_producer(config: &KafkaConfig) -> Result<FutureProducer, LogError> {
    config
        .client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .set("linger.ms", "1")
        .set(
            "message.timeout.ms",
            config.delivery_timeout.as_millis().max(1).to_string(),
        )
        .set(
            "request.timeout.ms",
            config.request_timeout.as_millis().max(1).to_string(),
        )
        .create()
        .map_err(|e| log_error("create producer", &e))
}

pub(super) fn build_consumer(config: &KafkaConfig) -> Result<BaseConsumer, LogError> {
    config
        .client_config()
        // Assigned partitions only: the group id is required by librdkafka but no
        // group is joined and no offset is ever committed.
        .set("group.id", format!("reservoir-reader-{}", config.writer_id))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", fetch_wait_max_ms(config))
        .set(
            "fetch.min.bytes",
            config.reader_fetch_min_bytes.max(1).to_string(),
        )
        .set("auto.offset.reset", "error")
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
        .create()
        .map_err(|e| log_error("create consumer", &e))
}

/// `fetch.queue.backoff.ms` for the readers. Once a partition's prefetch
/// queue holds `queued.min.messages` (100,000), librdkafka postpones its
/// next fetch by this long, 1,000 ms by default: a reader draining the topic
/// faster than that (replay, a projector catching up) then waits a second
/// for every 100,000 entries, and reading 1 M entries took 7.5 s of which
/// 4 s were spent waiting (bench-results/replay.md). At 1 ms librdkafka
/// looks again as soon as the queue has room; the queue's bounds are
/// unchanged, so memory is not.
const FETCH_QUEUE_BACKOFF_MS: &str = "1";

/// `fetch.wait.max.ms` for the readers. A broker that follows the protocol
/// answers a waiting fetch as soon as a record arrives, so a long wait costs a
/// read-back nothing and spares the broker a fetch per millisecond per reader
/// (on two cores, that polling alone kept Apache Kafka at 1.5 cores). tansu
/// holds an empty fetch for the full wait even when records arrive, which
/// would add the wait to every append's read-back: there it stays at 1 ms.
fn fetch_wait_max_ms(config: &KafkaConfig) -> &'static str {
    match config.broker_quirks() {
        BrokerQuirks::Tansu => "1",
        BrokerQuirks::None => "100",
    }
}
