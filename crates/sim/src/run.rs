//! One interleaving: a seed, a world (gateways, an operator, a sweeper, one
//! ledger node over the log), and a number of steps, each checked.
//!
//! A step is a *round*: the clock moves (sometimes far: leases and execution
//! limits pass, an hourly epoch ends), the sweeper may collect what is due,
//! at most one ledger fault is armed, and then one to three *waves* of
//! requests are sent concurrently, each wave handed to the writers before
//! the next (so, with appends held in flight, several batches are in flight
//! at once on a pipelining log). Then the replies are delivered to their
//! callers (or lost on the way), the node is rebuilt if the log left it in
//! doubt, failed, or the round crashed it, and the checker runs.
//!
//! Everything that decides what happens is drawn from one seeded generator
//! in a fixed order, and every task runs on one `current_thread` runtime, so
//! a seed replays exactly; the trace hash says so.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use reservoir_core::{
    Command, DimensionAmounts, MoveId, OperationId, PartitionKey, Policy, Rejection, RequestDigest,
    Reservation, ReservationId, ReservationState, Units, Usage,
};
use reservoir_server::writer::{Amount, Answer, Failure, Reply, Request, RetiredIndex};
use sha2::{Digest, Sha256};

use crate::check::{self, finding, Finding, Gate, Mirror, Partitions};
use crate::node::{Node, SimLog, Trouble};
use crate::rng::Rng;
use crate::workload::{self, Route, ROUTES, TENANTS};

/// A bug the simulator plants on purpose, to show that the checker fails.
/// Both live in the simulator, at the boundaries it owns (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    /// A release in a closed generation is credited a second time into the
    /// active one (a `MoveIn` that never left): a refund applied twice.
    DoubleRefund,
    /// The moves of a generation switch reach the log without their debt (a
    /// codec that drops a field): debt not carried on a generation switch.
    DebtNotCarried,
}

impl Plant {
    pub const ALL: [Plant; 2] = [Plant::DoubleRefund, Plant::DebtNotCarried];

    pub fn name(self) -> &'static str {
        match self {
            Plant::DoubleRefund => "double-refund",
            Plant::DebtNotCarried => "debt-not-carried",
        }
    }

    pub fn from_name(name: &str) -> Option<Plant> {
        Plant::ALL.into_iter().find(|p| p.name() == name)
    }
}

#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Rounds with faults, before the quiet drain.
    pub steps: usize,
    pub plant: Option<Plant>,
    /// Keep the whole trace in the outcome (else its last lines only).
    pub keep_trace: bool,
    /// Take-overs that leave the old process running (a zombie). Off by
    /// default: a zombie answers rejections from its stale memory before
    /// any append fences it, which the checker reports (see the crate docs).
    pub zombies: bool,
}

impl RunConfig {
    pub fn new(steps: usize) -> RunConfig {
        RunConfig {
            steps,
            plant: None,
            keep_trace: false,
            zombies: false,
        }
    }
}

/// Lines of the trace a failing run prints.
pub const TRACE_TAIL: usize = 40;
/// Gateways, and calls each keeps open at once.
const GATEWAYS: usize = 3;
const CALLS_PER_GATEWAY: usize = 4;
/// Rounds of the quiet drain at most: no faults, only retries of UNKNOWN calls.
const DRAIN_ROUNDS: usize = 40;
/// Recovery from the whole log is compared with the live state every this many rounds.
const RECOVERY_EVERY: usize = 16;
/// Yields between two waves: enough for every queued request to be decided
/// and its batch handed to the log.
const YIELDS_PER_WAVE: usize = 16;

/// What one run found and measured.
#[derive(Clone, Debug, Default)]
pub struct RunOutcome {
    pub seed: u64,
    pub steps: usize,
    pub rounds: usize,
    pub simulated_ms: u64,
    pub trace_hash: String,
    pub trace: Vec<String>,
    /// Empty: every gate passed. Else the findings of the first check that failed.
    pub findings: Vec<Finding>,
    /// Simulated ms from a call becoming UNKNOWN to its caller learning the outcome.
    pub unknown_resolved_ms: Vec<u64>,
    /// Reservations admitted (holding capacity) per tenant, as the gateways learnt them.
    pub admitted: [u64; TENANTS.len()],
    /// Calls per tenant (each asks for one reservation): the demand.
    pub demand: [u64; TENANTS.len()],
    /// How often each path was taken (faults, restarts, event types in the log).
    pub coverage: BTreeMap<&'static str, u64>,
}

impl RunOutcome {
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Runs one interleaving on a fresh single-threaded runtime.
pub fn run(seed: u64, config: &RunConfig) -> RunOutcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(run_async(seed, config))
}

async fn run_async(seed: u64, config: &RunConfig) -> RunOutcome {
    let mut world = match World::new(seed, config).await {
        Ok(w) => w,
        Err(err) => {
            return RunOutcome {
                seed,
                findings: vec![finding(Gate::RecoveryFailed, err)],
                ..RunOutcome::default()
            }
        }
    };
    world.setup().await;
    let mut round = 0;
    while round < config.steps && world.findings.is_empty() {
        world.round(round, false).await;
        world
            .check(round, round % RECOVERY_EVERY == RECOVERY_EVERY - 1)
            .await;
        round += 1;
    }
    // The quiet drain: every UNKNOWN must resolve once the faults stop.
    let mut drained = 0;
    while world.findings.is_empty() && drained < DRAIN_ROUNDS && world.unresolved() > 0 {
        world.round(round, true).await;
        world.check(round, false).await;
        round += 1;
        drained += 1;
    }
    if world.findings.is_empty() {
        world.check(round, true).await;
        let left = world.unresolved();
        if left > 0 {
            world.findings.push(finding(
                Gate::UnknownUnresolved,
                format!("{left} calls still UNKNOWN after {DRAIN_ROUNDS} quiet rounds"),
            ));
        }
    }
    world.finish(round)
}

