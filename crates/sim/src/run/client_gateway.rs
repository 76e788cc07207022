//! The client gateway (one by default, `RunConfig::client_gateways`; each
//! its own [`ClientSide`]): one more gateway, whose calls are the client crate's
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
//! The gateway holds emergency shards like the others (the last of
//! `World::gateways`): its `ShardBook` is the client's fallback, so while it
//! is cut off, a reserve that no attempt can have delivered (every
//! connection refused until the step's 3 s deadline) is admitted from a
//! shard by the client itself, and its lease settles into the book. The
//! model holds that such a call is never debited by the ledger too (the
//! plant `fallback-after-send` breaks it). A partition sometimes begins
//! mid-request: the answer is lost and the gateway is cut off from then on.
//!
//! Every draw of the world's generator (which calls, their sizes, what they
//! use, which answers are lost) happens in the world, in order; a call's
//! task only follows its plan. What the task learns is reported back and
//! kept in the reference model (the call's `told`), which the checker holds
//! against the ledger after every round, as for the other gateways.
//!
//! Its calls, once RESERVED, wait for their turn in the client crate's start
//! scheduler (one or two provider calls at once), and now and then a caller
//! stops waiting before its turn came; [`fairness`] holds the scheduler to
//! its fairness budget.
//!
//! - [`wire`]: the transport and timer, and the router's side of the wire.
//! - [`task`]: one call as its own task, and what it reports.
//! - [`reports`]: the reports taken into the model and the shards' tally.
//! - [`fairness`]: the start scheduler against its fairness budget.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use reservoir_client::transport::Exchange;
use reservoir_client::{Client, ReserveRequest, SchedulerConfig, StartScheduler};
use reservoir_server::clock::{Clock, ManualClock};
use serde_json::Value;

use super::*;
use crate::report::StartFigures;

/// The ledger's URL as the client knows it (never resolved: the wire is ours).
const BASE: &str = "http://ledger";
/// Yields for the client's tasks to run to their next request or wait.
const CLIENT_YIELDS: usize = 8;
/// Calls the client gateway keeps open at once: more than its scheduler
/// starts at once, so tenants wait for their turn.
const CLIENT_CALLS: usize = 8;

mod fairness;
mod reports;
mod task;
mod wire;

pub(super) use fairness::FairnessWatch;
use task::{CallTask, Plan, PlanName, Report, Reports};
use wire::{route, HttpRequest, InFlight, Sent, Shared};

/// The ledger node's HTTP side, as the server serves it: its router over
/// the node's current writers. It outlives the client processes that call it.
#[derive(Clone)]
pub(super) struct LedgerHttp {
    state: reservoir_server::app::AppState,
    router: axum::Router,
}

impl LedgerHttp {
    pub(super) fn new(writers: reservoir_server::writer::Writers) -> Self {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let state = reservoir_server::app::AppState::new(recorder.handle());
        state.set_ready(writers);
        let router = reservoir_server::api::router(
            state.clone(),
            64 * 1024,
            reservoir_server::auth::Auth::disabled(),
        );
        LedgerHttp { state, router }
    }
}

/// A client gateway's side of the world.
pub(super) struct ClientSide {
    /// Its number among `World::gateways`: after the simulator's own.
    gateway: usize,
    client: Client,
    /// Which of its RESERVED calls starts next (`fairness`).
    scheduler: StartScheduler,
    shared: Shared,
    ledger: LedgerHttp,
    reports: Reports,
    /// The gateway's shard book (`World::gateways`' last), the client's fallback.
    book: Arc<reservoir_client::ShardBook>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    open: usize,
    /// When the first answer was lost since a call's last one, by call.
    lost_since: HashMap<usize, u64>,
    /// Copies of requests the network delivers late: (round due, request).
    delayed: Vec<(usize, HttpRequest)>,
    /// Calls holding a shard's units right now (admitted locally, not ended).
    local_open: std::collections::BTreeSet<usize>,
    /// Its start scheduler, judged against the fairness budget (kept
    /// across its restarts).
    fairness: FairnessWatch,
}

