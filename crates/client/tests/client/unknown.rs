//! Lost answers, through the fault proxy: the ledger commits, the client never
//! hears. The client asks again with the same id and gets the original
//! receipt; the partition holds one reservation and one debit. And when the
//! ledger cannot be reached at all, the fallback hook is asked — but never for
//! a reserve that may have landed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reservoir_client::{
    Client, Error, Fallback, LocalHold, ReservationId, ReservationState, ReserveRequest, RouteInfo,
    Settlement,
};
use serde_json::json;

use crate::proxy::FaultProxy;
use crate::support::*;

const RESERVE: &str = "POST /v1/reservations ";

#[tokio::test]
async fn a_reserve_whose_answer_was_lost_resolves_to_the_original_receipt() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("u1", "chat", 1_000), None).await;
    let proxy = FaultProxy::start(ledger.addr()).await;
    let client = Client::builder(&proxy.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();
    client.route("u1", "chat").await.unwrap();

    proxy.drop_answers(RESERVE, 1);
    let reservation = client
        .reserve(ReserveRequest::units("u1", "chat", 600))
        .await
        .unwrap();
    assert_eq!(
        (proxy.dropped(RESERVE), proxy.forwarded(RESERVE)),
        (1, 2),
        "one lost answer, one retry"
    );

    // The receipt the retry got is the one the ledger committed the first time.
    let answered = reservation.receipt().unwrap().clone();
    let committed = client.get(reservation.id()).await.unwrap().unwrap();
    assert_eq!(answered, committed);
    let p = ledger.partition("u1", "chat").await;
    assert_eq!(
        (
            p["reservations"].as_u64(),
            p["reserved_units"].as_u64(),
            p["available_units"].as_u64()
        ),
        (Some(1), Some(600), Some(400))
    );

    // A lost settle answer: the retry repeats the same amount, settled once.
    let lease = reservation.start().await.unwrap();
    proxy.drop_answers("POST /v1/reservations/", 1);
    let settled = lease
        .finish_with(Settlement {
            actual_units: 250,
            operation_id: None,
            usage: None,
        })
        .await
        .unwrap();
    assert_eq!(settled.receipt.unwrap().state, ReservationState::Settled);
    assert_eq!(proxy.dropped("POST /v1/reservations/"), 1);
    let p = ledger.partition("u1", "chat").await;
    assert_eq!(
        (
            p["reservations"].as_u64(),
            p["spent_units"].as_u64(),
            p["available_units"].as_u64()
        ),
        (Some(1), Some(250), Some(750))
    );
}

#[tokio::test]
async fn reservation_unknown_until_asked_again_with_the_same_id() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("u2", "chat", 1_000), None).await;
    let proxy = FaultProxy::start(ledger.addr()).await;
    let fallback = Arc::new(CountingFallback::default());
    let client = Client::builder(&proxy.base())
        .retry(quick_retry(Duration::from_millis(800)))
        .fallback(fallback.clone())
        .build();
    client.route("u2", "chat").await.unwrap();

    proxy.drop_answers(RESERVE, usize::MAX);
    let id = ReservationId::new("rl-unknown-1").unwrap();
    let request = ReserveRequest::units("u2", "chat", 700);
    let e = client
        .reserve_as(id.clone(), request.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::ReservationUnknown { id: unknown, .. } if *unknown == id),
        "{e}"
    );
    assert!(
        proxy.forwarded(RESERVE) >= 2,
        "retried under the same id before the deadline"
    );
    // Never handed to the fallback: the ledger may hold it. No answer
    // either: the fallback's count of failures goes on.
    assert_eq!(fallback.reserved.load(Ordering::SeqCst), 0);
    assert_eq!(fallback.answered.load(Ordering::SeqCst), 0);

    proxy.clear();
    let resolved = client.resolve(&id, &request).await.unwrap();
    // The ledger answered the resolve: reachable again.
    assert_eq!(fallback.answered.load(Ordering::SeqCst), 1);
    assert_eq!(resolved, client.get(&id).await.unwrap().unwrap());
    assert_eq!(
        (resolved.state, resolved.held_units),
        (ReservationState::Reserved, 700)
    );
    let p = ledger.partition("u2", "chat").await;
    assert_eq!(
        (p["reservations"].as_u64(), p["reserved_units"].as_u64()),
        (Some(1), Some(700)),
        "one debit however many asks"
    );

    client.release(&id).await.unwrap();
    let p = ledger.partition("u2", "chat").await;
    assert_eq!(p["available_units"].as_u64(), Some(1_000));
}

