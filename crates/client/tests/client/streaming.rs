//! The streaming guard against the real ledger: a stream cancelled after 900
//! output tokens settles 900 plus input (not 0, not the whole reservation),
//! a completed OpenAI-style stream settles its final usage, and the usage
//! reaches the ledger's route estimate and input drift.

use std::time::Duration;

use reservoir_client::{Client, ReservationState, ReserveRequest};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::*;

#[tokio::test]
async fn a_stream_cancelled_after_900_output_tokens_settles_900_plus_input() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("s1", "chat", 10_000), None).await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();
    let reservation = client
        .reserve(ReserveRequest::tokens("s1", "chat", 120, Some(2_000)).with_model("m-stream"))
        .await
        .unwrap();
    assert_eq!(reservation.reserved_units(), 2_120);
    let id = reservation.id().clone();
    let lease = reservation.start().await.unwrap();

    // The proxying task owns the lease and reads the provider's events; it is
    // aborted (the client hung up) right after it passed on the 900th token.
    let (events, mut rx) = mpsc::unbounded_channel::<Value>();
    let (passed_on, mut passed) = mpsc::unbounded_channel::<u64>();
    let task = tokio::spawn(async move {
        let mut lease = lease;
        while let Some(event) = rx.recv().await {
            lease.meter().observe_anthropic(&event);
            passed_on
                .send(lease.usage_so_far().output_tokens())
                .unwrap();
        }
        std::future::pending::<()>().await;
    });
    events.send(json!({"type": "message_start", "message": {"model": "m-stream", "usage": {"input_tokens": 120, "output_tokens": 1}}})).unwrap();
    for total in (100..=900).step_by(100) {
        events
            .send(json!({"type": "message_delta", "usage": {"output_tokens": total}}))
            .unwrap();
    }
    let mut seen = 0;
    while seen < 900 {
        seen = passed.recv().await.unwrap();
    }
    task.abort();
    let _ = task.await;
    client.flush().await;

    let r = client.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.actual_units),
        (ReservationState::Settled, Some(1_020))
    );
    let p = ledger.partition("s1", "chat").await;
    assert_eq!(
        (
            p["spent_units"].as_u64(),
            p["reserved_units"].as_u64(),
            p["available_units"].as_u64()
        ),
        (Some(1_020), Some(0), Some(8_980))
    );

    // The settle carried the usage: the route's digest has the sample, drift its inputs.
    let (status, estimate) = ledger
        .get(&format!(
            "/v1/routes/chat/estimate?model=m-stream&min_position={}",
            r.log_position.query()
        ))
        .await;
    assert_eq!(status, 200, "{estimate}");
    assert_eq!(estimate["samples"].as_u64(), Some(1), "{estimate}");
    assert_eq!(
        estimate["input_drift"]["counted_input_units"].as_u64(),
        Some(120),
        "{estimate}"
    );
    assert_eq!(
        estimate["input_drift"]["reported_input_units"].as_u64(),
        Some(120),
        "{estimate}"
    );
}

#[tokio::test]
async fn a_completed_openai_stream_settles_its_final_usage_and_drift() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("s2", "complete", 10_000), None).await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();
    let mut lease = client
        .reserve(ReserveRequest::tokens("s2", "complete", 50, Some(300)))
        .await
        .unwrap()
        .start()
        .await
        .unwrap();
    for chunk in [
        r#"{"object":"chat.completion.chunk","model":"gpt-test","choices":[{"delta":{"content":"a"},"finish_reason":null}]}"#,
        r#"{"object":"chat.completion.chunk","model":"gpt-test","choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        r#"{"object":"chat.completion.chunk","model":"gpt-test","choices":[],"usage":{"prompt_tokens":55,"completion_tokens":210}}"#,
        "[DONE]",
    ] {
        lease.meter().observe_sse_data(chunk);
    }
    assert!(lease.usage_so_far().finished());
    let settled = lease.finish().await.unwrap();
    // The provider's reported input (55), not the gateway's count (50), is what was spent.
    assert_eq!(settled.actual_units, 265);
    let r = settled.receipt.unwrap();
    let (_, estimate) = ledger
        .get(&format!(
            "/v1/routes/complete/estimate?model=gpt-test&min_position={}",
            r.log_position.query()
        ))
        .await;
    assert_eq!(
        (
            estimate["samples"].as_u64(),
            estimate["input_drift"]["counted_input_units"].as_u64(),
            estimate["input_drift"]["reported_input_units"].as_u64()
        ),
        (Some(1), Some(50), Some(55)),
        "{estimate}"
    );
    let p = ledger.partition("s2", "complete").await;
    assert_eq!(
        (p["spent_units"].as_u64(), p["reserved_units"].as_u64()),
        (Some(265), Some(0))
    );
}

#[tokio::test]
async fn a_stream_that_fails_before_any_output_still_pays_its_input() {
    let ledger = Ledger::start().await;
    ledger.publish(policy("s3", "chat", 10_000), None).await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();
    let lease = client
        .reserve(ReserveRequest::tokens("s3", "chat", 80, Some(1_000)))
        .await
        .unwrap()
        .start()
        .await
        .unwrap();
    let id = lease.id().clone();
    drop(lease); // the provider errored before its first event
    client.flush().await;
    let r = client.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.actual_units),
        (ReservationState::Settled, Some(80))
    );
    let p = ledger.partition("s3", "chat").await;
    assert_eq!(p["spent_units"].as_u64(), Some(80));
}