impl ClientSide {
    /// The client of gateway `gateway`; `concurrency`: provider calls it
    /// runs at once; `swapped`: the planted bug's weights
    /// (`Plant::SchedulerWeightsSwapped`).
    pub(super) fn new(
        clock: &ManualClock,
        ledger: LedgerHttp,
        gateways: &[super::shards::Gateway],
        gateway: usize,
        concurrency: usize,
        swapped: bool,
    ) -> Self {
        let shared = Shared {
            gateway,
            wire: Arc::default(),
            clock: clock.clone(),
            closed: Arc::default(),
        };
        let book = gateways[gateway].book.clone();
        // A gateway that falls back to its shards soon: a step gives up
        // after 3 s of simulated time (a cut-off lasts 2-8 rounds, each
        // 0.05-2 s mostly), the rest of the client's defaults.
        let retry = reservoir_client::RetryPolicy {
            deadline: Duration::from_secs(3),
            ..reservoir_client::RetryPolicy::default()
        };
        let client = Client::builder(BASE)
            .retry(retry)
            .transport(Arc::new(shared.clone()))
            .timer(Arc::new(shared.clone()))
            .fallback(book.clone())
            .build();
        let weights = TENANTS
            .iter()
            .zip(TENANTS.iter().rev())
            .map(|(t, other)| {
                let weight = if swapped { other.weight } else { t.weight };
                (t.name.to_string(), weight as u32)
            })
            .collect();
        let scheduler = StartScheduler::new(SchedulerConfig {
            concurrency,
            weights,
            ..SchedulerConfig::default()
        });
        ClientSide {
            gateway,
            client,
            scheduler,
            shared,
            ledger,
            reports: Arc::default(),
            book,
            tasks: Vec::new(),
            open: 0,
            lost_since: HashMap::new(),
            delayed: Vec::new(),
            local_open: Default::default(),
            fairness: FairnessWatch::default(),
        }
    }

    /// The process ends: every wait ends at once, every deadline has passed,
    /// nothing more is sent, and its tasks stop (their background steps,
    /// spawned as they drop, fail at once).
    async fn close(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        let sleepers = std::mem::take(&mut self.shared.wire().sleepers);
        for (_, _, waker) in sleepers {
            waker.wake();
        }
        self.shared.wire().sent.clear();
        for task in std::mem::take(&mut self.tasks) {
            task.abort();
            let _ = task.await;
        }
        for _ in 0..CLIENT_YIELDS {
            tokio::task::yield_now().await;
        }
    }
}

impl World {
    /// After the clock moved, for each client gateway in turn: its
    /// client's sleepers whose time came are woken (in the order of their
    /// deadlines), and the gateway may be cut off from the ledger, or come
    /// back.
    pub(super) async fn client_round(&mut self, quiet: bool) {
        for i in 0..self.clients.len() {
            self.client_round_of(i, quiet).await;
        }
    }

    async fn client_round_of(&mut self, i: usize, quiet: bool) {
        if !quiet && self.rng.chance(5) {
            self.restart_client_gateway(i).await;
        }
        let now = self.node.clock.now_ms();
        let side = &mut self.clients[i];
        let g = side.gateway;
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
        // Its shards: asked for more often than the other gateways' (its
        // local calls need one of the right tenant and route).
        if !quiet && self.rng.chance(150) {
            self.ask_for_shard(g);
        }
        // A cut-off ends with the other gateways' (`shard_round`).
        if !quiet && self.gateways[g].cut_off == 0 && self.rng.chance(25) {
            let rounds = self.rng.range(2, 8) as u32;
            self.gateways[g].cut_off = rounds;
            self.note(format!(
                "  gw-{g} (client) cut off from the ledger for {rounds} rounds"
            ));
            self.count("client gateway cut off");
        }
    }

