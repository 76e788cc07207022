//! Faults on rdkafka's `MockCluster`, which a real broker cannot be made to
//! show on demand: a broker down mid-batch, produce and fetch request errors
//! and timeouts, a leader move. After each, every acknowledged append counts
//! and no record is stored twice.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use reservoir_log::fence::read_valid;
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::{EventLog, EventReader, LogEntry, LogError, Position, Record};

use crate::fixtures;
use crate::kafka::{all_entries, claimed_writer, config, unique_topic};

struct Mock {
    cluster: MockCluster<'static, DefaultProducerContext>,
    topic: String,
}

const MOCK_LEADER: i32 = 1;

fn mock(partitions: i32) -> Mock {
    let cluster = MockCluster::new(3).unwrap();
    let topic = unique_topic("mock");
    cluster.create_topic(&topic, partitions, 3).unwrap();
    for p in 0..partitions {
        cluster
            .partition_leader(&topic, p, Some(MOCK_LEADER))
            .unwrap();
    }
    Mock { cluster, topic }
}

fn mock_config(mock: &Mock, writer_id: &str) -> KafkaConfig {
    let mut config = config(&mock.cluster.bootstrap_servers(), &mock.topic, writer_id, 1);
    config.replication_factor = 3;
    config.request_timeout = Duration::from_secs(2);
    config.delivery_timeout = Duration::from_secs(3);
    // The mock cannot describe a topic's settings.
    config.check_topic_settings = false;
    config
}

/// Records with sequences never used before in this process, so a record stored
/// twice can only be a duplicate made below us, never a retried append.
fn batch(writer: &str, epoch: u64, records: u64) -> Vec<Record> {
    static NEXT_SEQUENCE: AtomicU64 = AtomicU64::new(1);
    (0..records)
        .map(|_| {
            fixtures::record(
                "tenant-mock",
                writer,
                epoch,
                NEXT_SEQUENCE.fetch_add(2, Ordering::Relaxed),
                2,
            )
        })
        .collect()
}

