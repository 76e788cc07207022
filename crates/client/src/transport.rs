//! What carries the client's requests and measures its waits: the two
//! seams a gateway (or a simulation) can replace.
//!
//! - [`Transport`]: one HTTP exchange with the ledger, to an [`Exchange`]:
//!   an answer, or none (and whether the request may have left). The
//!   default is [`ReqwestTransport`]; [`crate::ClientBuilder::http`] gives
//!   it a `reqwest::Client` of the gateway's own. Whatever carries the
//!   request, the client decides the same way what an answer means
//!   (`crate::http::classify`), so a transport cannot change what is retried.
//! - [`Timer`]: the retry loop's clock and its sleeps. The default is
//!   tokio's ([`TokioTimer`]). The simulator (`crates/sim`) drives the
//!   client over the server's own router with a timer on its simulated
//!   clock, so a retry loop there waits for simulated time, never real time.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// A boxed future a transport or timer returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One request to the ledger, as the client sends it.
#[derive(Debug)]
pub struct Outgoing<'a> {
    pub method: Method,
    /// The full URL: a node's base URL and the path.
    pub url: String,
    /// The JSON body, if any.
    pub body: Option<&'a Value>,
    /// The bearer token, if the client has one.
    pub token: Option<&'a str>,
    /// How long to wait for this attempt's answer.
    pub timeout: Duration,
}

/// One exchange: an answer, or no answer (and whether the request may have been sent).
#[derive(Clone, Debug)]
pub enum Exchange {
    Answer {
        status: StatusCode,
        /// `Retry-After`, in whole seconds.
        retry_after: Option<Duration>,
        body: Vec<u8>,
        /// The owner a node forwarded the request to (`x-reservoir-served-by`).
        served_by: Option<String>,
    },
    Lost {
        why: String,
        /// False only when the request cannot have reached the ledger
        /// (the connection was never made).
        maybe_sent: bool,
    },
}

/// What the client reads of an answer before its body: the status,
/// `Retry-After` (whole seconds) and `x-reservoir-served-by`. A transport
/// reads it, then the body, without keeping the headers.
#[derive(Clone, Debug)]
pub struct AnswerHead {
    pub status: StatusCode,
    pub retry_after: Option<Duration>,
    pub served_by: Option<String>,
}

impl AnswerHead {
    pub fn read(status: StatusCode, headers: &reqwest::header::HeaderMap) -> AnswerHead {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        AnswerHead {
            status,
            retry_after: header(reqwest::header::RETRY_AFTER.as_str())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
            served_by: header(crate::owners::SERVED_BY).map(str::to_string),
        }
    }

    /// The exchange, with the body, or why the body was cut off (then the
    /// request may have been applied: no answer).
    pub fn with_body(self, body: Result<Vec<u8>, String>) -> Exchange {
        match body {
            Ok(body) => Exchange::Answer {
                status: self.status,
                retry_after: self.retry_after,
                body,
                served_by: self.served_by,
            },
            Err(why) => Exchange::Lost {
                why: format!("answer cut off: {why}"),
                maybe_sent: true,
            },
        }
    }
}

/// Carries one request to the ledger and brings back what came of it.
pub trait Transport: Send + Sync + 'static {
    fn send<'a>(&'a self, request: Outgoing<'a>) -> BoxFuture<'a, Exchange>;
}

/// The retry loop's clock and sleeps.
pub trait Timer: Send + Sync + 'static {
    /// Time since some fixed origin of this timer's own.
    fn now(&self) -> Duration;
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// HTTP over a `reqwest::Client`.
#[derive(Clone, Debug, Default)]
pub struct ReqwestTransport {
    pub http: reqwest::Client,
}

impl Transport for ReqwestTransport {
    fn send<'a>(&'a self, out: Outgoing<'a>) -> BoxFuture<'a, Exchange> {
        Box::pin(async move {
            let mut request = self.http.request(out.method, out.url).timeout(out.timeout);
            if let Some(body) = out.body {
                request = request.json(body);
            }
            if let Some(token) = out.token {
                request = request.bearer_auth(token);
            }
            let response = match request.send().await {
                Ok(r) => r,
                Err(e) => {
                    return Exchange::Lost {
                        why: format!("{e:?}"),
                        maybe_sent: !e.is_connect(),
                    }
                }
            };
            let head = AnswerHead::read(response.status(), response.headers());
            let body = response.bytes().await.map(|b| b.to_vec());
            head.with_body(body.map_err(|e| format!("{e:?}")))
        })
    }
}

/// Tokio's clock and sleeps.
#[derive(Clone, Copy, Debug)]
pub struct TokioTimer {
    origin: tokio::time::Instant,
}

impl Default for TokioTimer {
    fn default() -> Self {
        TokioTimer {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Timer for TokioTimer {
    fn now(&self) -> Duration {
        tokio::time::Instant::now().duration_since(self.origin)
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}
