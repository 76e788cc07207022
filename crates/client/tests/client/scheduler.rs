//! The fair start scheduler over real reservations: three tenants of weights
//! 1:2:5 saturating a gateway that runs two calls at once share 10,000 starts
//! within 5% of their weighted shares; within a tenant a higher-priority
//! route's requests all start before a lower one's; and every start was a
//! reservation the ledger made and settled (conservation, one per start).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reservoir_client::{Client, ReserveRequest, SchedulerConfig, Settlement, StartScheduler};

use crate::support::*;

const STARTS: usize = 10_000;

/// A scheduler that runs one call at a time.
fn one_at_a_time() -> StartScheduler {
    StartScheduler::new(SchedulerConfig {
        concurrency: 1,
        ..SchedulerConfig::default()
    })
}

/// Reserves `units` and starts the call when its turn comes.
async fn start_in_turn(
    scheduler: &StartScheduler,
    client: &Client,
    (subject, route): (&str, &str),
    units: u64,
) -> reservoir_client::Lease {
    let reservation = client
        .reserve(ReserveRequest::units(subject, route, units))
        .await
        .unwrap();
    scheduler.start(reservation).await.unwrap()
}

/// Settles a call that used `units`.
async fn settle(lease: reservoir_client::Lease, units: u64) {
    lease
        .finish_with(Settlement {
            actual_units: units,
            operation_id: None,
            usage: None,
        })
        .await
        .unwrap();
}
const PRODUCERS_PER_TENANT: usize = 12;

#[tokio::test]
async fn saturating_tenants_share_starts_by_weight() {
    let ledger = Ledger::start().await;
    let weights = [("w1", 1u32), ("w2", 2), ("w5", 5)];
    for (tenant, _) in weights {
        ledger
            .publish(policy(tenant, "chat", 1_000_000), None)
            .await;
    }
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(30)))
        .build();
    let scheduler = StartScheduler::new(SchedulerConfig {
        concurrency: 2,
        weights: weights.iter().map(|(t, w)| (t.to_string(), *w)).collect(),
        ..SchedulerConfig::default()
    });

    let order: Arc<Mutex<Vec<String>>> = Arc::default();
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut producers = Vec::new();
    for (tenant, _) in weights {
        for _ in 0..PRODUCERS_PER_TENANT {
            let (client, scheduler, order, admitted) = (
                client.clone(),
                scheduler.clone(),
                order.clone(),
                admitted.clone(),
            );
            producers.push(tokio::spawn(async move {
                let mut settled = 0u64;
                while admitted.load(Ordering::SeqCst) < STARTS {
                    let reservation = client
                        .reserve(ReserveRequest::units(tenant, "chat", 2))
                        .await
                        .unwrap();
                    let turn = scheduler.admit(reservation).await.unwrap();
                    admitted.fetch_add(1, Ordering::SeqCst);
                    order.lock().unwrap().push(tenant.to_string());
                    let lease = turn.start().await.unwrap();
                    settle(lease, 1).await;
                    settled += 1;
                }
                settled
            }));
        }
    }
    let mut settled_by_tenant: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, p) in producers.into_iter().enumerate() {
        *settled_by_tenant
            .entry(weights[i / PRODUCERS_PER_TENANT].0)
            .or_default() += p.await.unwrap();
    }

    let order = order.lock().unwrap().clone();
    assert!(order.len() >= STARTS);
    let total_weight: u32 = weights.iter().map(|(_, w)| w).sum();
    for (tenant, weight) in weights {
        let starts = order[..STARTS].iter().filter(|t| *t == tenant).count();
        let share = starts as f64 / STARTS as f64;
        let fair = f64::from(weight) / f64::from(total_weight);
        assert!(
            (share - fair).abs() / fair < 0.05,
            "{tenant}: {starts} starts, share {share:.4} vs fair {fair:.4}"
        );
    }
    // The scheduler's own account (the exported gauges) agrees with what was seen.
    for s in scheduler.shares() {
        assert_eq!(
            s.starts,
            order.iter().filter(|t| **t == s.tenant).count() as u64,
            "{s:?}"
        );
    }
    // Every start was a ledger reservation, settled once.
    for (tenant, _) in weights {
        let p = ledger.partition(tenant, "chat").await;
        let n = settled_by_tenant[tenant];
        assert_eq!(
            (
                p["reservations"].as_u64(),
                p["spent_units"].as_u64(),
                p["reserved_units"].as_u64()
            ),
            (Some(n), Some(n), Some(0)),
            "{tenant}"
        );
    }
}