    /// Client gateway `i`'s process dies and a new one starts. The old
    /// one's tasks stop where they are and nothing more leaves it: its
    /// transport closes (a dropped lease's or reservation's background step
    /// fails at once, as in a crash), its unsent requests are gone; copies
    /// the network holds still arrive, answered to nobody. Its open calls
    /// are orphaned: nobody resolves or settles them, the ledger's sweeper
    /// ends them (a hold expires, a started call becomes USAGE_UNKNOWN and
    /// its hold stays retired, never unused); a call holding a shard's units
    /// counts them as consumed. The new process has a new boot epoch, an
    /// empty book (`restart_gateway`: the old shards are refused to it and
    /// their reconcile under the new epoch refused by the ledger) and a new
    /// client.
    async fn restart_client_gateway(&mut self, i: usize) {
        self.client_reports();
        let old = &mut self.clients[i];
        let g = old.gateway;
        let failed = old.client.background_failures();
        old.close().await;
        let local_open = std::mem::take(&mut old.local_open);
        *self
            .coverage
            .entry("client background steps given up (deadline)")
            .or_default() += failed;
        for c in local_open {
            if let Some((s, units)) = self.calls[c].local {
                self.shards[s].open -= units;
                self.shards[s].unknown += units;
            }
        }
        let mut orphaned = 0;
        for call in self.calls.iter_mut() {
            if call.gateway == g && call.phase != Phase::Done {
                call.phase = Phase::Done;
                if call.unknown_since.take().is_some() {
                    *self
                        .coverage
                        .entry("client call orphaned while unknown")
                        .or_default() += 1;
                }
                orphaned += 1;
            }
        }
        *self
            .coverage
            .entry("client call orphaned by a restart")
            .or_default() += orphaned;
        self.restart_gateway(g);
        self.count("client gateway restart");
        let concurrency = self.rng.range(1, 2) as usize;
        let swapped = self.plant == Some(Plant::SchedulerWeightsSwapped);
        let ledger = self.clients[i].ledger.clone();
        let new = ClientSide::new(
            &self.node.clock,
            ledger,
            &self.gateways,
            g,
            concurrency,
            swapped,
        );
        let mut old = std::mem::replace(&mut self.clients[i], new);
        let new = &mut self.clients[i];
        new.delayed = std::mem::take(&mut old.delayed);
        new.fairness = std::mem::take(&mut old.fairness);
        new.fairness.restart();
    }

    /// One wave's part of the client gateways, each in turn: what its
    /// tasks reported, a new call now and then, then every request on the
    /// wire handed to the router (refused while cut off), and the late
    /// copies due.
    pub(super) async fn client_wave(&mut self, wave: u64) -> Vec<InFlight> {
        let mut flying = Vec::new();
        for i in 0..self.clients.len() {
            flying.extend(self.client_wave_of(i, wave).await);
        }
        flying
    }

