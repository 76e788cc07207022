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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use reservoir_core::{
    Command, DimensionAmounts, MoveId, OperationId, PartitionKey, Policy, Rejection, RequestDigest,
    Reservation, ReservationId, ReservationState, Units, Usage,
};
use reservoir_server::writer::{Amount, Answer, Failure, Reply, Request, Retired, RetiredIndex};
use sha2::{Digest, Sha256};

use crate::check::{self, finding, Finding, Gate, Mirror, Partitions};
use crate::node::{Node, SimLog, Trouble};
use crate::rng::Rng;
use crate::workload::{self, Route, ROUTES, TENANTS};

mod checking;
mod client_gateway;
mod config;
mod faults;
mod gateway;
mod operator;
mod projection;
mod replay;
mod shard_answers;
mod shards;
mod stream;

pub use config::{Plant, RunConfig};
pub use faults::TORN_APPEND;
pub use shard_answers::{STOLEN_UNAVAILABLE, STOLEN_UNSENT};

use client_gateway::ClientSide;
use gateway::{Call, Phase, RetiredSeen, Told};
use operator::Line;
use projection::Projection;
use shards::{Gateway, LocalCall, Presenter, ShardPhase, SimShard};

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
    /// The client gateways' start schedulers against their fairness budget.
    pub starts: crate::report::StartFigures,
    /// How often each path was taken (faults, restarts, event types in the log).
    pub coverage: BTreeMap<&'static str, u64>,
}

impl RunOutcome {
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Runs one interleaving on a fresh single-threaded runtime.
/// A panic outside the writer tasks (an assertion of core's on the
/// checker's mirror, or of the simulator's own) is a finding of its seed,
/// not the end of a many-seed run.
pub fn run(seed: u64, config: &RunConfig) -> RunOutcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(run_async(seed, config))
    }));
    ran.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string());
        RunOutcome {
            seed,
            steps: config.steps,
            findings: vec![finding(Gate::Panicked, message)],
            ..RunOutcome::default()
        }
    })
}

async fn run_async(seed: u64, config: &RunConfig) -> RunOutcome {
    // The client crate's jitter and fresh operation ids (the client gateway's).
    fastrand::seed(seed);
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
        world.project(round).await;
        round += 1;
    }
    // The quiet drain: every UNKNOWN must resolve once the faults stop.
    let mut drained = 0;
    while world.findings.is_empty() && drained < DRAIN_ROUNDS && world.unresolved() > 0 {
        world.round(round, true).await;
        world.check(round, false).await;
        world.project(round).await;
        round += 1;
        drained += 1;
    }
    if world.findings.is_empty() {
        world.check(round, true).await;
        world.check_projection(round).await;
        if world.findings.is_empty() {
            world.check_replay(round).await;
        }
        let left = world.unresolved();
        if left > 0 {
            world.findings.push(finding(
                Gate::UnknownUnresolved,
                format!("{left} calls still UNKNOWN after {DRAIN_ROUNDS} quiet rounds"),
            ));
        }
    }
    world.client_close().await;
    world.finish(round)
}

/// One shard's part of a snapshot (`reservoir_server::snapshot::capture`).
type SnapshotPart = (
    Vec<reservoir_server::snapshot::SnapPartition>,
    Vec<(String, String, PartitionKey)>,
);

