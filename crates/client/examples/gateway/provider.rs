//! A fake model provider for the example gateway: `POST /v1/messages`
//! streams Anthropic-style SSE (`message_start` with the input count,
//! `content_block_delta`s, `message_delta`s with the cumulative output count
//! every 100 tokens, `message_stop`) up to the request's `max_tokens`.
//!
//! It bills 10 more input tokens than the gateway counts (a system prompt the
//! gateway does not see), so the ledger's input drift has something to learn.
//! `metadata.fake_pause_after_tokens` makes it stop generating at that count
//! and send only `ping`s from then on — a slow generation, so a test can hang
//! up mid-stream at a known count. `metadata.fake_refuse_status` makes it
//! refuse the call with that status, as a provider's own rate limit does.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

/// Input tokens the provider bills beyond what the gateway counted.
pub const HIDDEN_PROMPT_TOKENS: u64 = 10;
/// Output tokens per `message_delta`.
pub const STEP_TOKENS: u64 = 100;

pub fn router() -> Router {
    Router::new().route("/v1/messages", post(messages))
}

/// Words of every message's text: what the fake bills as input (plus the hidden prompt).
fn count_input_tokens(body: &Value) -> u64 {
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

fn sse(event: &str, data: &Value) -> Result<Bytes, Infallible> {
    Ok(Bytes::from(format!("event: {event}\ndata: {data}\n\n")))
}

struct Generation {
    model: String,
    input: u64,
    max_tokens: u64,
    pause_after: Option<u64>,
    output: u64,
    started: bool,
    stopped: bool,
}

async fn messages(Json(body): Json<Value>) -> Response {
    if let Some(status) = body["metadata"]["fake_refuse_status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| axum::http::StatusCode::from_u16(s).ok())
    {
        let error =
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "refused"}});
        return (status, Json(error)).into_response();
    }
    let g = Generation {
        model: body["model"].as_str().unwrap_or("fake-model").to_string(),
        input: count_input_tokens(&body) + HIDDEN_PROMPT_TOKENS,
        max_tokens: body["max_tokens"].as_u64().unwrap_or(1024),
        pause_after: body["metadata"]["fake_pause_after_tokens"].as_u64(),
        output: 0,
        started: false,
        stopped: false,
    };
    let stream = futures_util::stream::unfold(g, |mut g| async move {
        if g.stopped {
            return None;
        }
        if !g.started {
            g.started = true;
            let start = json!({"type": "message_start", "message": {"model": g.model,
                "usage": {"input_tokens": g.input, "output_tokens": 1}}});
            return Some((sse("message_start", &start), g));
        }
        if g.pause_after.is_some_and(|p| g.output >= p) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Some((sse("ping", &json!({"type": "ping"})), g));
        }
        if g.output >= g.max_tokens {
            g.stopped = true;
            return Some((sse("message_stop", &json!({"type": "message_stop"})), g));
        }
        g.output = (g.output + STEP_TOKENS).min(g.max_tokens);
        let text = json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "lorem ".repeat(STEP_TOKENS as usize)}});
        let delta = json!({"type": "message_delta", "usage": {"output_tokens": g.output}});
        let chunk = format!(
            "event: content_block_delta\ndata: {text}\n\nevent: message_delta\ndata: {delta}\n\n"
        );
        Some((Ok(Bytes::from(chunk)), g))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("a response")
}
