//! The example gateway end to end: the real ledger, the gateway's router
//! (the example's own code) and its fake provider streaming SSE. A client
//! that hangs up at 900 output tokens leaves a settle of 900 plus the billed
//! input, with its usage recorded; a request without `max_tokens` gets the
//! route default injected, is sized with the input drift the first settle
//! taught the ledger, and settles what the provider produced.

use std::sync::Arc;
use std::time::Duration;

use reservoir_client::{
    Client, ReservationId, ReservationState, SchedulerConfig, SseScanner, StartScheduler,
};
use serde_json::{json, Value};

use crate::app::{self, Gateway};
use crate::provider::{self, HIDDEN_PROMPT_TOKENS};
use crate::support::*;

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// One caller request to the gateway, as tenant `g1`.
async fn ask(gateway: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{gateway}/v1/messages"))
        .header("x-tenant", "g1")
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Waits until the ledger shows the reservation finished (the gateway
/// settles in the background once it notices the hang-up).
async fn settled_receipt(ledger: &Client, id: &ReservationId) -> reservoir_client::Receipt {
    for _ in 0..3_000 {
        if let Some(r) = ledger.get(id).await.unwrap() {
            if r.state.is_terminal() {
                return r;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never settled");
}

#[tokio::test]
async fn the_example_gateway_settles_a_hung_up_stream_at_its_count() {
    let ledger = Ledger::start().await;
    ledger
        .publish(policy("g1", app::ROUTE, 100_000), Some(estimator(1_500)))
        .await;
    let client = Client::builder(&ledger.base())
        .retry(quick_retry(Duration::from_secs(20)))
        .build();
    let gateway = serve(app::router(Arc::new(Gateway {
        ledger: client.clone(),
        scheduler: StartScheduler::new(SchedulerConfig {
            concurrency: 4,
            ..SchedulerConfig::default()
        }),
        provider: serve(provider::router()).await,
        http: reqwest::Client::new(),
    })))
    .await;
    let prompt = json!([{"role": "user", "content": "one two three four five six seven eight"}]);

    // 1. A caller that hangs up once it has seen 900 output tokens.
    let mut answer = ask(
        &gateway,
        json!({"model": "fake-model", "max_tokens": 4_000, "messages": prompt,
               "metadata": {"fake_pause_after_tokens": 900}}),
    )
    .await;
    assert_eq!(answer.status(), 200);
    let id = ReservationId::new(answer.headers()["x-reservation-id"].to_str().unwrap()).unwrap();
    let mut scanner = SseScanner::default();
    let mut seen = 0;
    while seen < 900 {
        let chunk = answer.chunk().await.unwrap().expect("the stream goes on");
        for data in scanner.push(&chunk) {
            let v: Value = serde_json::from_str(&data).unwrap();
            seen = seen.max(v["usage"]["output_tokens"].as_u64().unwrap_or(0));
        }
    }
    drop(answer); // hang up mid-stream
    let r = settled_receipt(&client, &id).await;
    let billed_input = 8 + HIDDEN_PROMPT_TOKENS;
    assert_eq!(
        (r.state, r.reserved_units, r.actual_units),
        (ReservationState::Settled, 4_008, Some(900 + billed_input))
    );
    let (_, estimate) = ledger
        .get(&format!(
            "/v1/routes/{}/estimate?model=fake-model&min_position={}",
            app::ROUTE,
            r.log_position.query()
        ))
        .await;
    assert_eq!(
        (
            estimate["samples"].as_u64(),
            estimate["input_drift"]["counted_input_units"].as_u64(),
            estimate["input_drift"]["reported_input_units"].as_u64()
        ),
        (Some(1), Some(8), Some(billed_input)),
        "{estimate}"
    );

    // 2. A request without max_tokens: the route default (1,500) is injected and reserved.
    let answer = ask(&gateway, json!({"model": "fake-model", "messages": prompt})).await;
    let id2 = ReservationId::new(answer.headers()["x-reservation-id"].to_str().unwrap()).unwrap();
    let text = answer.text().await.unwrap();
    assert!(
        text.contains("message_stop"),
        "the whole stream was passed on"
    );
    let r2 = settled_receipt(&client, &id2).await;
    // Sized from the injected limit, and the input with the drift the first
    // settle taught the ledger (counted 8, billed 18: 8 × 18/8).
    let sizing = r2.sizing.clone().unwrap();
    assert_eq!(
        (
            sizing.rule.as_str(),
            sizing.input_units,
            sizing.output_units
        ),
        ("max_tokens", billed_input, 1_500)
    );
    assert_eq!(
        (r2.reserved_units, r2.actual_units),
        (billed_input + 1_500, Some(1_500 + billed_input))
    );

    let p = ledger.partition("g1", app::ROUTE).await;
    let spent = 900 + 1_500 + 2 * billed_input;
    assert_eq!(
        (
            p["reservations"].as_u64(),
            p["spent_units"].as_u64(),
            p["reserved_units"].as_u64()
        ),
        (Some(2), Some(spent), Some(0))
    );

    // 3. The provider refuses the call (its own rate limit): the gateway
    // answers 502 and its dropped lease settles with no input (the call did
    // not run), in the background.
    let refused = ask(
        &gateway,
        json!({"model": "fake-model", "max_tokens": 100, "messages": prompt,
               "metadata": {"fake_refuse_status": 429}}),
    )
    .await;
    assert_eq!(refused.status(), 502);
    let mut p = ledger.partition("g1", app::ROUTE).await;
    for _ in 0..3_000 {
        if p["reservations"].as_u64() == Some(3) && p["reserved_units"].as_u64() == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        p = ledger.partition("g1", app::ROUTE).await;
    }
    assert_eq!(
        (
            p["reservations"].as_u64(),
            p["spent_units"].as_u64(),
            p["reserved_units"].as_u64()
        ),
        (Some(3), Some(spent), Some(0)),
        "the refused call settled with nothing spent"
    );
    assert_eq!(client.background_failures(), 0);
}
