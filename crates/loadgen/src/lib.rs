//! # reservoir-loadgen
//!
//! The load benchmark of Reservoir. N concurrent clients drive
//! reserve → start → settle cycles, spread over S subjects (tenants), against
//! one of two targets, and the run reports cycles per second and p50/p99 cycle
//! and step latency as a table and as one JSON line:
//!
//! - `reservoir`: `reservoir serve` over its HTTP API ([`http`]), one keep-alive
//!   connection per client;
//! - `redis`: the single-script Redis + Lua design of the first seed
//!   ([`redis_ledger`], scripts in `crates/loadgen/lua/`), one connection per
//!   client, every call one `EVALSHA`.
//!
//! Either with a one-dimension policy (reserve 600 → settle 180 tokens) or,
//! with [`run::Dims`], a three-dimension one (requests, input and output
//! tokens: a sized reserve, a settle from the usage; [`redis_dims`] on Redis).
//!
//! [`run`] is the load loop, [`stats`] the measurements, [`report`] the
//! Markdown comparison that `scripts/bench-http` writes.

pub mod http;
pub mod redis_dims;
pub mod redis_ledger;
pub mod report;
pub mod run;
pub mod stats;