/// The phase a call is in: the request its gateway sends next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Reserve,
    Start,
    Settle,
    Release,
    Done,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Reserve => "reserve",
            Phase::Start => "start",
            Phase::Settle => "settle",
            Phase::Release => "release",
            Phase::Done => "done",
        }
    }
}

/// What a gateway was last told about a reservation: the reference model.
#[derive(Clone, Debug)]
struct Told {
    key: PartitionKey,
    state: ReservationState,
    reserved_units: Units,
    actual_units: Option<Units>,
}

/// One LLM call through a gateway, from reserve to its end.
struct Call {
    id: ReservationId,
    gateway: usize,
    tenant: usize,
    route: Route,
    digest: RequestDigest,
    amount: Amount,
    operation: OperationId,
    /// Plan: give the reservation back instead of starting the call.
    release: bool,
    phase: Phase,
    key: Option<PartitionKey>,
    /// Fixed at the first settle attempt: a retry sends the same usage.
    settle: Option<(Option<u64>, Option<Usage>)>,
    /// Simulated time the current step became UNKNOWN (its answer lost).
    unknown_since: Option<u64>,
    /// Requests of this call in flight (two: an impatient duplicate).
    in_flight: u32,
    /// Two copies of its reserve were in flight at once: a refusal of one
    /// does not say the other was not admitted (a refusal makes no record).
    reserve_duplicated: bool,
    told: Option<Told>,
    refused: bool,
    /// The ledger was seen holding the finished record the gateway was told
    /// of: a finished record never changes, so it is checked again only
    /// after the node was rebuilt from the log.
    verified: bool,
}

/// An operator change of a subject/route, retried as it was until answered.
#[derive(Clone, Copy, Debug)]
enum Change {
    Publish { generation: u64 },
    Rollback { generation: u64 },
}

/// The operator's view of one tenant's route.
struct Line {
    tenant: usize,
    route: Route,
    /// The active generation, as last acknowledged.
    generation: u64,
    /// The highest generation ever asked for.
    asked: u64,
    pending: Option<Change>,
}

/// Who sent a request, so its reply goes back to them.
enum Origin {
    /// A call's request, sent in the phase named.
    Call(usize, Phase),
    Operator(usize),
    Sweeper(String),
    Planted(String),
    /// A copy of a call's request the network delivered late.
    Late(usize, Phase),
}

struct World {
    seed: u64,
    rng: Rng,
    node: Node,
    mirror: Mirror,
    calls: Vec<Call>,
    open_calls: [usize; GATEWAYS],
    lines: Vec<Line>,
    plant: Option<Plant>,
    /// The old process's writers after a take-over, while they run.
    zombie: Option<crate::node::Zombie>,
    zombies: bool,
    /// Copies of call requests the network holds: (round due, call, phase).
    delayed: Vec<(usize, usize, Phase)>,
    round: usize,
    quiet: bool,
    /// Requests the planted double refund sends in the next wave.
    planted: VecDeque<(usize, Request, String)>,
    trace_hash: Sha256,
    trace: VecDeque<String>,
    keep_trace: bool,
    findings: Vec<Finding>,
    unknown_resolved_ms: Vec<u64>,
    admitted: [u64; TENANTS.len()],
    demand: [u64; TENANTS.len()],
    coverage: BTreeMap<&'static str, u64>,
    start_ms: u64,
    steps: usize,
    _dir: tempfile::TempDir,
}

impl World {
    async fn new(seed: u64, config: &RunConfig) -> Result<World, String> {
        let mut rng = Rng::new(seed);
        let ordered = rng.chance(500);
        let shards = rng.range(1, 3) as usize;
        let max_batch = *[2usize, 8, 64].get(rng.index(3)).expect("an index below 3");
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let retired = Arc::new(RetiredIndex::open(&dir.path().join("retired"))?);
        let log = Arc::new(SimLog::new(
            ordered,
            config.plant == Some(Plant::DebtNotCarried),
        ));
        let clock = reservoir_server::clock::ManualClock::new(workload::START_MS);
        let node = Node::boot(log, clock, retired, shards, max_batch).await?;
        let lines = TENANTS
            .iter()
            .enumerate()
            .flat_map(|(tenant, _)| {
                ROUTES.iter().map(move |&route| Line {
                    tenant,
                    route,
                    generation: 1,
                    asked: 1,
                    pending: None,
                })
            })
            .collect();
        let mut world = World {
            seed,
            rng,
            node,
            mirror: Mirror::default(),
            calls: Vec::new(),
            open_calls: [0; GATEWAYS],
            lines,
            plant: config.plant,
            planted: VecDeque::new(),
            zombie: None,
            zombies: config.zombies,
            delayed: Vec::new(),
            round: 0,
            quiet: false,
            trace_hash: Sha256::new(),
            trace: VecDeque::new(),
            keep_trace: config.keep_trace,
            findings: Vec::new(),
            unknown_resolved_ms: Vec::new(),
            admitted: [0; TENANTS.len()],
            demand: [0; TENANTS.len()],
            coverage: BTreeMap::new(),
            start_ms: workload::START_MS,
            steps: config.steps,
            _dir: dir,
        };
        world.note(format!(
            "seed {seed}: log {}, {shards} shards, batches of at most {max_batch}",
            if ordered {
                "ordered (pipelined)"
            } else {
                "unordered"
            }
        ));
        Ok(world)
    }

    fn now(&self) -> u64 {
        use reservoir_server::clock::Clock;
        self.node.clock.now_ms()
    }

