//! The client gateway: one more gateway, whose calls are the client crate's
//! own request loop (`reservoir_client::Client`: every step retried with the
//! same id and body under its deadline, a reserve left unanswered ending as
//! RESERVATION_UNKNOWN and resolved by asking again, a lease whose start
//! failed released or settled at 0 in the background, a dropped lease
//! settling a cut-off stream in the background), over HTTP handled by the
//! server's own router (`reservoir_server::api::router`: its extractors,
//! handlers, status codes and problem+json), in process: no socket.
//!
//! The client's two seams ([`reservoir_client::transport`]) are the
//! simulator's: its [`Transport`] puts each request on the simulated wire,
//! where a wave of the round hands it to the router (or refuses the
//! connection, while the gateway is cut off); the answer comes back when the
//! round delivers its replies, or is lost on the way (the client sees no
//! answer, and may have been heard). Its [`Timer`] is the run's manual
//! clock: a backoff or a deadline passes only as simulated time passes, and
//! the sleepers it wakes are woken in the order of their deadlines. The
//! client's jitter and fresh operation ids come from `fastrand`'s generator
//! of the run's thread, seeded from the seed at the start of the run.
//!
//! Every draw of the world's generator (which calls, their sizes, what they
//! use, which answers are lost) happens in the world, in order; a call's
//! task only follows its plan. What the task learns is reported back and
//! kept in the reference model (the call's `told`), which the checker holds
//! against the ledger after every round, as for the other gateways.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::{Poll, Waker};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use reservoir_client::transport::{BoxFuture, Exchange, Outgoing, Timer, Transport};
use reservoir_client::{Client, Error as ClientError, Receipt, ReserveRequest, Settlement};
use reservoir_server::clock::{Clock, ManualClock};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tower::ServiceExt;

use super::*;

/// The client gateway's number: after the simulator's own gateways.
pub(super) const CLIENT_GATEWAY: usize = GATEWAYS;
/// The ledger's URL as the client knows it (never resolved: the wire is ours).
const BASE: &str = "http://ledger";
/// Yields for the client's tasks to run to their next request or wait.
const CLIENT_YIELDS: usize = 8;

/// One request of the client, as the wire carries it.
#[derive(Clone)]
struct HttpRequest {
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
    /// The call it names (by its reservation id), if any.
    call: Option<usize>,
}

/// A request the client put on the wire, waiting for a wave.
struct Sent {
    request: HttpRequest,
    reply: oneshot::Sender<Exchange>,
}

/// A request on its way through the router; `reply` is `None` for a copy
/// the network delivers late (its answer goes nowhere).
pub(super) struct InFlight {
    request: HttpRequest,
    reply: Option<oneshot::Sender<Exchange>>,
    answer: tokio::task::JoinHandle<Exchange>,
}

/// What the client's transport and timer share with the world.
#[derive(Default)]
struct Wire {
    sent: VecDeque<Sent>,
    /// Deadlines of sleeping tasks: (simulated ms, order of sleeping, waker).
    sleepers: Vec<(u64, u64, Waker)>,
    slept: u64,
}

#[derive(Clone)]
struct Shared {
    wire: Arc<Mutex<Wire>>,
    clock: ManualClock,
    /// Set when the run ends: every wait ends at once and every deadline has passed.
    closed: Arc<AtomicBool>,
}

impl Shared {
    fn wire(&self) -> std::sync::MutexGuard<'_, Wire> {
        self.wire.lock().expect("the wire's lock")
    }
}