    async fn client_wave_of(&mut self, i: usize, wave: u64) -> Vec<InFlight> {
        self.client_reports();
        if !self.quiet && self.clients[i].open < CLIENT_CALLS && self.rng.chance(400) {
            self.client_call(i);
        }
        for _ in 0..CLIENT_YIELDS {
            tokio::task::yield_now().await;
        }
        self.read_scheduler(i);
        let (round, quiet) = (self.round, self.quiet);
        let side = &mut self.clients[i];
        side.ledger.state.set_ready(self.node.writers.clone());
        let sent: Vec<Sent> = side.shared.wire().sent.drain(..).collect();
        let cut_off = self.gateways[side.gateway].cut_off > 0;
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
            flying.push(InFlight {
                side: i,
                answer: route(&self.clients[i].ledger.router, &request),
                request,
                reply: Some(reply),
            });
        }
        for (_, copy) in &copies {
            self.count("client request delayed in the network");
            if let (Some(c), true) = (copy.call, copy.is_reserve()) {
                self.calls[c].reserve_duplicated = true;
            }
        }
        let side = &mut self.clients[i];
        side.delayed.extend(copies);
        if wave == 0 {
            let (late, later): (Vec<_>, Vec<_>) = std::mem::take(&mut side.delayed)
                .into_iter()
                .partition(|(due, _)| quiet || *due <= round);
            side.delayed = later;
            for (_, request) in late {
                flying.push(InFlight {
                    side: i,
                    answer: route(&side.ledger.router, &request),
                    request,
                    reply: None,
                });
            }
        }
        flying
    }

    /// The round's answers to the clients' requests: each delivered, or
    /// lost on the way (with the round's fault's odds); then the tasks run
    /// on what they heard.
    pub(super) async fn client_deliver(&mut self, flying: Vec<InFlight>, drop_per_mille: u64) {
        if self.clients.is_empty() {
            return;
        }
        let now = self.now();
        for InFlight {
            side: i,
            request,
            reply,
            answer,
        } in flying
        {
            let reserve = request.is_reserve();
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
            let side = &mut self.clients[i];
            let g = side.gateway;
            if let Some(c) = call {
                if lost || unavailable {
                    side.lost_since.entry(c).or_insert(now);
                } else {
                    side.lost_since.remove(&c);
                }
            }
            if lost {
                self.note(format!("  http {what} -> LOST"));
                if self.plant == Some(Plant::FallbackAfterSend) && reserve {
                    let _ = reply.send(Exchange::Lost {
                        why: "connection reset (planted: said never sent)".into(),
                        maybe_sent: false,
                    });
                } else {
                    drop(reply);
                }
                // Now and then the answer was lost because a partition
                // began: the gateway is cut off from now on.
                if self.gateways[g].cut_off == 0 && self.rng.chance(200) {
                    let rounds = self.rng.range(2, 8) as u32;
                    self.gateways[g].cut_off = rounds;
                    self.note(format!(
                        "  gw-{g} (client) cut off mid-request for {rounds} rounds"
                    ));
                    self.count("client gateway cut off mid-request");
                }
            } else {
                self.note(format!("  http {what} -> {outcome}"));
                let _ = reply.send(answer);
            }
        }
        for _ in 0..CLIENT_YIELDS {
            tokio::task::yield_now().await;
        }
        self.client_reports();
        for i in 0..self.clients.len() {
            self.read_scheduler(i);
        }
    }

    /// A new call of client gateway `i`, its plan drawn now, run as its own task.
    fn client_call(&mut self, i: usize) {
        let c = self.push_call(self.clients[i].gateway);
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
                let (output, reported) = self.draw_use(counted_input_tokens, max_tokens);
                let deltas = self.rng.range(1, 4);
                let events = super::stream::anthropic_events(reported, output, deltas);
                let cut = self.rng.chance(200).then(|| self.rng.index(events.len()));
                let refused = cut == Some(0) && self.rng.chance(500);
                Plan::Stream {
                    events,
                    cut,
                    refused,
                }
            }
        };
        // Now and then its caller stops waiting for its turn to start.
        let patience = (!release && self.rng.chance(100))
            .then(|| Duration::from_millis(self.rng.range(200, 6_000)));
        let id = reservoir_client::ReservationId::new(self.calls[c].id.as_str())
            .expect("the simulator's ids are valid");
        self.note(format!(
            "  {id} client call: {plan:?}{}",
            patience.map_or(String::new(), |p| format!(
                ", waits {} ms for its turn",
                p.as_millis()
            )),
            plan = PlanName(&plan)
        ));
        self.count("client calls");
        if self.clients[i].gateway > GATEWAYS {
            self.count("client calls of a second client gateway or later");
        }
        let side = &mut self.clients[i];
        side.open += 1;
        let (client, scheduler, timer, book, reports, closed) = (
            side.client.clone(),
            side.scheduler.clone(),
            side.shared.clone(),
            side.book.clone(),
            side.reports.clone(),
            side.shared.closed.clone(),
        );
        let task = tokio::spawn(async move {
            let task = CallTask {
                client: &client,
                scheduler: &scheduler,
                timer: &timer,
                book: &book,
                reports: &reports,
                closed: &closed,
                c,
            };
            task.run(id, request, plan, patience).await;
            reports.lock().expect("reports").push((c, Report::Ended));
        });
        side.tasks.push(task);
    }

    /// The end of the run: every wait of the clients ends and their tasks
    /// stop (a dropped lease's background settle included).
    pub(super) async fn client_close(&mut self) {
        for i in 0..self.clients.len() {
            let failed = self.clients[i].client.background_failures();
            *self
                .coverage
                .entry("client background steps given up (deadline)")
                .or_default() += failed;
            self.clients[i].close().await;
        }
    }

    /// The client side of call `c`'s gateway (none for the simulator's own).
    fn client_of(&mut self, c: usize) -> Option<&mut ClientSide> {
        let g = self.calls[c].gateway;
        let side = self.clients.get_mut(g.checked_sub(GATEWAYS)?)?;
        assert_eq!(side.gateway, g, "client sides are kept in gateway order");
        Some(side)
    }

    /// The start figures of every client gateway's scheduler, together.
    pub(super) fn start_figures(&self) -> StartFigures {
        let mut figures = StartFigures::default();
        for side in &self.clients {
            figures.merge(&side.fairness.figures);
        }
        figures
    }
}
