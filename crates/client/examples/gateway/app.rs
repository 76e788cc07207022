//! The example gateway's one route, `POST /v1/messages` (Anthropic-style,
//! streamed), using every part of the client:
//!
//! 1. the tenant is the `x-tenant` header; the route's default `max_tokens`
//!    is injected when the request sets none;
//! 2. input is counted and the call reserved (a 429 from the ledger is passed
//!    on with its `Retry-After`);
//! 3. the fair start scheduler picks when it starts (tenant weight, policy
//!    priority), then the reservation is started — the lease;
//! 4. the provider's SSE bytes are passed through untouched while the lease
//!    counts their usage; at `message_stop` it settles what was used, and if
//!    the client hangs up (the body is dropped) or the provider fails, the
//!    dropped lease settles against the count in the background (no input
//!    if the provider answered an error status: it did not run).
//!
//! The answer carries `x-reservation-id`, so a caller can look the settle up.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use reservoir_client::{Client, Error, Lease, ReserveRequest, SseScanner, StartScheduler};
use serde_json::{json, Value};

/// The ledger route every request of this gateway is limited under.
pub const ROUTE: &str = "messages";

pub struct Gateway {
    pub ledger: Client,
    pub scheduler: StartScheduler,
    /// The provider's base URL.
    pub provider: String,
    pub http: reqwest::Client,
}

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/messages", post(messages))
        .with_state(gateway)
}

fn problem(status: StatusCode, detail: String) -> Response {
    (
        status,
        Json(json!({"type": "about:blank", "status": status.as_u16(), "detail": detail})),
    )
        .into_response()
}

fn ledger_error(e: Error) -> Response {
    match e {
        Error::Refused {
            problem: p,
            retry_after,
        } => {
            let mut r = problem(StatusCode::TOO_MANY_REQUESTS, p.detail.clone());
            if let Some(after) = retry_after {
                r.headers_mut()
                    .insert("retry-after", after.as_secs().into());
            }
            r
        }
        e if e.is_transient() => problem(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        e => problem(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

async fn messages(
    State(g): State<Arc<Gateway>>,
    headers: HeaderMap,
    Json(mut body): Json<Value>,
) -> Response {
    let Some(tenant) = headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return problem(StatusCode::UNAUTHORIZED, "x-tenant names the caller".into());
    };
    let max_tokens = match g.ledger.inject_max_tokens(&tenant, ROUTE, &mut body).await {
        Ok(m) => m,
        Err(e) => return ledger_error(e),
    };
    body["stream"] = true.into();
    let counted = count_input_tokens(&body);
    let model = body["model"].as_str().unwrap_or("unknown").to_string();
    let request = ReserveRequest::tokens(&tenant, ROUTE, counted, max_tokens).with_model(&model);
    let reservation = match g.ledger.reserve(request).await {
        Ok(r) => r,
        Err(e) => return ledger_error(e),
    };
    let id = reservation.id().to_string();
    let mut lease = match g.scheduler.start(reservation).await {
        Ok(lease) => lease,
        Err(e) => return ledger_error(e),
    };
    // Dropped on any early return below: settles against the count (the
    // gateway's counted input so far, none if the provider refused).
    let upstream = match g
        .http
        .post(format!("{}/v1/messages", g.provider))
        .json(&body)
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            // It answered an error: the call did not run, no input is charged.
            lease.meter().provider_refused();
            return problem(
                StatusCode::BAD_GATEWAY,
                format!("provider answered {}", r.status()),
            );
        }
        Err(e) => {
            return problem(
                StatusCode::BAD_GATEWAY,
                format!("provider unreachable: {e}"),
            )
        }
    };
    let relay = Relay {
        upstream,
        lease: Some(lease),
        scanner: SseScanner::default(),
    };
    let stream = futures_util::stream::unfold(relay, |mut relay| async move {
        let lease = relay.lease.as_mut()?;
        match relay.upstream.chunk().await {
            Ok(Some(bytes)) => {
                for data in relay.scanner.push(&bytes) {
                    lease.meter().observe_sse_data(&data);
                }
                Some((Ok::<Bytes, std::io::Error>(bytes), relay))
            }
            Ok(None) => {
                // The provider finished: settle now, with its final count.
                let lease = relay.lease.take()?;
                if let Err(e) = lease.finish().await {
                    tracing::warn!(error = %e, "settle after a completed stream failed");
                }
                None
            }
            Err(e) => {
                relay.lease = None; // dropped: settles against the count
                Some((Err(std::io::Error::other(e)), relay))
            }
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-reservation-id", id)
        .body(Body::from_stream(stream))
        .expect("a response")
}

/// Words of every message's text: the example's stand-in for counting the
/// templated request with the provider's tokenizer.
pub fn count_input_tokens(body: &Value) -> u64 {
    body["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter_map(|m| m["content"].as_str())
                .map(|c| c.split_whitespace().count() as u64)
                .sum()
        })
        .unwrap_or(0)
}

/// The stream in flight: the provider's answer and the lease counting it.
struct Relay {
    upstream: reqwest::Response,
    lease: Option<Lease>,
    scanner: SseScanner,
}