impl Transport for Shared {
    fn send<'a>(&'a self, out: Outgoing<'a>) -> BoxFuture<'a, Exchange> {
        let path = out.url.strip_prefix(BASE).unwrap_or(&out.url).to_string();
        let body = out
            .body
            .map(|b| serde_json::to_vec(b).expect("a JSON value serializes"));
        let call = call_named(&path, body.as_deref());
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
            // Every deadline has passed: a retry loop still running ends.
            return Duration::from_secs(u64::MAX / 4);
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

/// The call a request names: the simulator's ids are `g<gateway>-c<call>`.
fn call_named(path: &str, body: Option<&[u8]>) -> Option<usize> {
    let prefix = format!("g{CLIENT_GATEWAY}-c");
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

/// What a call's task learnt, reported to the world in order.
enum Report {
    /// A receipt the client returned (reserve, resolve, release, settle).
    Told(Receipt),
    Started,
    /// The step's outcome is unknown to the gateway (a reserve without an
    /// answer, a settle that may have happened).
    Unknown(&'static str),
    /// The caller hung up mid-stream: the lease is dropped and settles what
    /// it counted in the background.
    Dropped,
    Resolved,
    Refused,
    /// It gives the reservation back (planned, or after resolving it late).
    Releasing,
    /// The start failed: the client releases it in the background (or
    /// settles it at 0, if the start did happen).
    StartFailed(String),
    /// What the settle sends (the lease's count, or the caller's amount).
    Settling(Settlement),
    Failed(&'static str, ClientError),
    Ended,
}

type Reports = Arc<Mutex<Vec<(usize, Report)>>>;

/// How a call of the client gateway ends, drawn when it is made.
#[derive(Clone, Debug)]
enum Plan {
    Release,
    /// Settle `embed` with this many units.
    Units(u64),
    /// A `chat` stream: the events the provider sends, how many arrive
    /// before a cut (`None`: all, and the lease finishes), and whether the
    /// provider refused the call with an error status before streaming.
    Stream {
        events: Vec<Value>,
        cut: Option<usize>,
        refused: bool,
    },
}

/// The client gateway's side of the world.
pub(super) struct ClientSide {
    client: Client,
    shared: Shared,
    state: reservoir_server::app::AppState,
    router: axum::Router,
    reports: Reports,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    open: usize,
    cut_off: u32,
    /// When the first answer was lost since a call's last one, by call.
    lost_since: HashMap<usize, u64>,
    /// Copies of requests the network delivers late: (round due, request).
    delayed: Vec<(usize, HttpRequest)>,
}

impl ClientSide {
    pub(super) fn new(clock: &ManualClock, writers: reservoir_server::writer::Writers) -> Self {
        let shared = Shared {
            wire: Arc::default(),
            clock: clock.clone(),
            closed: Arc::default(),
        };
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let state = reservoir_server::app::AppState::new(recorder.handle());
        state.set_ready(writers);
        let router = reservoir_server::api::router(
            state.clone(),
            64 * 1024,
            reservoir_server::auth::Auth::disabled(),
        );
        let client = Client::builder(BASE)
            .transport(Arc::new(shared.clone()))
            .timer(Arc::new(shared.clone()))
            .build();
        ClientSide {
            client,
            shared,
            state,
            router,
            reports: Arc::default(),
            tasks: Vec::new(),
            open: 0,
            cut_off: 0,
            lost_since: HashMap::new(),
            delayed: Vec::new(),
        }
    }
}

impl World {
    /// After the clock moved: the client's sleepers whose time came are
    /// woken (in the order of their deadlines), and the gateway may be cut
    /// off from the ledger, or come back.
    pub(super) fn client_round(&mut self, quiet: bool) {
        let now = self.node.clock.now_ms();
        let Some(side) = self.client.as_mut() else {
            return;
        };
        let mut due: Vec<_> = {
            let mut wire = side.shared.wire();
            let (due, waiting) = std::mem::take(&mut wire.sleepers)
                .into_iter()
                .partition(|(at, _, _)| *at <= now);
            wire.sleepers = waiting;
            due
        };
        due.sort_by_key(|&(at, order, _)| (at, order));
        for (_, _, waker) in due {
            waker.wake();
        }
        let cut_off = side.cut_off;
        if cut_off > 0 && (quiet || cut_off == 1) {
            side.cut_off = 0;
            self.note("  client gateway reconnected".into());
        } else if cut_off > 0 {
            side.cut_off -= 1;
        } else if !quiet && self.rng.chance(25) {
            let rounds = self.rng.range(2, 8) as u32;
            if let Some(side) = self.client.as_mut() {
                side.cut_off = rounds;
            }
            self.note(format!("  client gateway cut off for {rounds} rounds"));
            self.count("client gateway cut off");
        }
    }

    /// One wave's part of the client gateway: what its tasks reported, a new
    /// call now and then, then every request on the wire handed to the
    /// router (refused while cut off), and the late copies due.
    pub(super) async fn client_wave(&mut self, wave: u64) -> Vec<InFlight> {
        if self.client.is_none() {
            return Vec::new();
        }
        self.client_reports();
        let open = self.client.as_ref().map_or(0, |s| s.open);
        if !self.quiet && open < CALLS_PER_GATEWAY && self.rng.chance(400) {
            self.client_call();
        }
        for _ in 0..CLIENT_YIELDS {
            tokio::task::yield_now().await;
        }
        let (round, quiet) = (self.round, self.quiet);
        let Some(side) = self.client.as_mut() else {
            return Vec::new();
        };
        side.state.set_ready(self.node.writers.clone());
        let sent: Vec<Sent> = side.shared.wire().sent.drain(..).collect();
        let cut_off = side.cut_off > 0;
        let mut flying = Vec::new();
        let mut copies = Vec::new();
        for Sent { request, reply } in sent {
            if cut_off {
                let _ = reply.send(Exchange::Lost {
                    why: "connection refused (cut off)".into(),
                    maybe_sent: false,
                });
                continue;
            }
            if !quiet && self.rng.chance(30) {
                copies.push((round + self.rng.range(1, 40) as usize, request.clone()));
            }
            let side = self.client.as_ref().expect("the client side");
            flying.push(InFlight {
                answer: route(&side.router, &request),
                request,
                reply: Some(reply),
            });
        }
        for (_, copy) in &copies {
            self.count("client request delayed in the network");
            if let (Some(c), true) = (copy.call, copy.path == "/v1/reservations") {
                self.calls[c].reserve_duplicated = true;
            }
        }
        let side = self.client.as_mut().expect("the client side");
        side.delayed.extend(copies);
        if wave == 0 {
            let (late, later): (Vec<_>, Vec<_>) = std::mem::take(&mut side.delayed)
                .into_iter()
                .partition(|(due, _)| quiet || *due <= round);
            side.delayed = later;
            for (_, request) in late {
                flying.push(InFlight {
                    answer: route(&side.router, &request),
                    request,
                    reply: None,
                });
            }
        }
        flying
    }

    /// The round's answers to the client's requests: each delivered, or
    /// lost on the way (with the round's fault's odds); then the tasks run
    /// on what they heard.
    pub(super) async fn client_deliver(&mut self, flying: Vec<InFlight>, drop_per_mille: u64) {
        if self.client.is_none() {
            return;
        }
        let now = self.now();
        for InFlight {
            request,
            reply,
            answer,
        } in flying
        {
            let HttpRequest {
                method, path, call, ..
            } = request;
            let answer = answer.await.expect("the router's task does not panic");
            let outcome = match &answer {
                Exchange::Answer { status, .. } if status.is_success() => {
                    status.as_u16().to_string()
                }
                Exchange::Answer { status, body, .. } => {
                    let code = serde_json::from_slice::<Value>(body)
                        .ok()
                        .and_then(|v| v["code"].as_str().map(str::to_string))
                        .unwrap_or_default();
                    if *status == StatusCode::INTERNAL_SERVER_ERROR {
                        self.findings.push(finding(
                            Gate::WriterBroke,
                            format!("{method} {path} answered 500 {code}"),
                        ));
                    }
                    format!("{} {code}", status.as_u16())
                }
                Exchange::Lost { why, .. } => format!("no answer: {why}"),
            };
            let what = match call {
                Some(c) if !path.contains(self.calls[c].id.as_str()) => {
                    format!("{method} {path} ({})", self.calls[c].id)
                }
                _ => format!("{method} {path}"),
            };
            let Some(reply) = reply else {
                self.note(format!("  http late copy {what} -> {outcome}"));
                continue;
            };
            let lost = drop_per_mille > 0 && self.rng.chance(drop_per_mille);
            let unavailable = match &answer {
                Exchange::Answer { status, .. } => *status == StatusCode::SERVICE_UNAVAILABLE,
                Exchange::Lost { .. } => true,
            };
            let side = self.client.as_mut().expect("the client side");
            if let Some(c) = call {
                if lost || unavailable {
                    side.lost_since.entry(c).or_insert(now);
                } else {
                    side.lost_since.remove(&c);
                }
            }
            if lost {
                self.note(format!("  http {what} -> LOST"));
                drop(reply);
            } else {
                self.note(format!("  http {what} -> {outcome}"));
                let _ = reply.send(answer);
            }
        }
        for _ in 0..CLIENT_YIELDS {
            tokio::task::yield_now().await;
        }
        self.client_reports();
    }

    /// A new call of the client gateway, its plan drawn now, run as its own task.
    fn client_call(&mut self) {
        let c = self.push_call(CLIENT_GATEWAY);
        let call = &self.calls[c];
        let (tenant, route, amount, release) = (call.tenant, call.route, call.amount, call.release);
        let request = match amount {
            Amount::Units(units) => {
                ReserveRequest::units(TENANTS[tenant].name, route.name(), units)
            }
            Amount::Sized {
                counted_input_tokens,
                max_tokens,
            } => ReserveRequest::tokens(
                TENANTS[tenant].name,
                route.name(),
                counted_input_tokens,
                max_tokens,
            ),
        };
        let plan = match (release, amount) {
            (true, _) => Plan::Release,
            (false, Amount::Units(units)) => Plan::Units(self.rng.range(0, units * 2)),
            (
                false,
                Amount::Sized {
                    counted_input_tokens,
                    max_tokens,
                },
            ) => {
                let max = max_tokens.unwrap_or(crate::node::DEFAULT_OUTPUT_TOKENS);
                let output = self.rng.range(0, max * 5 / 2);
                let reported = counted_input_tokens + self.rng.range(0, 200);
                let deltas = self.rng.range(1, 4);
                let mut events = vec![json!({"type": "message_start", "message": {
                    "model": "sim-model",
                    "usage": {"input_tokens": reported, "output_tokens": output.min(1)}}})];
                events.extend((1..=deltas).map(|i| {
                    json!({"type": "message_delta", "usage": {"output_tokens": output * i / deltas}})
                }));
                events.push(json!({"type": "message_stop"}));
                let cut = self.rng.chance(200).then(|| self.rng.index(events.len()));
                let refused = cut == Some(0) && self.rng.chance(500);
                Plan::Stream {
                    events,
                    cut,
                    refused,
                }
            }
        };
        let id = reservoir_client::ReservationId::new(self.calls[c].id.as_str())
            .expect("the simulator's ids are valid");
        self.note(format!(
            "  {id} client call: {plan:?}",
            plan = PlanName(&plan)
        ));
        self.count("client calls");
        let side = self.client.as_mut().expect("the client side");
        side.open += 1;
        let (client, reports, closed) = (
            side.client.clone(),
            side.reports.clone(),
            side.shared.closed.clone(),
        );
        let task = tokio::spawn(async move {
            client_call(&client, c, id, request, plan, &reports, &closed).await;
            reports.lock().expect("reports").push((c, Report::Ended));
        });
        side.tasks.push(task);
    }

    /// What the client's tasks reported, into the model, in order.
    fn client_reports(&mut self) {
        let Some(side) = self.client.as_mut() else {
            return;
        };
        let reports = std::mem::take(&mut *side.reports.lock().expect("reports"));
        let now = self.now();
        for (c, report) in reports {
            let id = self.calls[c].id.clone();
            match report {
                Report::Told(receipt) => {
                    let state = serde_json::from_value(json!(receipt.state))
                        .expect("the client's states are the ledger's");
                    let key = PartitionKey {
                        subject: receipt.subject,
                        route: receipt.route,
                        accounting_epoch: receipt.accounting_epoch,
                        policy_generation: receipt.policy_generation,
                    };
                    let call = &mut self.calls[c];
                    if call.told.is_none() && receipt.held_units > 0 {
                        self.admitted[call.tenant] += 1;
                    }
                    self.note(format!("  {id} client told {state:?}"));
                    let call = &mut self.calls[c];
                    call.key = Some(key.clone());
                    call.told = Some(Told {
                        key,
                        state,
                        reserved_units: receipt.reserved_units,
                        actual_units: receipt.actual_units,
                    });
                }
                Report::Started => {
                    if let Some(told) = self.calls[c].told.as_mut() {
                        told.state = ReservationState::Started;
                    }
                    self.note(format!("  {id} client started"));
                }
                Report::Dropped => {
                    self.count("client lease dropped mid-stream (settled in the background)");
                    self.note(format!("  {id} client: stream cut, lease dropped"));
                }
                Report::Unknown(step) => {
                    let since = self
                        .client
                        .as_ref()
                        .and_then(|s| s.lost_since.get(&c).copied())
                        .unwrap_or(now);
                    if self.calls[c].unknown_since.is_none() {
                        self.calls[c].unknown_since = Some(since);
                        self.count("unknown");
                        self.count(match step {
                            "reserve" => "client reserve unknown (resolved by asking again)",
                            _ => "client settle unknown (sent again with the same amount)",
                        });
                    }
                    self.note(format!("  {id} client: {step} outcome unknown"));
                }
                Report::Resolved => {
                    if let Some(since) = self.calls[c].unknown_since.take() {
                        self.unknown_resolved_ms.push(now - since);
                    }
                    self.note(format!("  {id} client: resolved"));
                }
                Report::Refused => {
                    self.calls[c].refused = true;
                    self.count("reserve refused");
                    self.note(format!("  {id} client: refused"));
                }
                Report::Releasing => {
                    self.calls[c].release = true;
                    self.note(format!("  {id} client releases"));
                }
                Report::StartFailed(why) => {
                    // The client gives it back in the background: a
                    // release, or a settle at 0 (no input, no output) if
                    // the start did happen.
                    self.calls[c].release = true;
                    self.calls[c].settle = Some(settle_sent(&Settlement {
                        actual_units: 0,
                        operation_id: None,
                        usage: Some(reservoir_client::Usage {
                            output_tokens: Some(0),
                            reported_input_tokens: Some(0),
                            ..Default::default()
                        }),
                    }));
                    self.count("client start failed");
                    self.note(format!("  {id} client: start failed ({why})"));
                }
                Report::Settling(settlement) => {
                    self.calls[c].settle = Some(settle_sent(&settlement));
                    self.note(format!("  {id} client settles {}", settlement.actual_units));
                }
                Report::Failed(step, error) => {
                    match &error {
                        ClientError::Protocol(_) | ClientError::InvalidInput(_) => {
                            self.findings.push(finding(
                                Gate::UnexpectedAnswer,
                                format!("{id} client {step}: {error}"),
                            ));
                        }
                        ClientError::Rejected { status: 500.., .. } => {
                            self.findings.push(finding(
                                Gate::WriterBroke,
                                format!("{id} client {step}: {error}"),
                            ));
                        }
                        ClientError::Unavailable(_) => {
                            self.count("client step failed: unavailable")
                        }
                        _ => self.count("client step failed: rejected"),
                    }
                    let code = error.code().unwrap_or("unavailable");
                    self.note(format!("  {id} client {step} failed: {code}"));
                }
                Report::Ended => {
                    if let Some(side) = self.client.as_mut() {
                        side.open -= 1;
                    }
                    self.calls[c].phase = Phase::Done;
                }
            }
        }
    }

    /// The end of the run: every wait of the client ends and its tasks stop
    /// (a dropped lease's background settle included).
    pub(super) async fn client_close(&mut self) {
        let failed = self
            .client
            .as_ref()
            .map_or(0, |s| s.client.background_failures());
        *self
            .coverage
            .entry("client background steps given up (deadline)")
            .or_default() += failed;
        let Some(side) = self.client.as_mut() else {
            return;
        };
        side.shared.closed.store(true, Ordering::SeqCst);
        let sleepers = std::mem::take(&mut side.shared.wire().sleepers);
        for (_, _, waker) in sleepers {
            waker.wake();
        }
        side.shared.wire().sent.clear();
        for task in std::mem::take(&mut side.tasks) {
            task.abort();
            let _ = task.await;
        }
        for _ in 0..CLIENT_YIELDS {
            tokio::task::yield_now().await;
        }
    }
}

/// Hands one request to the router, as its own task.
fn route(router: &axum::Router, request: &HttpRequest) -> tokio::task::JoinHandle<Exchange> {
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
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let served_by = header(reservoir_client::owners::SERVED_BY);
        let status = parts.status;
        match axum::body::to_bytes(body, usize::MAX).await {
            Ok(body) => Exchange::Answer {
                status,
                retry_after,
                body: body.to_vec(),
                served_by,
            },
            Err(e) => Exchange::Lost {
                why: format!("answer cut off: {e}"),
                maybe_sent: true,
            },
        }
    })
}

/// One call of the client gateway, as a gateway writes it with the client:
/// reserve (resolving an UNKNOWN by asking again, and then giving the
/// reservation back: its caller stopped waiting), start, stream, settle (a
/// settle whose outcome is unknown repeated with the same amount), or drop
/// the lease mid-stream.
async fn client_call(
    client: &Client,
    c: usize,
    id: reservoir_client::ReservationId,
    request: ReserveRequest,
    plan: Plan,
    reports: &Reports,
    closed: &AtomicBool,
) {
    let say = |report: Report| reports.lock().expect("reports").push((c, report));
    let reservation = match client.reserve_as(id.clone(), request.clone()).await {
        Ok(r) => r,
        Err(ClientError::ReservationUnknown { .. }) => {
            say(Report::Unknown("reserve"));
            let receipt = loop {
                match client.resolve(&id, &request).await {
                    Ok(r) => break r,
                    Err(ClientError::ReservationUnknown { .. } | ClientError::Unavailable(_))
                        if !closed.load(Ordering::SeqCst) => {}
                    Err(ClientError::Refused { .. }) => {
                        say(Report::Resolved);
                        say(Report::Refused);
                        return;
                    }
                    Err(e) => return say(Report::Failed("resolve", e)),
                }
            };
            say(Report::Resolved);
            let reserved = receipt.state == reservoir_client::ReservationState::Reserved;
            say(Report::Told(receipt));
            if reserved {
                say(Report::Releasing);
                match client.release(&id).await {
                    Ok(r) => say(Report::Told(r)),
                    Err(e) => say(Report::Failed("release", e)),
                }
            }
            return;
        }
        Err(ClientError::Refused { .. }) => return say(Report::Refused),
        Err(e) => return say(Report::Failed("reserve", e)),
    };
    if let Some(receipt) = reservation.receipt() {
        say(Report::Told(receipt.clone()));
    }
    let (events, cut, refused, units) = match plan {
        Plan::Release => {
            say(Report::Releasing);
            match reservation.release().await {
                Ok(Some(r)) => say(Report::Told(r)),
                Ok(None) => {}
                Err(e) => say(Report::Failed("release", e)),
            }
            return;
        }
        Plan::Units(units) => (Vec::new(), None, false, Some(units)),
        Plan::Stream {
            events,
            cut,
            refused,
        } => (events, cut, refused, None),
    };
    let mut lease = match reservation.start().await {
        Ok(lease) => lease,
        Err(e) => {
            return say(Report::StartFailed(
                e.code().unwrap_or("unavailable").into(),
            ))
        }
    };
    say(Report::Started);
    for event in &events[..cut.unwrap_or(events.len())] {
        lease.meter().observe_anthropic(event);
    }
    if refused {
        lease.meter().provider_refused();
    }
    let settlement = match units {
        Some(units) => Settlement {
            actual_units: units,
            operation_id: Some(lease.operation_id().clone()),
            usage: None,
        },
        None => lease.settlement(),
    };
    say(Report::Settling(settlement.clone()));
    if cut.is_some() {
        // The caller hung up: the lease settles what it counted, in the background.
        say(Report::Dropped);
        drop(lease);
        return;
    }
    let mut outcome = lease
        .finish_with(settlement.clone())
        .await
        .map(|s| s.receipt);
    let mut unknown = false;
    loop {
        match outcome {
            Ok(receipt) => {
                if unknown {
                    say(Report::Resolved);
                }
                if let Some(r) = receipt {
                    say(Report::Told(r));
                }
                return;
            }
            Err(ClientError::Unavailable(_)) if !closed.load(Ordering::SeqCst) => {
                if !unknown {
                    unknown = true;
                    say(Report::Unknown("settle"));
                }
                outcome = client.settle(&id, &settlement).await.map(Some);
            }
            Err(e) => return say(Report::Failed("settle", e)),
        }
    }
}

/// What a settle sends, as the server's own settle body reads it.
pub(super) fn settle_sent(settlement: &Settlement) -> (Option<u64>, Option<Usage>) {
    let body: reservoir_server::bodies::SettleBody =
        serde_json::from_value(serde_json::to_value(settlement).expect("a settlement serializes"))
            .expect("the server reads the client's settle body");
    (body.actual_units, body.usage.map(Usage::from))
}

/// A plan in the trace: what it will do, not its events.
struct PlanName<'a>(&'a Plan);

impl std::fmt::Debug for PlanName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Plan::Release => write!(f, "release"),
            Plan::Units(units) => write!(f, "settle {units}"),
            Plan::Stream { cut: None, .. } => write!(f, "stream to its end"),
            Plan::Stream {
                cut: Some(n),
                refused,
                ..
            } => write!(f, "stream cut after {n} events (refused: {refused})"),
        }
    }
}