    fn note(&mut self, line: String) {
        self.trace_hash.update(line.as_bytes());
        self.trace_hash.update(b"\n");
        self.trace.push_back(line);
        if !self.keep_trace && self.trace.len() > TRACE_TAIL {
            self.trace.pop_front();
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.coverage.entry(what).or_default() += 1;
    }

    /// Publishes every tenant's routes at generation 1, before any fault.
    async fn setup(&mut self) {
        for i in 0..self.lines.len() {
            let (tenant, route) = (self.lines[i].tenant, self.lines[i].route);
            let policy = workload::policy(TENANTS[tenant], route, 1, 0);
            let shard = self.node.writers.shard_of(&policy.subject, &policy.route);
            let reply = self
                .node
                .writers
                .call(
                    shard,
                    Request::Publish {
                        accounting_epoch: route.named_epoch(),
                        policy,
                    },
                )
                .await;
            if !matches!(reply, Ok(Answer::Published { .. })) {
                self.findings.push(finding(
                    Gate::UnexpectedAnswer,
                    format!(
                        "setup publish {}/{}: {reply:?}",
                        TENANTS[tenant].name,
                        route.name()
                    ),
                ));
            }
        }
        self.check(0, false).await;
    }

    fn unresolved(&self) -> usize {
        self.calls
            .iter()
            .filter(|c| c.unknown_since.is_some())
            .count()
            + self.lines.iter().filter(|l| l.pending.is_some()).count()
    }

    async fn round(&mut self, round: usize, quiet: bool) {
        (self.round, self.quiet) = (round, quiet);
        let dt = match (quiet, self.rng.below(100)) {
            (true, _) => self.rng.range(500, 3_000),
            (false, 0..=3) => self.rng.range(16_000, 45_000), // leases pass
            (false, 4..=5) => self.rng.range(41_000, 400_000), // execution limits, epochs
            _ => self.rng.range(50, 2_000),
        };
        self.node.clock.advance(dt);
        let due = match quiet || self.rng.chance(400) {
            true => {
                let refill = quiet || self.rng.chance(500);
                self.collect_due(refill).await
            }
            false => Vec::new(),
        };
        let fault = if quiet { 0 } else { self.rng.below(100) };
        let mut drop_per_mille = 0;
        let (mut hold, mut crash, mut take_over) = (false, false, false);
        let fault_name = match fault {
            0..=54 => "none".to_string(),
            55..=62 => {
                let n = self.rng.range(1, 3) as usize;
                self.node.log.inner.fail_next_appends(n);
                format!("fail next {n} appends")
            }
            63..=68 => {
                self.node.log.inner.fail_next_append_in_doubt();
                "next append in doubt".to_string()
            }
            69..=70 => {
                self.node.log.inner.fail_next_append_fatally();
                "next append fails fatally".to_string()
            }
            71..=80 => {
                hold = true;
                "appends held in flight".to_string()
            }
            81..=85 => {
                (hold, crash) = (true, true);
                "crash mid-batch".to_string()
            }
            86..=88 if self.zombies && self.zombie.is_none() => {
                take_over = true;
                "another process takes the log over; the old one runs on".to_string()
            }
            _ => {
                drop_per_mille = 300;
                "30% of replies lost".to_string()
            }
        };
        self.note(format!(
            "r{round} +{dt}ms t={} fault: {fault_name}",
            self.now() - self.start_ms
        ));
        if take_over {
            let rounds = self.rng.range(1, 3) as u32;
            match self.node.take_over(rounds).await {
                Ok(zombie) => {
                    self.count("take-over with a zombie");
                    self.zombie = Some(zombie);
                }
                Err(err) => self.findings.push(finding(Gate::RecoveryFailed, err)),
            }
        }
        if hold {
            self.node.log.hold(true);
        }
        let mut sent: Vec<(Origin, tokio::task::JoinHandle<Reply>)> = Vec::new();
        let waves = if quiet { 1 } else { self.rng.range(1, 3) };
        for wave in 0..waves {
            let mut requests = Vec::new();
            if wave == 0 {
                for (shard, key, command) in &due {
                    requests.push((
                        Origin::Sweeper(format!("{} {key}", command_name(command))),
                        *shard,
                        Request::Act {
                            key: key.clone(),
                            command: command.clone(),
                        },
                    ));
                }
                if let Some(operator) = self.operator_request(quiet) {
                    requests.push(operator);
                }
            }
            if wave == 0 {
                // In the quiet drain the network delivers everything it held.
                let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.delayed)
                    .into_iter()
                    .partition(|&(at, _, _)| quiet || at <= round);
                self.delayed = later;
                for (_, c, phase) in due {
                    let call = &self.calls[c];
                    let shard = self
                        .node
                        .writers
                        .shard_of(TENANTS[call.tenant].name, call.route.name());
                    requests.push((Origin::Late(c, phase), shard, self.request_for(c, phase)));
                }
            }
            while let Some((shard, request, what)) = self.planted.pop_front() {
                requests.push((Origin::Planted(what), shard, request));
            }
            let n = if quiet {
                GATEWAYS * CALLS_PER_GATEWAY
            } else {
                self.rng.range(1, 5) as usize
            };
            for _ in 0..n {
                if let Some(r) = self.gateway_request(quiet) {
                    requests.push(r);
                }
            }
            for (origin, shard, request) in requests {
                let mut writers = self.node.writers.clone();
                if let (Some(zombie), Origin::Call(..) | Origin::Late(..)) = (&self.zombie, &origin)
                {
                    // A gateway that still routes to the old process.
                    if self.rng.chance(300) {
                        writers = zombie.writers.clone();
                        let (Origin::Call(c, phase) | Origin::Late(c, phase)) = &origin else {
                            unreachable!("matched above");
                        };
                        let line = format!(
                            "  {} {} sent to the zombie",
                            self.calls[*c].id,
                            phase.name()
                        );
                        self.note(line);
                        self.count("request to the zombie");
                    }
                }
                sent.push((
                    origin,
                    tokio::spawn(async move { writers.call(shard, request).await }),
                ));
            }
            for _ in 0..YIELDS_PER_WAVE {
                tokio::task::yield_now().await;
            }
        }
        let mut panics = Vec::new();
        if crash {
            self.count("crash mid-batch");
            panics = self.node.crash().await;
        }
        self.node.log.hold(false);
        if self.node.log.take_held_appends() >= 2 {
            self.count("rounds with 2+ appends in flight");
        }
        for (origin, handle) in sent {
            let reply = handle.await.expect("a request task does not panic");
            let lost = drop_per_mille > 0 && self.rng.chance(drop_per_mille);
            self.deliver(origin, reply, lost);
        }
        self.node.log.inner.fail_next_appends(0);
        if let Some(zombie) = self.zombie.as_mut() {
            let stopped = zombie.stopped();
            zombie.rounds_left = zombie.rounds_left.saturating_sub(1);
            if stopped.is_some() || zombie.rounds_left == 0 {
                let zombie = self.zombie.take().expect("checked");
                match &stopped {
                    Some(reason) if reason.contains("fenced") || reason.contains("injected") => {
                        self.count("zombie fenced");
                        self.note(format!("  the zombie stopped: {reason}"));
                    }
                    Some(reason) => self.findings.push(finding(
                        Gate::WriterBroke,
                        format!("the zombie stopped: {reason}"),
                    )),
                    None => self.note("  the zombie is killed".into()),
                }
                panics.extend(zombie.kill().await);
            }
        }
        for panic in panics {
            self.findings.push(finding(
                Gate::WriterBroke,
                format!("writer panicked: {panic}"),
            ));
        }
        self.heal(crash).await;
    }

