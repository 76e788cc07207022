//! # reservoir-core
//!
//! The pure domain of Reservoir, the shared capacity ledger for LLM rate limits.
//! No I/O, no clock, no randomness, no async: time arrives as data inside every
//! command, so replaying the log reproduces state exactly.
//!
//! The main types:
//! - [`Policy`] (`admissionBudget.v1`) fixes how a subject/route is admitted.
//! - [`PartitionKey`] (subject, route, accounting epoch, policy generation) names
//!   the aggregate, [`Partition`] is its state, [`Ledger`] its conservation terms
//!   ([`Term::ALL`] lists them once, with names and sides).
//! - [`Reservation`] (`limitReservation.v1`) and [`ReservationState`], the state machine.
//! - [`decide`] turns a [`Command`] into [`Event`]s or a [`Rejection`];
//!   [`apply`] folds an event into state and is the only code that mutates it;
//!   a [`Savepoint`] takes back events applied speculatively (a failed append).
//! - [`retention`]: which records stay in memory (open ones, and finished ones
//!   for the policy's idempotency window); [`decide_retired`] answers a command
//!   about a record that left memory, from that record.
//! - [`placement`]: which log partition a subject/route's records go to
//!   (Kafka's murmur2), for the log, the cluster's routing and clients.
//!
//! After every `apply`, `opening + minted + overdraftIssued = available + reserved
//! + spent + retiredForEmergency + overdraftRepaid` holds (with the cross-partition
//! terms described in [`ledger`]); `apply` checks it and refuses to commit otherwise.
//!
//! ```
//! use reservoir_core::*;
//! let key = PartitionKey::new("tenant-7", "chat.generate", "2026-07-19T14:00Z", 31).unwrap();
//! let policy = Policy::example("tenant-7", "chat.generate", 31);
//! let mut p = Partition::default();
//! let id = ReservationId::new("rl-01").unwrap();
//! for (now, cmd) in [
//!     (0, Command::OpenPartition { key, policy }),
//!     (1, Command::Reserve { id: id.clone(), digest: RequestDigest([7; 32]), units: 600, sizing: None, further_units: vec![] }),
//!     (2, Command::Start { id: id.clone(), operation_id: OperationId::new("op-1").unwrap() }),
//!     (3, Command::Settle { id: id.clone(), operation_id: None, actual_units: 200, usage: None, further_actual_units: vec![] }),
//! ] {
//!     for event in decide(&p, &cmd, now).unwrap() {
//!         apply(&mut p, &event);
//!     }
//! }
//! assert_eq!(p.ledger.spent_units, 200);
//! assert_eq!(p.reservation(&id).unwrap().state, ReservationState::Settled);
//! p.check_invariants().unwrap();
//! ```

mod buckets;
pub mod cold;
pub mod command;
pub mod decide;
pub mod dimension;
mod effect;
pub mod epoch;
pub mod event;
pub mod ledger;
pub mod partition;
pub mod placement;
pub mod policy;
pub mod rejection;
pub mod reservation;
pub mod retention;
pub mod rollout;
pub mod savepoint;
pub mod sizing;
pub mod types;
pub mod usage;

pub use cold::{check_cold_reservation, default_estimator, ColdCheck, ColdRouteNeverWarms};
pub use command::Command;
pub use decide::{decide, decide_retired, refusal_event};
pub use dimension::{
    moved_by_dimension, Dimension, DimensionAmounts, DimensionHold, DimensionLimit, DimensionState,
};
pub use epoch::{Epoch, EpochLength};
pub use event::{Event, EventBody, RefusalReason};
pub use ledger::{check_moves, ConservationError, Ledger, MoveHalf, ShardLedger, Side, Term};
pub use partition::{apply, apply_evicting, try_apply, try_apply_evicting, ApplyError, Partition};
pub use policy::{CapacityUnit, EmergencyMode, Policy, RefillRule};
pub use rejection::{InvalidInput, Rejection, Transition};
pub use reservation::{Reservation, ReservationState, ShadowVerdict};
pub use rollout::{Mode, Rollout};
pub use savepoint::Savepoint;
pub use sizing::{size_reservation, EstimatorConfig, RouteEstimate, Sizing, SizingRule};
pub use types::{
    validate_id, MoveId, OperationId, PartitionKey, RequestDigest, ReservationId, ShardId,
    TimestampMs, Units,
};
pub use usage::Usage;
