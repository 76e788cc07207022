//! Time as an input: the writer and the sweepers read a clock they are given.
//! On a manual clock, a lease expires and a bucket refills when the test moves
//! the clock, by exactly what the policy says, and not at all while real time
//! passes with the clock standing still.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reservoir_server::clock::ManualClock;
use serde_json::json;

use crate::support::*;

/// 2023-11-14T22:13:20Z: any fixed instant will do.
const T0: u64 = 1_700_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expire_when_the_clock_says_so() {
    let dir = crate::support::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    let mut p = policy("t", "r", 1, 1_000, 0);
    p.hold_ttl_ms = 60_000;
    s.publish(&p, "e").await;
    let (status, r) = s.reserve("lease", "t", "r", 700).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    // The writer stamped the manual clock's time, not the wall clock's.
    assert_eq!(r["expires_at_ms"], T0 + 60_000);

    // Real time passes (many sweeps at 50 ms), the clock stands still: nothing is due.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, r) = s.get("/v1/reservations/lease").await;
    assert_eq!(r["state"], "RESERVED");

    // One millisecond short of the lease: still not due.
    clock.advance(59_999);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, r) = s.get("/v1/reservations/lease").await;
    assert_eq!(r["state"], "RESERVED");

    clock.advance(1);
    eventually(Duration::from_secs(5), || async {
        let (_, r) = s.get("/v1/reservations/lease").await;
        (r["state"] == "EXPIRED").then_some(())
    })
    .await;
    let (status, body) = s
        .post(
            "/v1/reservations/lease/start",
            json!({"operation_id": "op"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let parts = s.assert_conserved().await;
    assert_eq!(parts[0]["available_units"], 1_000);
    assert_eq!(parts[0]["reserved_units"], 0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_refills_by_exactly_the_time_the_clock_moved() {
    let dir = crate::support::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let s = TestServer::embedded_on_clock(dir.path(), Arc::new(clock.clone())).await;
    // 1,000 burst, 10 units a second.
    s.publish(&policy("t", "r", 1, 1_000, 10), "e").await;
    s.reserve("spend", "t", "r", 500).await;
    s.post(
        "/v1/reservations/spend/start",
        json!({"operation_id": "op"}),
    )
    .await;
    let (status, body) = s
        .post(
            "/v1/reservations/spend/settle",
            json!({"operation_id": "op", "actual_units": 500}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let available = |parts: &[serde_json::Value]| parts[0]["available_units"].as_u64().unwrap();
    assert_eq!(available(&s.assert_conserved().await), 500);

    // Real time passes, the clock stands still: no refill.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(available(&s.assert_conserved().await), 500);

    // Ten seconds on the clock earn exactly 100 units.
    clock.advance(10_000);
    eventually(Duration::from_secs(5), || async {
        let parts = s.partitions().await;
        (available(&parts) == 600).then_some(())
    })
    .await;
    // And no more, however long the sweepers keep running.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let parts = s.assert_conserved().await;
    assert_eq!(available(&parts), 600);
    assert_eq!(parts[0]["minted_units"], 100);
    s.stop().await;
}