    /// Rebuilds the node after a crash, a fatal log error or a log in doubt.
    async fn heal(&mut self, crashed: bool) {
        let result = if crashed {
            self.note("  node restarts after the crash".into());
            self.count("restart");
            self.node.restart().await.map(|()| Vec::new())
        } else {
            match self.node.trouble() {
                None => return,
                Some(Trouble::InDoubt(reason)) => {
                    self.note(format!("  log in doubt ({reason}): re-claim and rebuild"));
                    self.count("re-claim");
                    self.node.reclaim().await
                }
                Some(Trouble::Fatal(reason)) => {
                    if !reason.contains("injected") {
                        self.findings.push(finding(
                            Gate::WriterBroke,
                            format!("writer stopped: {reason}"),
                        ));
                    }
                    self.note(format!("  fatal ({reason}): node restarts"));
                    self.count("restart");
                    let panics = self.node.crash().await;
                    self.node.restart().await.map(|()| panics)
                }
            }
        };
        // Everything acknowledged is checked again against the rebuilt state.
        for call in &mut self.calls {
            call.verified = false;
        }
        match result {
            Ok(panics) => {
                for panic in panics {
                    self.findings.push(finding(
                        Gate::WriterBroke,
                        format!("writer panicked: {panic}"),
                    ));
                }
            }
            Err(err) => self.findings.push(finding(Gate::RecoveryFailed, err)),
        }
    }

    /// The sweeper's collection, in a fixed order: the shard answers its
    /// refills in hash-map order, so they are sorted by partition here
    /// (expiries keep the shard's order, by due time).
    async fn collect_due(&mut self, refill: bool) -> Vec<(usize, PartitionKey, Command)> {
        let now_ms = self.now();
        let mut all = Vec::new();
        for shard in 0..self.node.writers.shards() {
            let due = match self
                .node
                .writers
                .call(shard, Request::CollectDue { now_ms, refill })
                .await
            {
                Ok(Answer::Due(due)) => due,
                _ => continue,
            };
            let (mut refills, others): (Vec<_>, Vec<_>) = due
                .into_iter()
                .partition(|(_, c)| matches!(c, Command::Refill));
            refills.sort_by(|a, b| a.0.cmp(&b.0));
            all.extend(
                others
                    .into_iter()
                    .chain(refills)
                    .map(|(key, command)| (shard, key, command)),
            );
        }
        all
    }

    fn operator_request(&mut self, quiet: bool) -> Option<(Origin, usize, Request)> {
        let pending = self.lines.iter().position(|l| l.pending.is_some());
        let i = match pending {
            Some(i) => i,
            None if !quiet && self.rng.chance(40) => {
                let i = self.rng.index(self.lines.len());
                let generation = self.lines[i].asked + 1;
                self.lines[i].asked = generation;
                let change = match self.lines[i].route == Route::Chat && self.rng.chance(300) {
                    true => Change::Rollback { generation },
                    false => Change::Publish { generation },
                };
                self.lines[i].pending = Some(change);
                i
            }
            None => return None,
        };
        let line = &self.lines[i];
        let tenant = TENANTS[line.tenant];
        let route = line.route;
        let request = match line.pending.expect("pending") {
            Change::Publish { generation } => Request::Publish {
                accounting_epoch: route.named_epoch(),
                policy: workload::policy(tenant, route, generation, generation % 3),
            },
            Change::Rollback { generation } => Request::Rollback {
                subject: tenant.name.to_string(),
                route: route.name().to_string(),
                generation: Some(generation),
            },
        };
        let shard = self.node.writers.shard_of(tenant.name, route.name());
        Some((Origin::Operator(i), shard, request))
    }

    /// The next request of some gateway: a retry of an UNKNOWN step first,
    /// else the next step of an open call, else a new call; now and then an
    /// impatient duplicate of a request still in flight (a client that timed
    /// out and sent it again).
    fn gateway_request(&mut self, quiet: bool) -> Option<(Origin, usize, Request)> {
        let g = self.rng.index(GATEWAYS);
        let of_gateway = |flying: bool| -> Vec<usize> {
            (0..self.calls.len())
                .filter(|&c| {
                    let call = &self.calls[c];
                    call.gateway == g && call.phase != Phase::Done && (call.in_flight > 0) == flying
                })
                .collect()
        };
        let open = of_gateway(false);
        let flying = of_gateway(true);
        if !quiet && !flying.is_empty() && self.rng.chance(60) {
            let c = flying[self.rng.index(flying.len())];
            self.count("duplicate request");
            return Some(self.send(c));
        }
        let unknown = open
            .iter()
            .copied()
            .find(|&c| self.calls[c].unknown_since.is_some());
        let c = match unknown {
            Some(c) if quiet || self.rng.chance(800) => c,
            _ if quiet => return None,
            _ if self.open_calls[g] < CALLS_PER_GATEWAY
                && (open.is_empty() || self.rng.chance(400)) =>
            {
                self.new_call(g)
            }
            _ if open.is_empty() => return None,
            _ => open[self.rng.index(open.len())],
        };
        Some(self.send(c))
    }

