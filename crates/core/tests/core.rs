//! The one integration-test binary of `reservoir-core`: the ledger contract
//! (seed 002) as tables, plus state-machine property tests against a small
//! reference model. Every test runs through [`harness::Harness`], which checks the
//! conservation invariants after every applied event and, when it is dropped, that
//! replaying the recorded events from scratch reproduces the live state.

#[path = "core/harness.rs"]
mod harness;

#[path = "core/rejections.rs"]
mod rejections;
#[path = "core/transitions.rs"]
mod transitions;