#[tokio::test]
async fn a_higher_priority_request_never_waits_behind_a_lower_one_of_its_tenant() {
    let ledger = Ledger::start().await;
    let mut low = policy("p1", "batch", 100_000);
    low["priority"] = 1.into();
    let mut high = policy("p1", "interactive", 100_000);
    high["priority"] = 9.into();
    ledger.publish(low, None).await;
    ledger.publish(high, None).await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(30)))
        .build();
    assert_eq!(client.route("p1", "interactive").await.unwrap().priority, 9);
    let scheduler = one_at_a_time();

    // Hold the one slot, queue low-priority requests first, then high ones.
    let blocker = start_in_turn(&scheduler, &client, ("p1", "batch"), 1).await;
    let order: Arc<Mutex<Vec<&str>>> = Arc::default();
    let mut waiting = Vec::new();
    for route in ["batch"; 10].into_iter().chain(["interactive"; 10]) {
        let reservation = client
            .reserve(ReserveRequest::units("p1", route, 1))
            .await
            .unwrap();
        let (queue, order) = (scheduler.clone(), order.clone());
        waiting.push(tokio::spawn(async move {
            let turn = queue.admit(reservation).await.unwrap();
            order.lock().unwrap().push(route);
            let lease = turn.start().await.unwrap();
            settle(lease, 1).await;
        }));
        // Queued in this order: wait until the scheduler holds it.
        while scheduler.waiting() < waiting.len() {
            tokio::task::yield_now().await;
        }
    }
    settle(blocker, 1).await;
    for w in waiting {
        w.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, [["interactive"; 10], ["batch"; 10]].concat());
    let batch = ledger.partition("p1", "batch").await;
    let interactive = ledger.partition("p1", "interactive").await;
    assert_eq!(
        (
            batch["spent_units"].as_u64(),
            interactive["spent_units"].as_u64()
        ),
        (Some(11), Some(10))
    );
}

/// A caller that stops waiting for its turn (a timeout, a disconnect) leaves
/// the queue at once: its reservation goes back to the ledger then, not when
/// its turn would have come, and its tenant is not charged a start for it.
#[tokio::test]
async fn a_cancelled_wait_leaves_the_queue_and_gives_its_reservation_back() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("q1", "chat", 1_000), None).await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(30)))
        .build();
    let scheduler = one_at_a_time();
    // The one slot is taken.
    let blocker = start_in_turn(&scheduler, &client, ("q1", "chat"), 1).await;
    let impatient = client
        .reserve(ReserveRequest::units("q1", "chat", 10))
        .await
        .unwrap();
    let id = impatient.id().as_str().to_string();
    assert_eq!(
        ledger.partition("q1", "chat").await["reserved_units"].as_u64(),
        Some(11)
    );
    let waited = tokio::time::timeout(Duration::from_millis(50), scheduler.admit(impatient)).await;
    assert!(waited.is_err(), "the slot is held: the wait times out");
    assert_eq!(
        scheduler.waiting(),
        0,
        "the cancelled waiter left the queue"
    );

    // Released in the background while the blocker still runs.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, receipt) = ledger.get(&format!("/v1/reservations/{id}")).await;
        assert_eq!(status, 200, "{receipt}");
        if receipt["state"] == "RELEASED" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {receipt} while the slot is held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ledger.partition("q1", "chat").await["reserved_units"].as_u64(),
        Some(1),
        "only the blocker's unit is held"
    );

    settle(blocker, 1).await;
    let next = start_in_turn(&scheduler, &client, ("q1", "chat"), 2).await;
    settle(next, 2).await;
    // Two starts: the blocker and the next; the cancelled one is not counted.
    let shares = scheduler.shares();
    assert_eq!(shares.len(), 1);
    assert_eq!(shares[0].starts, 2, "{shares:?}");
    let p = ledger.partition("q1", "chat").await;
    assert_eq!(
        (
            p["spent_units"].as_u64(),
            p["reserved_units"].as_u64(),
            p["available_units"].as_u64()
        ),
        (Some(3), Some(0), Some(997)),
        "{p}"
    );
}