    /// Call `c`'s request for its phase (the same one again on a retry).
    fn send(&mut self, c: usize) -> (Origin, usize, Request) {
        let request = self.request_of(c);
        let call = &mut self.calls[c];
        call.in_flight += 1;
        if call.in_flight > 1 && call.phase == Phase::Reserve {
            call.reserve_duplicated = true;
        }
        let phase = call.phase;
        if !self.quiet && self.rng.chance(30) {
            // The network keeps a copy and delivers it much later.
            let due = self.round + self.rng.range(1, 40) as usize;
            self.delayed.push((due, c, phase));
            let call = &mut self.calls[c];
            if phase == Phase::Reserve {
                call.reserve_duplicated = true;
            }
            self.count("request delayed in the network");
        }
        let call = &self.calls[c];
        let (subject, route) = (TENANTS[call.tenant].name, call.route.name());
        let shard = self.node.writers.shard_of(subject, route);
        (Origin::Call(c, phase), shard, request)
    }

    fn new_call(&mut self, g: usize) -> usize {
        let c = self.calls.len();
        let tenant = self.rng.index(TENANTS.len());
        let route = ROUTES[self.rng.index(ROUTES.len())];
        let (amount, inputs) = match route {
            Route::Chat => {
                let input = self.rng.range(100, 3_000);
                let max_tokens = self.rng.range(100, 1_500);
                (
                    Amount::Sized {
                        counted_input_tokens: input,
                        max_tokens: Some(max_tokens),
                    },
                    format!("chat {input} {max_tokens}"),
                )
            }
            Route::Embed => {
                let units = self.rng.range(200, 2_000);
                (Amount::Units(units), format!("embed {units}"))
            }
        };
        let id = ReservationId::new(format!("g{g}-c{c}")).expect("a plain reservation id");
        let digest = RequestDigest(Sha256::digest(inputs.as_bytes()).into());
        let operation = OperationId::new(format!("op-{c}")).expect("a plain operation id");
        let release = self.rng.chance(200);
        self.calls.push(Call {
            id,
            gateway: g,
            tenant,
            route,
            digest,
            amount,
            operation,
            release,
            phase: Phase::Reserve,
            key: None,
            settle: None,
            unknown_since: None,
            in_flight: 0,
            reserve_duplicated: false,
            told: None,
            refused: false,
            verified: false,
        });
        self.open_calls[g] += 1;
        self.demand[tenant] += 1;
        self.count("calls");
        c
    }

    fn request_of(&mut self, c: usize) -> Request {
        let phase = self.calls[c].phase;
        if phase == Phase::Settle && self.calls[c].settle.is_none() {
            let settle = self.usage_for(c);
            self.calls[c].settle = Some(settle);
        }
        self.request_for(c, phase)
    }

    /// Call `c`'s request in `phase`: always the same one (a settle's usage
    /// is fixed at its first attempt).
    fn request_for(&self, c: usize, phase: Phase) -> Request {
        let call = &self.calls[c];
        let key = || {
            call.key
                .clone()
                .expect("a call past its reserve knows its partition")
        };
        match phase {
            Phase::Reserve => Request::Reserve {
                subject: TENANTS[call.tenant].name.to_string(),
                route: call.route.name().to_string(),
                id: call.id.clone(),
                digest: call.digest,
                amount: call.amount,
            },
            Phase::Start => Request::Act {
                key: key(),
                command: Command::Start {
                    id: call.id.clone(),
                    operation_id: call.operation.clone(),
                },
            },
            Phase::Release => Request::Act {
                key: key(),
                command: Command::Release {
                    id: call.id.clone(),
                },
            },
            Phase::Settle => {
                let (actual_units, usage) = call
                    .settle
                    .clone()
                    .expect("a settle's usage is fixed before it is sent");
                Request::Settle {
                    key: key(),
                    id: call.id.clone(),
                    operation_id: Some(call.operation.clone()),
                    actual_units,
                    usage,
                }
            }
            Phase::Done => unreachable!("a finished call sends nothing"),
        }
    }

    /// What the call really used: below or above what it reserved.
    fn usage_for(&mut self, c: usize) -> (Option<u64>, Option<Usage>) {
        let (route, amount) = (self.calls[c].route, self.calls[c].amount);
        match (route, amount) {
            (
                Route::Chat,
                Amount::Sized {
                    counted_input_tokens,
                    max_tokens,
                },
            ) => {
                let max = max_tokens.unwrap_or(crate::node::DEFAULT_OUTPUT_TOKENS);
                let output = self.rng.range(0, max * 5 / 2);
                let reported = counted_input_tokens + self.rng.range(0, 200);
                (
                    None,
                    Some(Usage {
                        model: None,
                        output_tokens: Some(output),
                        counted_input_tokens: Some(counted_input_tokens),
                        reported_input_tokens: Some(reported),
                        cache_read_input_tokens: None,
                    }),
                )
            }
            (_, Amount::Units(units)) => (Some(self.rng.range(0, units * 2)), None),
            (route, amount) => unreachable!("{route:?} calls are not sized as {amount:?}"),
        }
    }