/// What a reserve answered only with 5xx until the deadline says: behind a
/// proxy that forwarded it and stopped waiting (502, 504) it may have
/// landed, so it is unknown and resolved to one debit; a ledger recovering
/// from its log (503 `not_ready`) decided nothing, so it is not unknown and
/// the fallback is asked.
#[tokio::test]
async fn a_reserve_answered_only_5xx_is_unknown_unless_the_ledger_was_not_ready() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("u5", "chat", 1_000), None).await;
    let proxy = FaultProxy::start(ledger.addr()).await;
    let fallback = Arc::new(CountingFallback::default());
    let client = Client::builder(&proxy.base())
        .retry(quick_retry(Duration::from_millis(600)))
        .fallback(fallback.clone())
        .build();
    client.route("u5", "chat").await.unwrap();
    // (status, problem code, forwarded to the ledger, unknown)
    let table = [
        (502, "bad_gateway", true, true),
        (504, "gateway_timeout", true, true),
        (503, "not_ready", false, false),
    ];
    let mut landed = 0;
    for (n, (status, code, forward, unknown)) in table.into_iter().enumerate() {
        proxy.answer_with(RESERVE, status, code, forward);
        let id = ReservationId::new(format!("rl-5xx-{n}")).unwrap();
        let request = ReserveRequest::units("u5", "chat", 100);
        let reserved_locally = fallback.reserved.load(Ordering::SeqCst);
        let answer = client.reserve_as(id.clone(), request.clone()).await;
        proxy.clear();
        if unknown {
            assert!(
                matches!(&answer, Err(Error::ReservationUnknown { id: u, .. }) if *u == id),
                "{status}: {:?}",
                answer.as_ref().err()
            );
            landed += 1;
            let resolved = client.resolve(&id, &request).await.unwrap();
            assert_eq!(resolved.state, ReservationState::Reserved, "{status}");
        } else {
            let local = answer.expect("admitted by the fallback");
            assert!(local.receipt().is_none(), "{status}: a local hold");
            drop(local);
        }
        assert_eq!(
            fallback.reserved.load(Ordering::SeqCst) - reserved_locally,
            u64::from(!unknown),
            "{status}: the fallback asked only when nothing can have landed"
        );
        let p = ledger.partition("u5", "chat").await;
        assert_eq!(
            (p["reservations"].as_u64(), p["reserved_units"].as_u64()),
            (Some(landed), Some(100 * landed)),
            "{status}: one debit per reserve that landed, none for the others"
        );
    }
}

/// With `retry_refusals`, 429s are retried until the deadline; the ledger
/// decided every one of them, so the reserve ends in its refusal and is
/// never handed to the fallback (which would admit what the ledger refused).
#[tokio::test]
async fn a_refusal_retried_to_the_deadline_is_a_refusal_not_a_fallback() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("u6", "chat", 1_000), None).await;
    let fallback = Arc::new(CountingFallback::default());
    let mut retry = quick_retry(Duration::from_millis(400));
    retry.retry_refusals = true;
    let client = Client::builder(&ledger.base())
        .retry(retry)
        .fallback(fallback.clone())
        .build();
    client.route("u6", "chat").await.unwrap();
    let all = client
        .reserve(ReserveRequest::units("u6", "chat", 1_000))
        .await
        .unwrap();
    let Err(refused) = client
        .reserve(ReserveRequest::units("u6", "chat", 100))
        .await
    else {
        panic!("admitted with no capacity left");
    };
    assert!(matches!(refused, Error::Refused { .. }), "{refused}");
    assert_eq!(fallback.reserved.load(Ordering::SeqCst), 0);
    assert_eq!(fallback.answered.load(Ordering::SeqCst), 2, "both decided");
    let p = ledger.partition("u6", "chat").await;
    assert_eq!(
        (p["reservations"].as_u64(), p["reserved_units"].as_u64()),
        (Some(1), Some(1_000))
    );
    drop(all);
}

#[tokio::test]
async fn an_unreachable_ledger_asks_the_fallback_and_the_lease_settles_locally() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("u3", "chat", 1_000), None).await;
    let proxy = FaultProxy::start(ledger.addr()).await;
    let closed = proxy.addr;
    let fallback = Arc::new(CountingFallback::default());
    // A fresh connection per attempt: none outlives the proxy.
    let unpooled = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let client = Client::builder(&proxy.base())
        .http(unpooled())
        .retry(quick_retry(Duration::from_millis(300)))
        .fallback(fallback.clone())
        .build();
    // The route's settings are read (the fallback is asked only for a route
    // read before); then nothing listens there: every connect is refused.
    client.route("u3", "chat").await.unwrap();
    let _dead_port = proxy.stop().await;
    let cold = Client::builder(&format!("http://{closed}"))
        .http(unpooled())
        .retry(quick_retry(Duration::from_millis(200)))
        .fallback(fallback.clone())
        .build();
    let e = cold
        .reserve(ReserveRequest::units("u3", "chat", 1))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert_eq!(
        fallback.reserved.load(Ordering::SeqCst),
        0,
        "not asked for a route never read"
    );
    let reservation = client
        .reserve(ReserveRequest::tokens("u3", "chat", 40, Some(100)))
        .await
        .unwrap();
    assert!(reservation.is_local());
    let mut lease = reservation.start().await.unwrap();
    lease
        .meter()
        .observe_anthropic(&json!({"type": "message_delta", "usage": {"output_tokens": 60}}));
    drop(lease); // cancelled mid-stream
    client.flush().await;
    assert_eq!(
        (
            fallback.reserved.load(Ordering::SeqCst),
            fallback.settled_units.load(Ordering::SeqCst),
            fallback.released.load(Ordering::SeqCst)
        ),
        (1, 100, 0)
    );
    // Without a fallback the client fails closed.
    let closed_client = Client::builder(&format!("http://{closed}"))
        .retry(quick_retry(Duration::from_millis(200)))
        .build();
    let e = closed_client
        .reserve(ReserveRequest::units("u3", "chat", 1))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
}

