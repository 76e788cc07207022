//! # reservoir-projections
//!
//! `projections/` is Reservoir's read side: it turns the event log into the
//! RocksDB read models that answer "what is the balance", "what happened to this
//! reservation", "how many output tokens does this route produce", "how well are
//! reservations sized" and "why is this tenant refused".
//!
//! The main types:
//! - [`Projector`] consumes any [`reservoir_log::EventReader`] (embedded, Kafka, a secondary)
//!   through the log's one validity rule ([`reservoir_log::fence`]) and writes
//!   every column family of [`store`] in the same `WriteBatch` as the log
//!   positions it consumed, so a crash never applies an event twice or skips one.
//!   Balances come from `reservoir_core::try_apply` on an in-memory `Partition`
//!   per ledger partition — the writer's own code — so they cannot disagree.
//! - [`Projections`] answers queries: balances per partition, tenant and route;
//!   reservation records; route estimates from rolling t-digests ([`sketch`]);
//!   reservation-efficiency histograms; refusals; findings; and
//!   [`diagnosis`], the first seed's reasoning about a tenant refused below
//!   their contract. [`Projections::wait_for_position`] lets a query wait for a
//!   write's log position.
//! - [`store::dump`] lists every logical key/value: the same log gives the same
//!   bytes, whether projected live in many steps or rebuilt in one go.
//!
//! Digests sample the output tokens a settle's `usage` reports, under its
//! model; a settle without reported output tokens (and every settle written
//! before usage existed) samples its whole `actual_units` under model
//! `default`. Input drift comes from settles reporting both counted and
//! provider-reported input.

use reservoir_log::{LogError, Position};
use thiserror::Error;

pub mod diagnosis;
pub mod model;
pub mod projector;
pub mod query;
pub mod sketch;
pub mod store;

pub use diagnosis::{diagnose, Diagnosis, Verdict};
pub use projector::{Projector, ProjectorConfig, StepOutcome};
pub use query::{At, Projections, RouteEstimateView};
pub use store::dump;

/// Infrastructure errors of the read side. `transient()` says whether retrying
/// may succeed.
#[derive(Debug, Error)]
pub enum ProjectionError {
    #[error("log: {0}")]
    Log(#[from] LogError),
    #[error("projection store: {0}")]
    Store(String),
    #[error("corrupt projection value in {cf} at {key}: {reason}")]
    Corrupt {
        cf: &'static str,
        key: String,
        reason: String,
    },
    #[error("projection did not reach {position:?} within {waited_ms} ms")]
    Timeout { position: Position, waited_ms: u64 },
    #[error("an earlier step failed midway; reopen the projector")]
    Poisoned,
    #[error("injected failure between apply and commit (test hook)")]
    InjectedCrash,
}

impl ProjectionError {
    pub fn transient(&self) -> bool {
        match self {
            ProjectionError::Log(e) => e.transient(),
            ProjectionError::Timeout { .. } => true,
            _ => false,
        }
    }
}
