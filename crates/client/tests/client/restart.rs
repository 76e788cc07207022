//! Retries under server restarts: clients run reserve → start → settle
//! cycles through the proxy (one address for the client) while the ledger
//! process is SIGKILLed and restarted on the same data directory, twice.
//! Afterwards every acknowledged step is still there, each call made exactly
//! one reservation (one debit), and spent is the sum of what was settled.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reservoir_client::{Client, ReservationId, ReservationState, ReserveRequest, Settlement};
use tokio::sync::Notify;

use crate::proxy::FaultProxy;
use crate::support::*;

const WORKERS: usize = 6;
const CYCLES: usize = 12;

#[tokio::test]
async fn retries_across_server_restarts_keep_every_acknowledged_step() {
    let mut ledger = Ledger::start().await;
    ledger.publish(policy("r1", "chat", 1_000_000), None).await;
    let proxy = FaultProxy::start(ledger.addr()).await;
    let client = Client::builder(&proxy.base())
        .retry(quick_retry(Duration::from_secs(90)))
        .build();
    client.route("r1", "chat").await.unwrap();

    let settled: Arc<Mutex<BTreeMap<ReservationId, u64>>> = Arc::default();
    let progress = Arc::new((AtomicUsize::new(0), Notify::new()));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (client, settled, progress) = (client.clone(), settled.clone(), progress.clone());
        workers.push(tokio::spawn(async move {
            for c in 0..CYCLES {
                let units = 100 + (w * CYCLES + c) as u64;
                let reservation = client
                    .reserve(ReserveRequest::units("r1", "chat", units))
                    .await
                    .unwrap();
                let id = reservation.id().clone();
                let lease = reservation.start().await.unwrap();
                let actual = units / 2;
                let s = lease
                    .finish_with(Settlement {
                        actual_units: actual,
                        operation_id: None,
                        usage: None,
                    })
                    .await
                    .unwrap();
                assert_eq!(s.receipt.unwrap().state, ReservationState::Settled);
                settled.lock().unwrap().insert(id, actual);
                progress.0.fetch_add(1, Ordering::SeqCst);
                progress.1.notify_waiters();
            }
        }));
    }
    // Kill mid-traffic: once a third, then two thirds, of the cycles were acknowledged.
    for threshold in [WORKERS * CYCLES / 3, 2 * WORKERS * CYCLES / 3] {
        loop {
            let notified = progress.1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if progress.0.load(Ordering::SeqCst) >= threshold {
                break;
            }
            notified.await;
        }
        ledger.restart().await;
        proxy.set_upstream(ledger.addr());
    }
    for w in workers {
        w.await.unwrap();
    }

    let settled = settled.lock().unwrap().clone();
    assert_eq!(settled.len(), WORKERS * CYCLES);
    for (id, actual) in &settled {
        let r = client.get(id).await.unwrap().unwrap();
        assert_eq!(
            (r.state, r.actual_units),
            (ReservationState::Settled, Some(*actual)),
            "{id}"
        );
    }
    let p = ledger.partition("r1", "chat").await;
    let spent: u64 = settled.values().sum();
    assert_eq!(
        p["reservations"].as_u64(),
        Some((WORKERS * CYCLES) as u64),
        "one reservation per call: {p}"
    );
    assert_eq!(
        (p["spent_units"].as_u64(), p["reserved_units"].as_u64()),
        (Some(spent), Some(0))
    );
    assert_eq!(client.background_failures(), 0);
}
