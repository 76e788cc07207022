//! Accounting epochs that roll by themselves, through the real server on a
//! manual clock: the writer names the epoch a publish opens, rolls into the
//! next one at the boundary with reservations in flight (capacity and debt
//! move, the total across partitions changes by 0), reservations of the ended
//! epoch finish there and their refunds move on, and recovery from the log
//! finds the same partitions.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reservoir_core::EpochLength;
use reservoir_server::clock::ManualClock;
use serde_json::{json, Value};

use crate::generations::{assert_moves_pair, capacity, reserve_started, settle, sum};
use crate::support::*;

/// 2026-11-30T23:59:00Z: a minute before a day (and a month) ends.
const LAST_MINUTE: u64 = 1_796_083_140_000;

fn epoch<'a>(parts: &'a [Value], name: &str) -> &'a Value {
    parts
        .iter()
        .find(|p| p["accounting_epoch"] == name)
        .unwrap_or_else(|| panic!("no epoch {name} in {parts:?}"))
}

fn daily(burst: u64) -> reservoir_core::Policy {
    let mut p = policy("t", "r", 1, burst, 0);
    p.epoch_length = EpochLength::Daily;
    p
}

async fn publish_unnamed(s: &TestServer, p: &reservoir_core::Policy) -> (StatusCode, Value) {
    s.post("/v1/policies", json!({ "policy": p })).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_names_a_rolling_policy_s_epoch_and_refuses_another() {
    let clock = ManualClock::new(LAST_MINUTE);
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    let (status, body) = s.publish(&daily(1_000), "2026-11-29").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(problem_type(&body), "accounting_epoch_not_current");
    let (status, body) = publish_unnamed(&s, &policy("t", "r", 1, 1_000, 0)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(s.partitions().await.is_empty(), "nothing opened");

    let (status, body) = s.publish(&daily(1_000), "2026-11-30").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["partition_key"]["accounting_epoch"], "2026-11-30");
    // The same publish without a name is the same partition.
    let (status, body) = publish_unnamed(&s, &daily(1_000)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(s.assert_conserved().await.len(), 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_rolls_at_its_boundary_with_reservations_in_flight() {
    let clock = ManualClock::new(LAST_MINUTE);
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    let (status, body) = publish_unnamed(&s, &daily(1_000)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    reserve_started(&s, "started", 300).await;
    let (status, body) = s.reserve("held", "t", "r", 100).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Over budget and unpaid: 400 of debt that must follow into the next day.
    reserve_started(&s, "over", 200).await;
    assert_eq!(
        settle(&s, "over", 200 + 400 + 400).await["state"],
        "SETTLED_WITH_DEBT"
    );
    let before = s.assert_conserved().await;
    let old = epoch(&before, "2026-11-30");
    assert_eq!(
        (old["available_units"].clone(), old["debt_units"].clone()),
        (json!(0), json!(400))
    );

    // A second before midnight nothing rolls; at midnight the sweeper rolls
    // the idle subject/route without any request.
    clock.advance(59_999);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.partitions().await.len(), 1);
    clock.advance(1);
    let parts = eventually(Duration::from_secs(10), || async {
        let parts = s.partitions().await;
        (parts.len() == 2).then_some(parts)
    })
    .await;
    let parts_checked = s.assert_conserved().await;
    assert_eq!(parts_checked.len(), parts.len());
    let (old, new) = (
        epoch(&parts_checked, "2026-11-30"),
        epoch(&parts_checked, "2026-12-01"),
    );
    assert_eq!(old["closed"], true);
    assert_eq!(
        new["policy_generation"], 1,
        "the same generation, the next epoch"
    );
    assert_eq!(new["opening_units"], 0, "nothing minted");
    assert_eq!(new["debt_units"], 400, "the debt followed");
    assert_eq!(old["debt_units"], 0);
    assert_eq!(
        capacity(&parts_checked, "t", "r"),
        capacity(&before, "t", "r")
    );
    assert_moves_pair(&parts_checked, "t", "r");
    let (_, active) = s.get("/v1/policies/t/r").await;
    assert_eq!(active["accounting_epoch"], "2026-12-01");

    // The debt freezes the new day; the ended day's reservations finish there
    // and what they give back (200 of 300, all of 100) moves on into the new
    // day's `available`, frozen until refill repays the debt (as a refund in
    // the same partition would be).
    let (status, body) = s.reserve("frozen", "t", "r", 1).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(problem_type(&body), "debt_outstanding");
    let r = settle(&s, "started", 100).await;
    assert_eq!(r["accounting_epoch"], "2026-11-30");
    let (status, body) = s.post("/v1/reservations/held/release", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let parts = s.assert_conserved().await;
    let (old, new) = (epoch(&parts, "2026-11-30"), epoch(&parts, "2026-12-01"));
    assert_eq!(old["drained"], true, "{old}");
    assert_eq!(
        (new["available_units"].clone(), new["debt_units"].clone()),
        (json!(300), json!(400))
    );
    let (status, body) = s.reserve("still-frozen", "t", "r", 1).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(
        capacity(&parts, "t", "r") + sum(&parts, "t", "r", "spent_units"),
        1_000 + sum(&parts, "t", "r", "debt_units"),
        "what was spent beyond the opening is still owed"
    );
    assert_moves_pair(&parts, "t", "r");
    let parts = s.assert_conserved().await;
    s.stop().await;

    // Recovery rebuilds the same partitions from the log.
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    let again = s.assert_conserved().await;
    for name in ["2026-11-30", "2026-12-01"] {
        assert_eq!(epoch(&again, name), epoch(&parts, name), "{name}");
    }
    let (_, active) = s.get("/v1/policies/t/r").await;
    assert_eq!(active["accounting_epoch"], "2026-12-01");
    s.stop().await;
}

/// A reserve past the boundary rolls the epoch itself (before any sweep
/// could), and is admitted in the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_past_the_boundary_lands_in_the_new_epoch() {
    let clock = ManualClock::new(LAST_MINUTE);
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    let mut hourly = daily(1_000);
    hourly.epoch_length = EpochLength::Hourly;
    let (status, body) = publish_unnamed(&s, &hourly).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["partition_key"]["accounting_epoch"], "2026-11-30T23");
    reserve_started(&s, "before", 250).await;
    clock.advance(60_000);
    let (status, body) = s.reserve("after", "t", "r", 100).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["accounting_epoch"], "2026-12-01T00");
    settle(&s, "before", 250).await;
    let parts = s.assert_conserved().await;
    assert_eq!(parts.len(), 2);
    let new = epoch(&parts, "2026-12-01T00");
    assert_eq!(new["available_units"], 1_000 - 250 - 100);
    assert_eq!(
        capacity(&parts, "t", "r") + sum(&parts, "t", "r", "spent_units"),
        1_000
    );
    assert_moves_pair(&parts, "t", "r");
    s.stop().await;
}
