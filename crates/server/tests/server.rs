//! Integration tests of `reservoir serve` over real HTTP on 127.0.0.1.
//!
//! One test binary (fewer links of RocksDB), one module per area. Most tests start
//! a server in-process on an ephemeral port; `crash` runs the real `reservoir`
//! binary as a child process and kills it. Every test ends by checking
//! conservation on every partition through `GET /v1/partitions`.

#[path = "server/support.rs"]
mod support;

#[path = "server/auth.rs"]
mod auth;
#[path = "server/auth_cluster.rs"]
mod auth_cluster;
#[path = "server/auth_ops.rs"]
mod auth_ops;
#[path = "server/bounded.rs"]
mod bounded;
#[path = "server/clock.rs"]
mod clock;
#[path = "server/cluster.rs"]
mod cluster;
#[path = "server/cluster_client.rs"]
mod cluster_client;
#[path = "server/cluster_forward.rs"]
mod cluster_forward;
#[path = "server/cluster_retired.rs"]
mod cluster_retired;
#[path = "server/cluster_shards.rs"]
mod cluster_shards;
#[path = "server/cluster_topic.rs"]
mod cluster_topic;
#[path = "server/config.rs"]
mod config;
#[path = "server/crash.rs"]
mod crash;
#[path = "server/dashboard.rs"]
mod dashboard;
#[path = "server/dimensions.rs"]
mod dimensions;
#[path = "server/epochs.rs"]
mod epochs;
#[path = "server/failures.rs"]
mod failures;
#[path = "server/generations.rs"]
mod generations;
#[path = "server/idempotency.rs"]
mod idempotency;
#[path = "server/kafka.rs"]
mod kafka;
#[path = "server/lifecycle.rs"]
mod lifecycle;
#[path = "server/limits.rs"]
mod limits;
#[path = "server/malformed.rs"]
mod malformed;
#[path = "server/openapi.rs"]
mod openapi;
#[path = "server/projector.rs"]
mod projector;
#[path = "server/queries.rs"]
mod queries;
#[path = "server/recovery.rs"]
mod recovery;
#[path = "server/shadow.rs"]
mod shadow;
#[path = "server/shards.rs"]
mod shards;
#[path = "server/sizing.rs"]
mod sizing;
#[path = "server/sweepers.rs"]
mod sweepers;
#[path = "server/tls.rs"]
mod tls;
