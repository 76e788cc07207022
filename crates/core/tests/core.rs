//! The one integration-test binary of `reservoir-core`: the ledger contract
//! (seed 002) as tables, plus state-machine property tests against a small
//! reference model. Every test runs through [`harness::Harness`], which checks the
//! conservation invariants after every applied event and, when it is dropped, that
//! replaying the recorded events from scratch reproduces the live state.

// Table rows are tuples, one column per input and the expected result last.
#![allow(clippy::type_complexity)]

#[path = "core/harness.rs"]
mod harness;

#[path = "core/dimensions.rs"]
mod dimensions;
#[path = "core/generations.rs"]
mod generations;
#[path = "core/idempotency.rs"]
mod idempotency;
#[path = "core/invalid.rs"]
mod invalid;
#[path = "core/lifecycle.rs"]
mod lifecycle;
#[path = "core/model.rs"]
mod model;
#[path = "core/overdraft.rs"]
mod overdraft;
#[path = "core/rejections.rs"]
mod rejections;
#[path = "core/retention.rs"]
mod retention;
#[path = "core/savepoint.rs"]
mod savepoint;
#[path = "core/shards_moves.rs"]
mod shards_moves;
#[path = "core/tamper.rs"]
mod tamper;
#[path = "core/terms.rs"]
mod terms;
#[path = "core/transitions.rs"]
mod transitions;