/// Who sent a request, so its reply goes back to them.
enum Origin {
    /// A call's request, sent in the phase named.
    Call(usize, Phase),
    Operator(usize),
    Sweeper(String),
    Planted(String),
    /// A copy of a call's request the network delivered late.
    Late(usize, Phase),
    /// One shard's part of a snapshot being taken.
    Snapshot(usize),
    /// An emergency shard's issue or reconcile, sent in the phase named.
    Shard(usize, ShardPhase),
    /// A shard presented by a gateway it is not bound to.
    ShardProbe(usize, Presenter),
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
    chat_shards: bool,
    stream_cancel: bool,
    /// The client gateways (none with `--no-client-gateway`), after the
    /// simulator's own gateways.
    clients: Vec<ClientSide>,
    /// The projector following the log (`None` with `--no-projector`).
    projection: Option<Projection>,
    /// A second gateway now and then presents a shard its book refused
    /// (`--stolen-shards`).
    stolen_shards: bool,
    /// Some appends keep a prefix of their records (`--torn-appends`).
    torn_appends: bool,
    /// A snapshot being taken this round: its cut, and each shard's part.
    taking: Option<(reservoir_server::snapshot::Cut, Vec<Option<SnapshotPart>>)>,
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
    /// What the model check last decoded from the node's index.
    retired_seen: RetiredSeen,
    /// Emergency shards (see `shards`): each gateway's book, the shards,
    /// the calls admitted from them, the probes a restart (or a second
    /// gateway) left.
    gateways: Vec<Gateway>,
    shards: Vec<SimShard>,
    local_calls: Vec<LocalCall>,
    /// Requests for the next wave, as they go out: (origin, writer, request).
    probes: Vec<(Origin, usize, Request)>,
    signer: Arc<reservoir_server::shards::ShardSigner>,
    _dir: tempfile::TempDir,
}

/// The run's directory for its RocksDB indexes: in `/dev/shm` where the
/// machine has it. The disk is not what the simulator tests, and on a real
/// disk RocksDB's opens and file creations wait for it (a run of 40
/// interleavings took 1.3x the wall time on disk, for the same CPU).
fn scratch_dir() -> Result<tempfile::TempDir, String> {
    let shm = std::path::Path::new("/dev/shm");
    let made = if shm.is_dir() {
        tempfile::Builder::new()
            .prefix("reservoir-sim-")
            .tempdir_in(shm)
    } else {
        tempfile::tempdir()
    };
    made.map_err(|e| format!("tempdir: {e}"))
}

impl World {
    async fn new(seed: u64, config: &RunConfig) -> Result<World, String> {
        let mut rng = Rng::new(seed);
        let ordered = rng.chance(500);
        let shards = rng.range(1, 3) as usize;
        let max_batch = *[2usize, 8, 64].get(rng.index(3)).expect("an index below 3");
        let dir = scratch_dir()?;
        let retired = Arc::new(RetiredIndex::open(&dir.path().join("retired"))?);
        let log = Arc::new(SimLog::new(
            ordered,
            config.plant == Some(Plant::DebtNotCarried),
            config.plant == Some(Plant::LostWrite),
        ));
        let clock = reservoir_server::clock::ManualClock::new(workload::START_MS);
        let signer = shards::signer();
        let public_key = signer.public_key_hex();
        let gateways: Vec<Gateway> = (0..GATEWAYS + config.client_gateways)
            .map(|g| Gateway::new(g, 1, &public_key, &clock))
            .collect();
        let projection = match config.projector {
            true => Projection::open(
                seed,
                dir.path(),
                log.clone(),
                config.plant == Some(Plant::ProjectorSkips),
            )?,
            false => None,
        };
        let node = Node::boot(log, clock, retired, shards, max_batch).await?;
        // One router for every client gateway: the node's HTTP side, built
        // for the first (a run without client gateways builds none).
        let mut ledger = None;
        let clients = (GATEWAYS..gateways.len())
            .map(|g| {
                let ledger = ledger
                    .get_or_insert_with(|| client_gateway::LedgerHttp::new(node.writers.clone()));
                let concurrency = rng.range(1, 2) as usize;
                let swapped = config.plant == Some(Plant::SchedulerWeightsSwapped);
                ClientSide::new(
                    &node.clock,
                    ledger.clone(),
                    &gateways,
                    g,
                    concurrency,
                    swapped,
                )
            })
            .collect();
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
            chat_shards: config.chat_shards,
            stolen_shards: config.stolen_shards,
            torn_appends: config.torn_appends,
            stream_cancel: config.stream_cancel,
            clients,
            projection,
            taking: None,
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
            retired_seen: RetiredSeen::default(),
            gateways,
            shards: Vec::new(),
            local_calls: Vec::new(),
            probes: Vec::new(),
            signer,
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
            + self.shards_unresolved()
            + self.stolen_unsent()
    }