    fn deliver(&mut self, origin: Origin, reply: Reply, lost: bool) {
        match origin {
            Origin::Call(c, phase) => self.deliver_to_call(c, phase, reply, lost),
            Origin::Operator(i) => self.deliver_to_operator(i, reply, lost),
            Origin::Sweeper(what) => {
                let outcome = outcome_of(&reply);
                if let Err(Failure::Internal(msg)) = &reply {
                    self.findings
                        .push(finding(Gate::WriterBroke, format!("sweep {what}: {msg}")));
                }
                self.note(format!("  sweep {what} -> {outcome}"));
            }
            Origin::Planted(what) => {
                let outcome = outcome_of(&reply);
                self.note(format!("  planted {what} -> {outcome}"));
            }
            Origin::Late(c, phase) => self.late_copy(c, phase, reply),
        }
    }

    /// A copy of a request delivered long after it was sent: nobody waits
    /// for its answer, but the answer must agree with the ledger's record:
    /// the same reservation, never a new one for an id already reserved
    /// (which may by now live only in the on-disk idempotency index).
    fn late_copy(&mut self, c: usize, phase: Phase, reply: Reply) {
        let call = &self.calls[c];
        let line = format!(
            "  {} {} (late copy) -> {}",
            call.id,
            phase.name(),
            outcome_of(&reply)
        );
        let mut wrong = None;
        if let Ok(Answer::Reservation {
            key,
            reservation,
            created,
            ..
        }) = &reply
        {
            match &call.told {
                Some(told)
                    if *created
                        || told.key != *key
                        || told.reserved_units != reservation.reserved_units =>
                {
                    wrong = Some(format!(
                        "{}: a late copy of its {} was answered with {:?} in {key} (created: {created}), but it was told {:?} in {}",
                        call.id,
                        phase.name(),
                        reservation.state,
                        told.state,
                        told.key
                    ));
                }
                None if *created && call.refused => {
                    self.count("refused, then admitted by a late copy")
                }
                _ => {}
            }
        }
        if let Err(Failure::Internal(msg)) = &reply {
            self.findings
                .push(finding(Gate::WriterBroke, format!("{line}: {msg}")));
        }
        self.note(line);
        if let Some(wrong) = wrong {
            self.findings.push(finding(Gate::ModelDisagrees, wrong));
        }
    }

    fn deliver_to_operator(&mut self, i: usize, reply: Reply, lost: bool) {
        let line = &self.lines[i];
        let what = format!(
            "operator {:?} {}/{}",
            line.pending,
            TENANTS[line.tenant].name,
            line.route.name()
        );
        let outcome = if lost {
            "LOST".to_string()
        } else {
            outcome_of(&reply)
        };
        self.note(format!("  {what} -> {outcome}"));
        if lost {
            return;
        }
        match reply {
            Ok(Answer::Published { key, .. }) => {
                let line = &mut self.lines[i];
                line.generation = key.policy_generation;
                line.pending = None;
                self.count("generation published");
            }
            Err(Failure::Unavailable(_)) => {}
            // A rollback with nothing to roll back to, or raced by an epoch roll.
            Err(Failure::Conflict { .. }) => self.lines[i].pending = None,
            Err(Failure::Internal(msg)) => {
                self.findings
                    .push(finding(Gate::WriterBroke, format!("{what}: {msg}")));
            }
            other => self.findings.push(finding(
                Gate::UnexpectedAnswer,
                format!("{what}: {other:?}"),
            )),
        }
    }

    fn deliver_to_call(&mut self, c: usize, sent: Phase, reply: Reply, lost: bool) {
        let now = self.now();
        self.calls[c].in_flight -= 1;
        let phase = self.calls[c].phase;
        let what = format!("  {} {}", self.calls[c].id, sent.name());
        let outcome = if lost {
            "LOST".to_string()
        } else {
            outcome_of(&reply)
        };
        if sent != phase {
            self.late_duplicate(c, reply, lost, format!("{what} -> {outcome}"));
            return;
        }
        self.note(format!("{what} -> {outcome}"));
        let unknown = lost || matches!(reply, Err(Failure::Unavailable(_)));
        if unknown {
            let call = &mut self.calls[c];
            if call.unknown_since.is_none() {
                call.unknown_since = Some(now);
                self.count("unknown");
            }
            return;
        }
        if let Some(since) = self.calls[c].unknown_since.take() {
            self.unknown_resolved_ms.push(now - since);
        }
        match reply {
            Ok(Answer::Reservation {
                key, reservation, ..
            }) => self.learned(c, key, *reservation),
            Err(Failure::Rejected { rejection, .. }) => self.rejected(c, phase, rejection),
            Err(Failure::Internal(msg)) => {
                self.findings
                    .push(finding(Gate::WriterBroke, format!("{what}: {msg}")));
            }
            other => self.findings.push(finding(
                Gate::UnexpectedAnswer,
                format!("{what}: {other:?}"),
            )),
        }
    }

    /// The answer to a copy of a request whose other copy's answer already
    /// moved the call on. Dropped, except one: a refusal is not a receipt (it
    /// makes no record), so the other copy of a refused reserve may have been
    /// admitted after it. The gateway then holds a reservation for a call it
    /// gave up, and gives it back.
    fn late_duplicate(&mut self, c: usize, reply: Reply, lost: bool, line: String) {
        let call = &self.calls[c];
        let admitted_after_refusal = match (&reply, lost) {
            (Ok(Answer::Reservation { reservation, .. }), false) => {
                call.refused
                    && call.told.is_none()
                    && reservation.state == ReservationState::Reserved
            }
            _ => false,
        };
        if !admitted_after_refusal {
            self.note(format!("{line} (late duplicate, dropped)"));
            return;
        }
        self.note(format!(
            "{line} (late duplicate of a refused reserve: released)"
        ));
        self.count("refused, then admitted by a duplicate");
        let Ok(Answer::Reservation {
            key, reservation, ..
        }) = reply
        else {
            unreachable!("matched above");
        };
        let call = &mut self.calls[c];
        call.refused = false;
        call.release = true;
        self.open_calls[call.gateway] += 1;
        call.phase = Phase::Reserve;
        self.learned(c, key, *reservation);
    }

