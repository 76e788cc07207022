//! The one integration-test binary of reservoir-log (one binary: one link of
//! RocksDB and librdkafka). A module per area:
//! - `codec`: the Avro wire contract (round trips, Rust types against the
//!   `.avsc` files, keys and headers, garbage in); `codec_registry`: the
//!   schema registry and evolution.
//! - `suite`: `log_suite!`, the behaviours every `EventLog` must show; each
//!   implementation's module instantiates it (embedded, Kafka, memory).
//! - `embedded`: what only the RocksDB log promises (process lock, crash test),
//!   and `SecondaryLog` following a running log from another instance.
//! - `kafka`: fencing between writers, crashes, the independent reader;
//!   `kafka_mock`: faults on rdkafka's mock cluster; `kafka_pipelined`: appends in flight together (ordering, fencing, doubt);
//!   `kafka_topic`: the topic keeps every record (created so, or refused).
//! - `memory`: the memory log (feature `memory`, enabled for this binary by
//!   the crate's dev-dependency on itself): claims and fault injection.

/// The broker under test (`kafka::brokers`), or return from the test: a
/// loud skip, or a failure under `CI=true`.
macro_rules! require_broker {
    () => {
        match crate::kafka::brokers() {
            Some(brokers) => brokers,
            None => return,
        }
    };
}

#[path = "log/fixtures.rs"]
mod fixtures;

#[path = "log/codec.rs"]
mod codec;

#[path = "log/codec_registry.rs"]
mod codec_registry;

#[path = "log/kafka.rs"]
mod kafka;

#[path = "log/kafka_mock.rs"]
mod kafka_mock;

#[path = "log/kafka_pipelined.rs"]
mod kafka_pipelined;

#[path = "log/kafka_topic.rs"]
mod kafka_topic;

#[path = "log/suite.rs"]
pub mod suite;

#[path = "log/embedded.rs"]
mod embedded;

#[path = "log/memory.rs"]
mod memory;
