//! The one integration-test binary of reservoir-log (one binary: one link of
//! RocksDB and librdkafka). A module per area:
//! - `codec`: the Avro wire contract (round trips, Rust types against the
//!   `.avsc` files, registry and schema evolution, garbage in).
//! - `suite`: `log_suite!`, the behaviours every `EventLog` must show, and its
//!   instantiations (embedded here; Kafka adds `log_suite!(kafka, ...)`).
//! - `embedded`: what only the RocksDB log promises (process lock, crash test).

#[path = "log/fixtures.rs"]
mod fixtures;

#[path = "log/codec.rs"]
mod codec;

#[path = "log/kafka.rs"]
mod kafka;

#[path = "log/suite.rs"]
pub mod suite;

#[path = "log/embedded.rs"]
mod embedded;