    /// The gateway learnt the reservation's record: the model takes it, and
    /// the call moves on from the state the ledger says it is in.
    fn learned(&mut self, c: usize, key: PartitionKey, r: Reservation) {
        let first = self.calls[c].told.is_none();
        if first && r.held_units > 0 {
            let tenant = self.calls[c].tenant;
            self.admitted[tenant] += 1;
        }
        let phase = self.calls[c].phase;
        let next = match r.state {
            ReservationState::Reserved => match (phase, self.calls[c].release) {
                (Phase::Reserve, true) => Phase::Release,
                (Phase::Reserve, false) => Phase::Start,
                (phase, _) => phase,
            },
            ReservationState::Started | ReservationState::UsageUnknown => Phase::Settle,
            ReservationState::Expiring | ReservationState::Expired => {
                self.count("lease expired under a call");
                Phase::Done
            }
            _ => Phase::Done,
        };
        if self.plant == Some(Plant::DoubleRefund) && r.state == ReservationState::Released {
            self.plant_double_refund(c, &key, &r);
        }
        let call = &mut self.calls[c];
        call.told = Some(Told {
            key: key.clone(),
            state: r.state,
            reserved_units: r.reserved_units,
            actual_units: r.actual_units,
        });
        call.key = Some(key);
        self.set_phase(c, next);
    }

    fn set_phase(&mut self, c: usize, next: Phase) {
        let call = &mut self.calls[c];
        if call.phase != Phase::Done && next == Phase::Done {
            self.open_calls[call.gateway] -= 1;
        }
        call.phase = next;
    }

    fn rejected(&mut self, c: usize, phase: Phase, rejection: Rejection) {
        let expected = match (phase, &rejection) {
            (
                Phase::Reserve,
                Rejection::InsufficientCapacity { .. } | Rejection::DebtOutstanding { .. },
            ) => {
                self.calls[c].refused = true;
                self.count("reserve refused");
                true
            }
            (Phase::Start, Rejection::LeaseExpired { .. }) => true,
            (
                Phase::Start | Phase::Release,
                Rejection::WrongState {
                    state: ReservationState::Expiring | ReservationState::Expired,
                    ..
                },
            ) => true,
            _ => false,
        };
        if expected {
            if phase != Phase::Reserve {
                self.count("lease expired under a call");
            }
            self.set_phase(c, Phase::Done);
        } else {
            self.findings.push(finding(
                Gate::UnexpectedAnswer,
                format!("{} {}: {rejection:?}", self.calls[c].id, phase.name()),
            ));
        }
    }

    /// The planted double refund: a release in a closed generation is
    /// credited once more into the active one, as a move that never left.
    fn plant_double_refund(&mut self, c: usize, key: &PartitionKey, r: &Reservation) {
        let call = &self.calls[c];
        let Some(line) = self
            .lines
            .iter()
            .find(|l| l.tenant == call.tenant && l.route == Route::Chat)
        else {
            return;
        };
        if call.route != Route::Chat
            || key.policy_generation >= line.generation
            || r.held_units == 0
        {
            return;
        }
        let active = PartitionKey {
            policy_generation: line.generation,
            ..key.clone()
        };
        let command = Command::MoveIn {
            move_id: MoveId::new(format!("mv-planted-{}", r.id)).expect("a plain move id"),
            from: key.clone(),
            units: r.held_units,
            debt_units: 0,
            further: r
                .further
                .iter()
                .map(|h| DimensionAmounts::Moved {
                    units: h.held_units,
                    debt_units: 0,
                })
                .collect(),
        };
        let shard = self.node.writers.shard_of(&key.subject, &key.route);
        self.planted.push_back((
            shard,
            Request::Act {
                key: active.clone(),
                command,
            },
            format!("refund of {} again into {active}", r.id),
        ));
    }

    /// The checker (see `check`), and the model against the ledger.
    async fn check(&mut self, round: usize, with_recovery: bool) {
        let mut out = Vec::new();
        self.mirror.follow(&self.node.log, &mut out).await;
        let live = match self.node.partitions().await {
            Ok(live) => live,
            Err(err) => {
                out.push(finding(Gate::WriterBroke, err));
                self.fail(round, out);
                return;
            }
        };
        check::check_state("live", &live, &mut out);
        check::check_state("log", &self.mirror.partitions, &mut out);
        check::compare(
            Gate::LogDisagrees,
            "log",
            &self.mirror.partitions,
            "live",
            &live,
            &mut out,
        );
        self.check_model(&live, &mut out);
        if with_recovery {
            match reservoir_server::recovery::recover(
                &*self.node.log,
                self.node.shards,
                None,
                &self.node.retired,
            )
            .await
            {
                Ok(recovered) => {
                    let rebuilt: Partitions = recovered
                        .shards
                        .into_iter()
                        .flat_map(|s| s.partitions.into_iter().map(|(k, ps)| (k, ps.partition)))
                        .collect();
                    check::compare(
                        Gate::RecoveryDisagrees,
                        "recovered",
                        &rebuilt,
                        "live",
                        &live,
                        &mut out,
                    );
                }
                Err(err) => out.push(finding(Gate::RecoveryFailed, err)),
            }
        }
        self.fail(round, out);
    }

    fn fail(&mut self, round: usize, out: Vec<Finding>) {
        for f in &out {
            self.note(format!("r{round} FINDING {}: {}", f.gate.name(), f.detail));
        }
        self.findings.extend(out);
    }

