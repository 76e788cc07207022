//! Kafka rows of the append benchmark: `KafkaLog::append` (encode, idempotent
//! produce with `acks=all`, read back and check the claim) against raw rdkafka —
//! a `FutureProducer` with the same settings producing the same bytes (value,
//! key, headers, explicit partition) and awaiting every delivery — to the same
//! broker, in the same run, alternating (ratio: median of the per-run
//! ratios). The broker is `RESERVOIR_TEST_BROKERS`
//! (`eval "$(scripts/kafka start)"`); without it there are no Kafka rows.

use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::{codec, Claim, EventLog, LogEntry, Record};

use super::{median, rate, records, Row, RUNS};

/// Events per measurement: fewer than the embedded rows, since every batch
/// costs at least two broker round trips.
fn events_per_run(batch: usize) -> usize {
    match batch {
        1 => 300,
        64 => 64 * 30,
        _ => batch * 10,
    }
}

fn topic(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("reservoir.bench.{name}.{}.{nanos}", std::process::id())
}

fn config(brokers: &str, topic: &str) -> KafkaConfig {
    let mut config = KafkaConfig::new(brokers, "bench");
    config.topic = topic.to_string();
    config.partitions_for_new_topic = 1;
    config
}

async fn kafka_log_run(brokers: &str, batch: usize) -> f64 {
    let log = KafkaLog::connect(config(brokers, &topic("log")))
        .await
        .unwrap();
    let claim = log.claim(0).await.unwrap();
    let total = events_per_run(batch);
    let batches: Vec<Vec<Record>> = records(&claim, total, 1)
        .chunks(batch)
        .map(|c| c.to_vec())
        .collect();
    let start = Instant::now();
    for b in batches {
        log.append(b).await.unwrap();
    }
    rate(total, start.elapsed())
}

/// What the log would send for one record: key, framed value, headers.
type Encoded = (String, Vec<u8>, Vec<(&'static str, String)>);

async fn raw_run(brokers: &str, batch: usize) -> f64 {
    let topic = topic("raw");
    // Creates the topic the same way; the log's own producer stays idle.
    let _creator = KafkaLog::connect(config(brokers, &topic)).await.unwrap();
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .set("linger.ms", "1")
        .create()
        .unwrap();
    let claim = Claim {
        writer_id: "bench".into(),
        epoch: 1,
    };
    // Connect and get a producer id before the clock starts, as the log did
    // when it claimed: the same bytes as that claim, to the same partition.
    let warm_up = LogEntry::Claim(claim.clone());
    let value = codec::encode(&warm_up).unwrap();
    let key = codec::record_key(&warm_up);
    producer
        .send(
            FutureRecord::to(&topic)
                .partition(0)
                .key(key.as_bytes())
                .payload(&value),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let total = events_per_run(batch);
    let encoded: Vec<Encoded> = records(&claim, total, 1)
        .into_iter()
        .map(|r| {
            let entry = LogEntry::Record(r);
            (
                codec::record_key(&entry),
                codec::encode(&entry).unwrap(),
                codec::headers(&entry),
            )
        })
        .collect();
    let start = Instant::now();
    for chunk in encoded.chunks(batch) {
        let mut deliveries = Vec::with_capacity(chunk.len());
        for (key, value, header_values) in chunk {
            let mut headers = OwnedHeaders::new_with_capacity(header_values.len());
            for (name, v) in header_values {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(v.as_bytes()),
                });
            }
            let record = FutureRecord::to(&topic)
                .partition(0)
                .key(key.as_bytes())
                .payload(value.as_slice())
                .headers(headers);
            deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
        }
        for delivery in deliveries {
            delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
    }
    rate(total, start.elapsed())
}

/// Which broker the rows ran on: `RESERVOIR_TEST_BROKER` as scripts/test
/// sets it (Apache Kafka unless it says tansu).
fn broker_label() -> &'static str {
    match std::env::var("RESERVOIR_TEST_BROKER").as_deref() {
        Ok("tansu") => "kafka (tansu)",
        _ => "kafka (Apache Kafka)",
    }
}

/// One row per batch size: the Kafka log beside raw rdkafka.
pub fn rows(batch_sizes: &[usize]) -> Vec<Row> {
    let Ok(brokers) = std::env::var("RESERVOIR_TEST_BROKERS") else {
        eprintln!("append bench: RESERVOIR_TEST_BROKERS not set, no Kafka rows (eval \"$(scripts/kafka start)\")");
        return Vec::new();
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    batch_sizes
        .iter()
        .map(|&batch| {
            let (mut log, mut raw, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..RUNS {
                let log_rate = rt.block_on(kafka_log_run(&brokers, batch));
                let raw_rate = rt.block_on(raw_run(&brokers, batch));
                log.push(log_rate);
                raw.push(raw_rate);
                ratios.push(log_rate / raw_rate);
            }
            Row {
                log: broker_label(),
                batch,
                events_per_sec: median(log),
                baseline: "raw rdkafka idempotent",
                baseline_events_per_sec: median(raw),
                ratio: median(ratios),
            }
        })
        .collect()
}
