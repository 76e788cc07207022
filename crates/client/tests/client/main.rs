//! Integration tests of `reservoir-client` against the real `reservoir`
//! binary (embedded log, a temporary data directory per test; see
//! `support.rs` for how the binary is found). One test binary, one module per
//! area. The only stand-ins are the fault proxy (a lost answer, a moving
//! server address) and the fake model provider of the example gateway.
//! Every test that changes the ledger ends by checking conservation on every
//! partition and that each call made exactly one reservation.

mod proxy;
mod support;

#[path = "../../examples/gateway/app.rs"]
mod app;
#[path = "../../examples/gateway/provider.rs"]
mod provider;

mod auth;
mod gateway;
mod lifecycle;
mod restart;
mod scheduler;
mod shards;
mod streaming;
mod unknown;