    /// What the gateways were told must hold in the ledger: an acknowledged
    /// reservation exists (in memory or in the idempotency index) with the
    /// units told, in the state told or one reachable from it; a refused
    /// reserve was never debited.
    fn check_model(&mut self, live: &Partitions, out: &mut Vec<Finding>) {
        for call in &mut self.calls {
            if call.verified {
                continue;
            }
            // A duplicate admitted after its copy's refusal, its answer lost,
            // holds its lease until it expires: a leak the gateway cannot
            // see, bounded by the lease.
            if call.refused && self.mirror.debited(&call.id) && !call.reserve_duplicated {
                out.push(finding(
                    Gate::ModelDisagrees,
                    format!("{}: refused, but the log debited it", call.id),
                ));
            }
            let Some(told) = &call.told else { continue };
            let record = match live
                .get(&told.key)
                .and_then(|p| p.reservations.get(&call.id))
            {
                Some(r) => Some(r.clone()),
                None => match self.node.retired.get(&call.id) {
                    Ok(Some(retired)) if retired.key == told.key => Some(retired.reservation),
                    Ok(_) => None,
                    Err(err) => {
                        out.push(finding(Gate::ModelDisagrees, format!("{}: {err}", call.id)));
                        continue;
                    }
                },
            };
            let Some(r) = record else {
                out.push(finding(
                    Gate::ModelDisagrees,
                    format!(
                        "{}: told {:?} in {}, the ledger has no record",
                        call.id, told.state, told.key
                    ),
                ));
                continue;
            };
            let settled = matches!(
                told.state,
                ReservationState::Settled | ReservationState::SettledWithDebt
            );
            if r.reserved_units != told.reserved_units
                || !reachable(told.state, r.state)
                || (settled && r.actual_units != told.actual_units)
            {
                out.push(finding(
                    Gate::ModelDisagrees,
                    format!(
                        "{}: told {:?} ({} units, actual {:?}), the ledger has {:?} ({} units, actual {:?})",
                        call.id,
                        told.state,
                        told.reserved_units,
                        told.actual_units,
                        r.state,
                        r.reserved_units,
                        r.actual_units
                    ),
                ));
            } else if told.state.is_terminal() && r.state == told.state {
                call.verified = true;
            }
        }
    }

    /// The outcome, with what the log shows happened counted into the coverage.
    fn finish(mut self, rounds: usize) -> RunOutcome {
        for (event, n) in &self.mirror.events {
            *self.coverage.entry(event).or_default() += n;
        }
        for p in self.mirror.partitions.values() {
            let moves: Vec<_> = p.moves_out.values().collect();
            for m in moves {
                let epoch = p
                    .key
                    .as_ref()
                    .is_some_and(|k| k.accounting_epoch != m.counterpart.accounting_epoch);
                let debt = m.debt_units > 0
                    || m.further.iter().any(|a| matches!(a, DimensionAmounts::Moved { debt_units, .. } if *debt_units > 0));
                *self
                    .coverage
                    .entry(if epoch {
                        "move: epoch roll"
                    } else {
                        "move: generation"
                    })
                    .or_default() += 1;
                if debt {
                    *self.coverage.entry("move carrying debt").or_default() += 1;
                }
            }
            // Moves out after the first: a closed partition draining what its
            // calls in flight gave back.
            if p.moves_out.len() > 1 {
                *self
                    .coverage
                    .entry("move: drain of a closed partition")
                    .or_default() += p.moves_out.len() as u64 - 1;
            }
        }
        self.coverage.insert(
            "records evicted from memory",
            self.mirror
                .partitions
                .values()
                .map(|p| p.evicted_reservations)
                .sum(),
        );
        let simulated_ms = self.now() - self.start_ms;
        let findings = std::mem::take(&mut self.findings);
        let trace_hash = hex::encode(std::mem::take(&mut self.trace_hash).finalize());
        RunOutcome {
            seed: self.seed,
            steps: self.steps,
            rounds,
            simulated_ms,
            trace_hash,
            trace: self.trace.into_iter().collect(),
            findings,
            unknown_resolved_ms: self.unknown_resolved_ms,
            admitted: self.admitted,
            demand: self.demand,
            coverage: self.coverage,
        }
    }
}

/// Whether a record told in state `from` may since have moved to `to`.
fn reachable(from: ReservationState, to: ReservationState) -> bool {
    let mut seen = vec![from];
    let mut i = 0;
    while i < seen.len() {
        for next in ReservationState::ALL {
            if seen[i].can_move_to(next) && !seen.contains(&next) {
                seen.push(next);
            }
        }
        i += 1;
    }
    seen.contains(&to)
}

fn command_name(command: &Command) -> String {
    match command {
        Command::Expire { id } => format!("expire {id}"),
        Command::MarkUsageUnknown { id } => format!("usage-unknown {id}"),
        Command::Refill => "refill".to_string(),
        other => format!("{other:?}"),
    }
}

/// A reply as the trace shows it: what the caller learnt, without log
/// positions or anything else a hash-map order could change.
fn outcome_of(reply: &Reply) -> String {
    match reply {
        Ok(Answer::Reservation {
            reservation,
            created,
            ..
        }) => format!(
            "{:?} {} held {} actual {:?}{}",
            reservation.state,
            reservation.reserved_units,
            reservation.held_units,
            reservation.actual_units,
            if *created { " (created)" } else { "" }
        ),
        Ok(Answer::Published { key, created, .. }) => {
            format!(
                "published {key}{}",
                if *created { " (created)" } else { "" }
            )
        }
        Ok(Answer::Done) => "done".to_string(),
        Ok(other) => format!("{other:?}"),
        Err(Failure::Rejected { rejection, .. }) => format!("rejected: {rejection}"),
        Err(Failure::Unavailable(why)) => format!("unavailable: {why}"),
        Err(other) => format!("{other:?}"),
    }
}

/// Every policy the operator may publish is valid (checked once, in the test).
pub fn policies_valid() -> Result<(), String> {
    for tenant in TENANTS {
        for route in ROUTES {
            for variant in 0..3 {
                let p: Policy = workload::policy(tenant, route, 1, variant);
                p.validate()
                    .map_err(|e| format!("{}/{}: {e}", tenant.name, route.name()))?;
            }
        }
    }
    Ok(())
}