/// A stand-in for an emergency shard: counts what the client asked of it.
#[derive(Default)]
struct CountingFallback {
    reserved: AtomicU64,
    /// Reserves (or resolves) the ledger decided: `Fallback::ledger_answered`.
    answered: AtomicU64,
    settled_units: Arc<AtomicU64>,
    released: Arc<AtomicU64>,
}

impl Fallback for CountingFallback {
    fn reserve(
        &self,
        _: &ReservationId,
        request: &ReserveRequest,
        _: Option<&RouteInfo>,
    ) -> Option<Box<dyn LocalHold>> {
        self.reserved.fetch_add(1, Ordering::SeqCst);
        let units = match request.sizing {
            reservoir_client::Sizing::Units(u) => u,
            reservoir_client::Sizing::Tokens {
                counted_input_tokens,
                max_tokens,
            } => counted_input_tokens + max_tokens.unwrap_or(0),
        };
        Some(Box::new(CountingHold {
            units,
            settled: self.settled_units.clone(),
            released: self.released.clone(),
        }))
    }

    fn ledger_answered(&self) {
        self.answered.fetch_add(1, Ordering::SeqCst);
    }
}

struct CountingHold {
    units: u64,
    settled: Arc<AtomicU64>,
    released: Arc<AtomicU64>,
}

impl LocalHold for CountingHold {
    fn units(&self) -> u64 {
        self.units
    }
    fn settle(&self, settlement: &Settlement) {
        self.settled
            .fetch_add(settlement.actual_units, Ordering::SeqCst);
    }
    fn release(&self) {
        self.released.fetch_add(1, Ordering::SeqCst);
    }
}

/// A call whose start was lost on the way back is given back in the
/// background; the start did happen, so the client settles it at 0. On a
/// route that limits tokens beside requests that settle must carry a usage
/// (no input, no output): without one the ledger refuses it, and the call
/// would wait for its execution limit and lose its whole hold as usage
/// unknown, for a provider call never made (found by the simulator).
#[tokio::test]
async fn a_started_call_given_back_settles_at_zero_in_every_dimension() {
    let ledger = Ledger::start().await;
    let mut three = policy("u9", "chat", 1_000);
    three["capacity_unit"] = json!("requests");
    three["max_reservation_units"] = json!(1);
    three["dimensions"] = json!(["input_tokens", "output_tokens"]
        .iter()
        .map(|d| json!({
            "dimension": d, "refill": {"units": 1, "interval_ms": 3_600_000},
            "burst_units": 10_000, "opening_units": 10_000,
            "max_reservation_units": 10_000, "max_overdraft_units": 10_000
        }))
        .collect::<Vec<_>>());
    ledger.publish(three, None).await;
    let proxy = FaultProxy::start(ledger.addr()).await;
    let client = Client::builder(&proxy.base())
        .retry(quick_retry(Duration::from_millis(800)))
        .build();
    let reservation = client
        .reserve(ReserveRequest::tokens("u9", "chat", 300, Some(200)))
        .await
        .unwrap();
    let id = reservation.id().clone();
    let start = format!("POST /v1/reservations/{id}/start");
    proxy.drop_answers(&start, usize::MAX);
    let Err(e) = reservation.start().await else {
        panic!("the start's answers were all lost")
    };
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert!(proxy.dropped(&start) >= 1, "the start reached the ledger");
    proxy.clear();
    client.flush().await;
    assert_eq!(client.background_failures(), 0, "the give-back succeeded");

    let r = client.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.actual_units),
        (ReservationState::Settled, Some(0))
    );
    let p = ledger.partition("u9", "chat").await;
    for d in std::iter::once(&p).chain(p["dimensions"].as_array().unwrap()) {
        assert_eq!(
            (d["reserved_units"].as_u64(), d["spent_units"].as_u64()),
            (Some(0), Some(0)),
            "nothing held or spent: {d}"
        );
    }
}
