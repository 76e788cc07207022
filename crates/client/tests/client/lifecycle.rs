//! The steps themselves against the real ledger: sized reserves with the
//! route's default `max_tokens`, typed receipts, settle with usage, release
//! (explicit and on drop), and refusals as typed errors.

use std::time::Duration;

use reservoir_client::{CapacityUnit, Client, Error, ReservationState, ReserveRequest, Settlement};
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn reserve_start_finish_with_the_route_default_max_tokens() {
    let ledger = Ledger::start().await;
    ledger
        .publish(policy("t1", "chat", 10_000), Some(estimator(500)))
        .await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();

    let route = client.route("t1", "chat").await.unwrap();
    assert_eq!(
        (
            route.default_max_tokens,
            route.priority,
            route.capacity_unit,
            route.policy_generation
        ),
        (Some(500), 0, CapacityUnit::Tokens, 1)
    );
    // The gateway injects the default into a request without one, and keeps a given one.
    let mut body = json!({"model": "m-1", "messages": []});
    assert_eq!(
        client
            .inject_max_tokens("t1", "chat", &mut body)
            .await
            .unwrap(),
        Some(500)
    );
    assert_eq!(body["max_tokens"], 500);
    let mut given = json!({"max_tokens": 64});
    assert_eq!(
        client
            .inject_max_tokens("t1", "chat", &mut given)
            .await
            .unwrap(),
        Some(64)
    );
    assert_eq!(given["max_tokens"], 64);

    let request = ReserveRequest::tokens("t1", "chat", 100, Some(500)).with_model("m-1");
    let reservation = client.reserve(request).await.unwrap();
    let receipt = reservation.receipt().unwrap().clone();
    assert_eq!(
        (receipt.state, receipt.reserved_units, receipt.held_units),
        (ReservationState::Reserved, 600, 600)
    );
    let sizing = receipt.sizing.clone().unwrap();
    assert_eq!(
        (
            sizing.rule.as_str(),
            sizing.input_units,
            sizing.output_units
        ),
        ("max_tokens", 100, 500)
    );

    let mut lease = reservation.start().await.unwrap();
    lease.meter().observe_anthropic(&json!({"type": "message_start", "message": {"model": "m-1", "usage": {"input_tokens": 104, "output_tokens": 1}}}));
    lease
        .meter()
        .observe_anthropic(&json!({"type": "message_delta", "usage": {"output_tokens": 321}}));
    lease
        .meter()
        .observe_anthropic(&json!({"type": "message_stop"}));
    let settled = lease.finish().await.unwrap();
    let r = settled.receipt.unwrap();
    assert_eq!(
        (r.state, r.actual_units, settled.actual_units),
        (ReservationState::Settled, Some(425), 425)
    );

    let p = ledger.partition("t1", "chat").await;
    assert_eq!(
        (
            p["spent_units"].as_u64(),
            p["reserved_units"].as_u64(),
            p["reservations"].as_u64()
        ),
        (Some(425), Some(0), Some(1))
    );
}

#[tokio::test]
async fn unstarted_reservations_are_released_explicitly_or_on_drop() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("t2", "chat", 1_000), None).await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();

    let kept = client
        .reserve(ReserveRequest::units("t2", "chat", 300))
        .await
        .unwrap();
    let released = kept.release().await.unwrap().unwrap();
    assert_eq!(released.state, ReservationState::Released);

    let dropped = client
        .reserve(ReserveRequest::units("t2", "chat", 400))
        .await
        .unwrap();
    let id = dropped.id().clone();
    drop(dropped);
    client.flush().await;
    assert_eq!(
        client.get(&id).await.unwrap().unwrap().state,
        ReservationState::Released
    );
    assert_eq!(client.background_failures(), 0);

    let p = ledger.partition("t2", "chat").await;
    assert_eq!(
        (
            p["available_units"].as_u64(),
            p["spent_units"].as_u64(),
            p["reservations"].as_u64()
        ),
        (Some(1_000), Some(0), Some(2))
    );
}

#[tokio::test]
async fn refusals_and_rejections_are_typed() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("t3", "chat", 1_000), None).await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();
    let held = client
        .reserve(ReserveRequest::units("t3", "chat", 800))
        .await
        .unwrap();

    // (request, expected code, transient)
    let table = [
        (
            ReserveRequest::units("t3", "chat", 300),
            "insufficient_capacity",
            true,
        ),
        (
            ReserveRequest::units("t3", "chat", 5_000),
            "request_too_large",
            false,
        ),
        (
            ReserveRequest::units("t3", "nowhere", 1),
            "no_policy",
            false,
        ),
    ];
    for (request, code, transient) in table {
        let e = client.reserve(request).await.unwrap_err();
        assert_eq!((e.code(), e.is_transient()), (Some(code), transient), "{e}");
        if let Error::Refused {
            problem,
            retry_after,
        } = &e
        {
            assert_eq!(problem.policy_generation, Some(1));
            assert!(problem.limiting_dimension.is_some(), "{problem:?}");
            assert!(retry_after.is_some(), "a 429 carries Retry-After");
        }
    }
    // Same id, a different request: the ledger's exists_with_different_digest, not a second debit.
    let again = client
        .reserve_receipt(held.id(), &ReserveRequest::units("t3", "chat", 10))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some("exists_with_different_digest"));

    let lease = held.start().await.unwrap();
    let settled = lease
        .finish_with(Settlement {
            actual_units: 790,
            operation_id: None,
            usage: None,
        })
        .await
        .unwrap();
    assert_eq!(settled.receipt.unwrap().actual_units, Some(790));
    let p = ledger.partition("t3", "chat").await;
    assert_eq!(
        (p["spent_units"].as_u64(), p["reservations"].as_u64()),
        (Some(790), Some(1))
    );
}

#[tokio::test]
async fn a_requests_route_settles_one_unit_per_call() {
    let ledger = Ledger::start().await;
    let mut p = policy("t4", "calls", 10);
    p["capacity_unit"] = json!("requests");
    ledger.publish(p, None).await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();
    let mut lease = client
        .reserve(ReserveRequest::units("t4", "calls", 1))
        .await
        .unwrap()
        .start()
        .await
        .unwrap();
    lease.meter().saw_output_total(700);
    assert_eq!(lease.settlement().actual_units, 1);
    lease.finish().await.unwrap();
    let p = ledger.partition("t4", "calls").await;
    assert_eq!(
        (p["spent_units"].as_u64(), p["available_units"].as_u64()),
        (Some(1), Some(9))
    );
}
