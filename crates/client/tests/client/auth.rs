//! The client against a ledger that authenticates: the builder's token is
//! sent on every step; without one, or with another tenant's, the ledger's
//! 401 and 403 come back as definitive (not retried) errors.

use std::time::Duration;

use reservoir_client::{Client, Error, ReservationState, ReserveRequest, Settlement};

use crate::support::*;

#[tokio::test]
async fn the_token_is_sent_on_every_step_and_refusals_are_typed() {
    let (ledger, tokens) = Ledger::start_authenticated(&["t-auth", "t-other"]).await;
    ledger.publish(policy("t-auth", "chat", 1_000), None).await;
    let client = |token: Option<&str>| {
        let builder = Client::builder(&ledger.base()).retry(quick_retry(Duration::from_secs(20)));
        match token {
            Some(t) => builder.token(t),
            None => builder,
        }
        .build()
    };
    let request = || ReserveRequest::units("t-auth", "chat", 300);

    let gateway = client(Some(&tokens[0]));
    let reservation = gateway.reserve(request()).await.unwrap();
    let id = reservation.id().clone();
    let lease = reservation.start().await.unwrap();
    let settled = lease
        .finish_with(Settlement {
            actual_units: 120,
            operation_id: None,
            usage: None,
        })
        .await
        .unwrap();
    assert_eq!(settled.receipt.unwrap().state, ReservationState::Settled);
    assert_eq!(
        gateway.get(&id).await.unwrap().unwrap().state,
        ReservationState::Settled
    );

    let status = |answer: Result<_, Error>| match answer {
        Err(Error::Rejected { status, .. }) => status,
        Err(other) => panic!("not a rejection: {other:?}"),
        Ok(_) => panic!("admitted"),
    };
    // The route read before a reserve is refused already.
    assert_eq!(status(client(None).reserve(request()).await), 401);
    let other_tenant = client(Some(&tokens[1]));
    assert_eq!(status(other_tenant.reserve(request()).await), 403);
    // And A's reservation is, to B's gateway, one that does not exist.
    assert!(client(Some(&tokens[1])).get(&id).await.unwrap().is_none());

    let partitions = ledger.assert_conserved().await;
    assert_eq!(partitions[0]["spent_units"].as_u64(), Some(120));
}
