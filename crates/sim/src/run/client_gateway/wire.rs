//! The client gateway's wire: the client's [`Transport`] and [`Timer`]
//! over the simulated network and clock, and the server's router that
//! answers what the wire carries (see the parent module).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::{Poll, Waker};
use std::time::Duration;

use axum::http::Method;
use reservoir_client::transport::{AnswerHead, BoxFuture, Exchange, Outgoing, Timer, Transport};
use reservoir_server::clock::{Clock, ManualClock};
use tokio::sync::oneshot;
use tower::ServiceExt;

use super::BASE;
use crate::run::{Arc, VecDeque};

/// One request of the client, as the wire carries it.
#[derive(Clone)]
pub(super) struct HttpRequest {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) body: Option<Vec<u8>>,
    /// The call it names (by its reservation id), if any.
    pub(super) call: Option<usize>,
}

impl HttpRequest {
    /// `POST /v1/reservations`: a reserve (whose copies and losses matter).
    pub(super) fn is_reserve(&self) -> bool {
        self.method == Method::POST && self.path == "/v1/reservations"
    }
}

/// A request the client put on the wire, waiting for a wave.
pub(super) struct Sent {
    pub(super) request: HttpRequest,
    pub(super) reply: oneshot::Sender<Exchange>,
}

/// A request on its way through the router; `reply` is `None` for a copy
/// the network delivers late (its answer goes nowhere).
pub(in crate::run) struct InFlight {
    /// The client side (`World::clients`) that sent it.
    pub(super) side: usize,
    pub(super) request: HttpRequest,
    pub(super) reply: Option<oneshot::Sender<Exchange>>,
    pub(super) answer: tokio::task::JoinHandle<Exchange>,
}

/// What the client's transport and timer share with the world.
#[derive(Default)]
pub(super) struct Wire {
    pub(super) sent: VecDeque<Sent>,
    /// Deadlines of sleeping tasks: (simulated ms, order of sleeping, waker).
    pub(super) sleepers: Vec<(u64, u64, Waker)>,
    pub(super) slept: u64,
    /// Readings of the time since the close (see `Timer::now`).
    pub(super) closed_reads: u64,
}

#[derive(Clone)]
pub(super) struct Shared {
    /// The gateway whose client this is (its calls' ids begin `g<gateway>-c`).
    pub(super) gateway: usize,
    pub(super) wire: Arc<Mutex<Wire>>,
    pub(super) clock: ManualClock,
    /// Set when the run ends: every wait ends at once and every deadline has passed.
    pub(super) closed: Arc<AtomicBool>,
}

impl Shared {
    pub(super) fn wire(&self) -> std::sync::MutexGuard<'_, Wire> {
        self.wire.lock().expect("the wire's lock")
    }
}

impl Transport for Shared {
    fn send<'a>(&'a self, out: Outgoing<'a>) -> BoxFuture<'a, Exchange> {
        let path = out.url.strip_prefix(BASE).unwrap_or(&out.url).to_string();
        let body = out
            .body
            .map(|b| serde_json::to_vec(b).expect("a JSON value serializes"));
        let call = call_named(self.gateway, &path, body.as_deref());
        let (reply, answer) = oneshot::channel();
        if !self.closed.load(Ordering::SeqCst) {
            self.wire().sent.push_back(Sent {
                request: HttpRequest {
                    method: out.method,
                    path,
                    body,
                    call,
                },
                reply,
            });
        }
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| Exchange::Lost {
                why: "no answer".into(),
                maybe_sent: true,
            })
        })
    }
}

impl Timer for Shared {
    fn now(&self) -> Duration {
        if self.closed.load(Ordering::SeqCst) {
            // Every deadline has passed, and each reading is an hour past
            // the last: a retry loop begun after the close (a dropped
            // lease's background settle) ends at its next look at the time,
            // instead of spinning with a deadline always 3 s away.
            let mut wire = self.wire();
            wire.closed_reads += 1;
            return Duration::from_secs(u64::MAX / 4 + 3_600 * wire.closed_reads);
        }
        Duration::from_millis(self.clock.now_ms())
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        let wait = u64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let at = self.clock.now_ms().saturating_add(wait);
        let shared = self.clone();
        Box::pin(std::future::poll_fn(move |cx| {
            if shared.closed.load(Ordering::SeqCst) || shared.clock.now_ms() >= at {
                return Poll::Ready(());
            }
            let mut wire = shared.wire();
            wire.slept += 1;
            let order = wire.slept;
            wire.sleepers.push((at, order, cx.waker().clone()));
            Poll::Pending
        }))
    }
}

/// The call of `gateway` a request names: the simulator's ids are
/// `g<gateway>-c<call>`.
pub(super) fn call_named(gateway: usize, path: &str, body: Option<&[u8]>) -> Option<usize> {
    let prefix = format!("g{gateway}-c");
    let from = |text: &str| -> Option<usize> {
        let at = text.find(&prefix)? + prefix.len();
        let digits: String = text[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    from(path).or_else(|| body.and_then(|b| from(&String::from_utf8_lossy(b))))
}

/// Hands one request to the router, as its own task.
pub(super) fn route(
    router: &axum::Router,
    request: &HttpRequest,
) -> tokio::task::JoinHandle<Exchange> {
    let request = axum::http::Request::builder()
        .method(request.method.clone())
        .uri(&request.path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            request.body.clone().unwrap_or_default(),
        ))
        .expect("a request the client sent is a valid HTTP request");
    let router = router.clone();
    tokio::spawn(async move {
        let response = match router.oneshot(request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let (parts, body) = response.into_parts();
        let head = AnswerHead::read(parts.status, &parts.headers);
        let body = axum::body::to_bytes(body, usize::MAX).await;
        head.with_body(body.map(|b| b.to_vec()).map_err(|e| e.to_string()))
    })
}
