//! `reservoir-client`: what a gateway embeds to hold LLM capacity in the
//! Reservoir ledger, over its HTTP API only.
//!
//! - [`Client`]: reserve / start / settle / release with typed receipts
//!   ([`Receipt`]) and sizing inputs ([`ReserveRequest`], [`Sizing`]). Every
//!   step is retried with the same id and body under one deadline
//!   ([`RetryPolicy`]: exponential backoff, full jitter), so a lost answer can
//!   never debit twice; a reserve left unanswered is
//!   [`Error::ReservationUnknown`] until [`Client::resolve`] asks again with
//!   the same id. [`Client::inject_max_tokens`] puts the route's default
//!   `max_tokens` into requests that set none. [`ClientBuilder::token`] is
//!   the bearer token sent on every request; the ledger's 401 and 403 are
//!   [`Error::Rejected`], never retried.
//! - [`Reservation`] (RESERVED) and [`Lease`] (STARTED): the streaming guard.
//!   The lease keeps a running count ([`UsageMeter`]) of Anthropic- or
//!   OpenAI-style stream usage and settles on finish, or — cancelled, failed,
//!   dropped — in the background against what the count reached, recording
//!   usage (model, counted and reported input, output) for the ledger's
//!   estimates and drift. A call that ended before its first event is
//!   charged the gateway's counted input, unless the provider refused it
//!   with an error status ([`UsageMeter::provider_refused`]): then none.
//! - [`StartScheduler`]: when only so many provider calls may run, picks the
//!   next RESERVED request to start by tenant weight and policy priority.
//! - [`Fallback`]: the hook where emergency shards admit while the ledger is
//!   unreachable; without one the client fails closed.
//! - [`shards::ShardBook`]: the emergency-shard fallback: signed shards bound
//!   to this process, local books checked after every operation, reconcile.
//! - [`transport`]: the two seams a gateway or a test may replace: what
//!   carries a request ([`transport::Transport`], reqwest by default) and
//!   the retry loop's clock and sleeps ([`transport::Timer`], tokio's). The
//!   simulator (`crates/sim`) runs the client over the server's router on a
//!   simulated clock through them.
//! - [`metrics`]: what is exported through the `metrics` facade.
//! - [`owners`]: in cluster mode, with [`ClientBuilder::cluster_nodes`],
//!   requests go straight to the node that owns their partition once a
//!   forwarded answer named it.

mod background;
mod client;
mod error;
mod fallback;
mod http;
mod lease;
pub mod metrics;
pub mod owners;
mod retry;
mod scheduler;
pub mod shards;
pub mod transport;
mod types;
mod usage;

pub use client::{Client, ClientBuilder};
pub use error::Error;
pub use fallback::{Fallback, LocalHold, NotAdmitted};
pub use lease::{Lease, Reservation, Settled};
pub use retry::{Backoff, RetryPolicy};
pub use scheduler::{
    Admitted, FairQueue, FairnessGap, Permit, SchedulerConfig, StartScheduler, TenantShare, Ticket,
};
pub use shards::ShardBook;
pub use types::{
    CapacityUnit, LogPosition, OperationId, Problem, Receipt, ReservationId, ReservationState,
    ReserveRequest, RouteInfo, Settlement, Sizing, SizingReceipt, Usage,
};
pub use usage::{SseScanner, UsageMeter};