    /// Second gateways' presentations not sent yet. The drain waits for
    /// them (only `--stolen-shards` makes them, so the release gate's
    /// interleavings are unchanged); it does not wait for a restarted
    /// gateway's probe, which could add drain rounds to the gate's seeds
    /// (a one-off count found none left unsent in seeds 1–2000).
    fn stolen_unsent(&self) -> usize {
        self.probes
            .iter()
            .filter(|(origin, _, _)| matches!(origin, Origin::ShardProbe(_, Presenter::Other(_))))
            .count()
    }

    /// One step (see the module docs): the clock moves, the sweeper may
    /// collect, a fault is armed, the waves go out, the replies come back
    /// (or are lost), and the node is rebuilt if it must be.
    async fn round(&mut self, round: usize, quiet: bool) {
        (self.round, self.quiet) = (round, quiet);
        let dt = match (quiet, self.rng.below(100)) {
            (true, _) => self.rng.range(500, 3_000),
            (false, 0..=3) => self.rng.range(16_000, 45_000), // leases pass
            (false, 4..=5) => self.rng.range(41_000, 400_000), // execution limits, epochs
            _ => self.rng.range(50, 2_000),
        };
        self.node.clock.advance(dt);
        self.client_round(quiet).await;
        let due = match quiet || self.rng.chance(400) {
            true => {
                let refill = quiet || self.rng.chance(500);
                self.collect_due(refill).await
            }
            false => Vec::new(),
        };
        self.shard_round(quiet);
        let fault = self.arm_fault(quiet);
        self.note(format!(
            "r{round} +{dt}ms t={} fault: {}",
            self.now() - self.start_ms,
            fault.name
        ));
        if fault.take_over {
            let rounds = self.rng.range(1, 3) as u32;
            match self.node.take_over(rounds).await {
                Ok(zombie) => {
                    self.count("take-over with a zombie");
                    self.zombie = Some(zombie);
                }
                Err(err) => self.findings.push(finding(Gate::RecoveryFailed, err)),
            }
        }
        if fault.hold {
            self.node.log.hold(true);
        }
        let mut sent = Vec::new();
        let mut http = Vec::new();
        let waves = if quiet { 1 } else { self.rng.range(1, 3) };
        for wave in 0..waves {
            let requests = self.wave(wave, &due);
            for (origin, shard, request) in requests {
                sent.push(self.dispatch(origin, shard, request));
            }
            http.extend(self.client_wave(wave).await);
            for _ in 0..YIELDS_PER_WAVE {
                tokio::task::yield_now().await;
            }
        }
        let mut panics = Vec::new();
        if fault.crash {
            self.count("crash mid-batch");
            panics = self.node.crash().await;
        }
        self.node.log.hold(false);
        if self.node.log.take_held_appends() >= 2 {
            self.count("rounds with 2+ appends in flight");
        }
        for (origin, handle) in sent {
            let reply = handle.await.expect("a request task does not panic");
            let lost = fault.drop_per_mille > 0 && self.rng.chance(fault.drop_per_mille);
            self.deliver(origin, reply, lost);
        }
        self.client_deliver(http, fault.drop_per_mille).await;
        self.node.log.inner.fail_next_appends(0);
        self.node.log.inner.tear_next_append(None);
        self.finish_snapshot();
        panics.extend(self.age_zombie().await);
        for panic in panics {
            self.findings.push(finding(
                Gate::WriterBroke,
                format!("writer panicked: {panic}"),
            ));
        }
        self.heal(fault.crash).await;
    }