/// Reads back and checks: every acknowledged position counts, and no record is
/// stored twice (the idempotent producer's promise). Records of failed appends
/// may be stored (not acknowledged, possibly written): the rule is only that
/// nothing is acknowledged that is not.
async fn check_no_duplicates_and_acked_count(mock: &Mock, acked: &[Position]) {
    // A fresh reader with a patient timeout: requests delayed by an earlier
    // fault may still be queued on the old connections.
    let mut reader_config = mock_config(mock, "checker");
    reader_config.request_timeout = Duration::from_secs(15);
    let log = &KafkaLog::connect(reader_config).await.unwrap();
    let stored = all_entries(log, 0).await;
    let mut seen = BTreeSet::new();
    for (position, entry) in &stored {
        if let LogEntry::Record(record) = entry {
            assert!(
                seen.insert(record.events[0].sequence),
                "record stored twice at {position:?}"
            );
        }
    }
    let (counted, _) = read_valid(log, 0).await.unwrap();
    let counted: BTreeSet<Position> = counted.iter().map(|(p, _)| *p).collect();
    for position in acked {
        assert!(
            counted.contains(position),
            "acknowledged {position:?} counts"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_broker_down_mid_batch_fails_transiently_then_recovers() {
    let mock = mock(1);
    let log = claimed_writer(mock_config(&mock, "w-mock")).await;
    let mut acked = log.append(batch("w-mock", 1, 10)).await.unwrap();

    // Slow the leader so the batch is in flight, then take it down.
    mock.cluster
        .broker_round_trip_time(MOCK_LEADER, Duration::from_millis(300))
        .unwrap();
    let in_flight = tokio::spawn({
        let log = log.clone();
        async move { log.append(batch("w-mock", 1, 200)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    mock.cluster.broker_down(MOCK_LEADER).unwrap();
    let result = in_flight.await.unwrap();
    let error = result.expect_err("a batch to a downed leader is not acknowledged");
    assert!(error.transient(), "{error:?}");
    assert!(
        matches!(error, LogError::Timeout(_) | LogError::Unavailable(_)),
        "{error:?}"
    );

    mock.cluster
        .broker_round_trip_time(MOCK_LEADER, Duration::ZERO)
        .unwrap();
    mock.cluster.broker_up(MOCK_LEADER).unwrap();
    acked.extend(retry_append(&log, 10).await);
    check_no_duplicates_and_acked_count(&mock, &acked).await;
}

/// Appends, retrying transient errors for a while: how the writer recovers.
/// Appends `records` one-event-pair records, retrying transient errors for a
/// while, as the writer recovers: after an append left the partition in doubt,
/// it claims again (a writer would also rebuild its state from the log).
async fn retry_append(log: &KafkaLog, records: u64) -> Vec<Position> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let epoch = log
            .held_claim(0)
            .await
            .expect("still holds its claim")
            .epoch;
        let error = match log.append(batch("w-mock", epoch, records)).await {
            Ok(positions) => return positions,
            Err(error) => error,
        };
        assert!(
            error.transient() && Instant::now() < deadline,
            "append did not recover: {error:?}"
        );
        eprintln!("retrying after transient error: {error}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        if matches!(error, LogError::InDoubt { .. }) {
            if let Err(error) = log.claim(0).await {
                eprintln!("re-claim failed, will retry: {error}");
            }
        }
    }
}

/// The epoch `log` holds on partition 0.
async fn epoch(log: &KafkaLog) -> u64 {
    log.held_claim(0).await.unwrap().epoch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_produce_errors_are_retried_or_reported_transient_never_duplicated() {
    let mock = mock(1);
    let log = claimed_writer(mock_config(&mock, "w-mock")).await;
    let mut acked = Vec::new();

    // A few retriable errors: librdkafka retries, the idempotent producer keeps
    // exactly one copy, the append succeeds.
    mock.cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 3],
    );
    acked.extend(
        log.append(batch("w-mock", 1, 20))
            .await
            .expect("retried through"),
    );

    // Errors until the delivery timeout: the append fails, transiently, and
    // nothing of it is acknowledged.
    mock.cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 500],
    );
    let error = log
        .append(batch("w-mock", 1, 20))
        .await
        .expect_err("not durable, not acknowledged");
    assert!(error.transient(), "{error:?}");
    mock.cluster.clear_request_errors(RDKafkaApiKey::Produce);
    // Its records may have been written: the writer must recover before it
    // appends again, and is told so until it claims anew.
    let error = log.append(batch("w-mock", 1, 1)).await.unwrap_err();
    assert!(
        matches!(error, LogError::InDoubt { .. }) && error.transient(),
        "{error:?}"
    );
    let reclaimed = log.claim(0).await.unwrap();
    assert_eq!(reclaimed.epoch, 2);

    // Request timeouts on produce.
    mock.cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 2],
    );
    acked.extend(retry_append(&log, 20).await);
    acked.extend(retry_append(&log, 20).await);
    check_no_duplicates_and_acked_count(&mock, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_fetch_errors_and_timeouts_are_transient_and_reads_recover() {
    let mock = mock(1);
    let log = claimed_writer(mock_config(&mock, "w-mock")).await;
    let acked = log.append(batch("w-mock", 1, 30)).await.unwrap();
    let reader_log = KafkaLog::connect(mock_config(&mock, "reader"))
        .await
        .unwrap();

    // Retriable fetch errors: the read still returns everything, in order.
    mock.cluster.request_errors(
        RDKafkaApiKey::Fetch,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 3],
    );
    let entries = reader_log
        .read(0, 0, 1000)
        .await
        .expect("fetch errors are retried");
    assert_eq!(entries.len(), 31);

    // A leader slower than our request timeout: a typed transient error.
    mock.cluster
        .broker_round_trip_time(MOCK_LEADER, Duration::from_secs(4))
        .unwrap();
    let fresh = KafkaLog::connect(mock_config(&mock, "reader-2"))
        .await
        .unwrap();
    let error = fresh.read(0, 0, 1000).await.expect_err("times out");
    assert!(
        matches!(error, LogError::Timeout(_) | LogError::Unavailable(_)) && error.transient(),
        "{error:?}"
    );
    let error = fresh.end_offset(0).await.expect_err("times out");
    assert!(error.transient(), "{error:?}");

    mock.cluster
        .broker_round_trip_time(MOCK_LEADER, Duration::ZERO)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match fresh.read(0, 0, 1000).await {
            Ok(entries) if entries.len() == 31 => break,
            Ok(entries) => panic!("short read after recovery: {}", entries.len()),
            Err(error) if error.transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(error) => panic!("read did not recover: {error:?}"),
        }
    }
    check_no_duplicates_and_acked_count(&mock, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_leader_move_mid_stream_keeps_order_and_acknowledgements() {
    let mock = mock(1);
    let log = claimed_writer(mock_config(&mock, "w-mock")).await;
    let mut acked = log.append(batch("w-mock", 1, 10)).await.unwrap();
    let in_flight = tokio::spawn({
        let log = log.clone();
        async move {
            let epoch = epoch(&log).await;
            log.append(batch("w-mock", epoch, 500)).await
        }
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    mock.cluster
        .partition_leader(&mock.topic, 0, Some(2))
        .unwrap();
    match in_flight.await.unwrap() {
        Ok(positions) => acked.extend(positions),
        Err(error) => assert!(error.transient(), "{error:?}"),
    }
    acked.extend(retry_append(&log, 10).await);
    mock.cluster
        .partition_leader(&mock.topic, 0, Some(3))
        .unwrap();
    acked.extend(retry_append(&log, 10).await);
    check_no_duplicates_and_acked_count(&mock, &acked).await;
    let sorted = {
        let mut s = acked.clone();
        s.sort();
        s
    };
    assert_eq!(acked, sorted, "acknowledged in log order");
}