    /// The requests of one wave: in the first, the sweeper's commands, the
    /// operator's change and the copies the network delivers late; then
    /// planted requests and the gateways'.
    fn wave(
        &mut self,
        wave: u64,
        due: &[(usize, PartitionKey, Command)],
    ) -> Vec<(Origin, usize, Request)> {
        let (round, quiet) = (self.round, self.quiet);
        let mut requests = Vec::new();
        if wave == 0 {
            for (shard, key, command) in due {
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
            requests.extend(self.shard_requests());
            if !quiet && self.taking.is_none() && self.rng.chance(50) {
                // As the snapshotter: the cut first, then every shard's state
                // (each between two batches, racing this round's traffic).
                let shards = self.node.writers.shards();
                self.taking = Some((self.node.cut(), vec![None; shards]));
                for shard in 0..shards {
                    requests.push((Origin::Snapshot(shard), shard, Request::Snapshot));
                }
            }
            // In the quiet drain the network delivers everything it held.
            let (late, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.delayed)
                .into_iter()
                .partition(|&(at, _, _)| quiet || at <= round);
            self.delayed = later;
            for (_, c, phase) in late {
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
        requests
    }

    /// Sends one request as its own task (to the zombie, for a gateway that
    /// still routes there).
    fn dispatch(
        &mut self,
        origin: Origin,
        shard: usize,
        request: Request,
    ) -> (Origin, tokio::task::JoinHandle<Reply>) {
        let mut writers = self.node.writers.clone();
        if let (Some(zombie), Origin::Call(c, phase) | Origin::Late(c, phase)) =
            (&self.zombie, &origin)
        {
            if self.rng.chance(300) {
                writers = zombie.writers.clone();
                let line = format!(
                    "  {} {} sent to the zombie",
                    self.calls[*c].id,
                    phase.name()
                );
                self.note(line);
                self.count("request to the zombie");
            }
        }
        (
            origin,
            tokio::spawn(async move { writers.call(shard, request).await }),
        )
    }

    fn deliver(&mut self, origin: Origin, reply: Reply, lost: bool) {
        match origin {
            Origin::Call(c, phase) => {
                // A gateway cut off from the ledger hears nothing.
                let cut_off = self.gateways[self.calls[c].gateway].cut_off > 0;
                self.deliver_to_call(c, phase, reply, lost || cut_off)
            }
            Origin::Shard(s, phase) => self.deliver_to_shard(s, phase, reply, lost),
            Origin::ShardProbe(s, by) => self.deliver_probe(s, by, reply),
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
            Origin::Snapshot(shard) => {
                let part = match reply {
                    Ok(Answer::Snapshot(state)) if !lost => {
                        Some(reservoir_server::snapshot::capture(&state))
                    }
                    _ => None,
                };
                if let Some((_, parts)) = self.taking.as_mut() {
                    parts[shard] = part;
                }
            }
        }
    }

    /// The outcome, with what the log shows happened counted into the coverage.
    fn finish(mut self, rounds: usize) -> RunOutcome {
        for (event, n) in &self.mirror.events {
            *self.coverage.entry(event).or_default() += n;
        }
        // Only a run that ended early (a finding, or the drain's last
        // round) leaves a presentation unsent.
        let stolen_unsent = self.stolen_unsent();
        if stolen_unsent > 0 {
            *self.coverage.entry(STOLEN_UNSENT).or_default() += stolen_unsent as u64;
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
        let starts = self.start_figures();
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
            starts,
            coverage: self.coverage,
        }
    }
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
        Ok(Answer::Shard { document, created }) => format!(
            "shard of {} units from {}, expires at {}{}",
            document.units,
            document.source,
            document.expires_at_ms,
            if *created { " (created)" } else { "" }
        ),
        Ok(Answer::Reconciled(o)) => format!(
            "reconciled into {}: reminted {}, spent {}, unknown {}, excess {}{}",
            o.target,
            o.record.units,
            o.record.spent_units,
            o.record.unknown_units,
            o.record.excess_units,
            if o.created { " (created)" } else { "" }
        ),
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
