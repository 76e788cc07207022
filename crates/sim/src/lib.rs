//! # reservoir-sim
//!
//! A deterministic simulation of Reservoir's write path: simulated gateways
//! drive the **real** writer pipeline (`reservoir_server::writer`: batching,
//! speculative apply, undo through core savepoints, pipelined batches in
//! flight), its recovery (`reservoir_server::recovery::recover`) and the
//! sweeper's commands, over the memory log with its faults injected, under
//! a `ManualClock`, from one `u64` seed, in one thread. A checker runs after
//! every step. It is the start of issue 18's release gate.
//!
//! - [`run`]: one interleaving (a seed): the world, its rounds, the
//!   gateways' client behaviour and the reference model of what they were told.
//! - [`check`]: the gates (conservation, move pairs, admission while in debt,
//!   second debits and refunds, debt left behind, log vs live vs recovery).
//! - [`node`]: one ledger node: writers, recovery, crash, re-claim; the log wrapper.
//! - [`workload`]: tenants, routes and policies. [`report`]: figures and the gate table.
//! - [`chunk`]: a run saved as a chunk of the release gate, and chunks merged
//!   into one gate table (`scripts/sim-gate` runs the million that way).
//!
//! ## What is simulated
//! - Gateways (3, up to 4 calls each) that reserve, start, settle below and
//!   above the reservation, and release, for 3 tenants (weights 1, 2, 3) on
//!   two routes: `chat` limits requests, input and output tokens (sized
//!   reserves, settles from usage), `embed` limits tokens and rolls its
//!   accounting epoch every hour. A call whose answer is lost is UNKNOWN; its
//!   gateway retries the same request, with the same id and digest, until it
//!   learns the outcome. It never invents a new id for a call.
//! - Cancelled streams ([`run`]'s `stream`): now and then a `chat` call's
//!   streamed answer (Anthropic events) is cut off mid-way and settled at
//!   what the client crate's own `SseScanner` and `UsageMeter` counted of
//!   the events sent before the cut (byte chunks split anywhere, an earlier
//!   delta now and then repeated), input from the gateway's count when the
//!   stream was cut before `message_start` (none when the provider refused
//!   the call with an error status). The settle is the one the
//!   client's lease sends for a dropped stream (`UsageMeter::settlement`),
//!   as JSON read by the server's own `SettleBody` (`RunConfig::stream_cancel`,
//!   on unless `--no-stream-cancel`). A ledger that charged no input when
//!   the provider reported none, edited by hand into core's
//!   `Dimension::used_units`, failed 91 of seeds 1–100 this way
//!   (`unexpected_answer`) and none of them without cancelled streams; the
//!   plant `input-uncounted` is the same fault on the gateway's side.
//! - A client gateway ([`run`]'s `client_gateway`, on unless
//!   `--no-client-gateway`): a fourth gateway whose calls are the client
//!   crate's own request loop (`reservoir_client::Client`: reserve with its
//!   retries under one deadline, RESERVATION_UNKNOWN resolved by asking
//!   again, start, a lease fed Anthropic events that finishes or is dropped
//!   mid-stream and settles in the background, a failed start given back in
//!   the background), over HTTP answered by the server's own router
//!   (`reservoir_server::api::router`, in process: extractors, handlers,
//!   status codes, problem+json). The client's transport and timer
//!   (`reservoir_client::transport`) are the simulator's: its requests wait
//!   on the simulated wire for a wave, are refused while the gateway is cut
//!   off, and their answers are lost or delivered with the round's odds;
//!   its backoffs and deadlines pass in simulated time. Its jitter and
//!   operation ids come from `fastrand`, seeded per run. It holds
//!   emergency shards like the other gateways, in the `ShardBook` that is
//!   its client's fallback: cut off, the client admits from them itself,
//!   and a call admitted from a shard must never be debited by the ledger.
//!   Its process restarts now and then, as in a crash: its tasks stop where
//!   they are, nothing more leaves it (a background step fails at once),
//!   copies the network holds still land; its calls are orphaned for the
//!   ledger's sweeper to end, and a new process (new boot epoch, empty
//!   book, new client) carries on. Its RESERVED calls wait for their turn
//!   in the client crate's `StartScheduler` (one or two provider calls at
//!   once, weighted by the tenants' weights; now and then a caller stops
//!   waiting first, and the reservation goes back), and gate
//!   `scheduler_over_budget` holds the scheduler to its fairness budget
//!   (`reservoir_client::FairnessGap`) over every stretch in which two
//!   tenants both waited throughout, read after each stretch of its tasks
//!   running (`client_gateway::fairness`). With `--client-gateways N`
//!   (`RunConfig::client_gateways`, 1 to 4; one by default, the release
//!   gate's) there are N such gateways (gw-3, gw-4, …), each with its own
//!   client, scheduler, book, cut-offs and restarts, calling the same
//!   ledger at once; their interleavings are not the default's.
//! - An operator publishing new generations and rolling back, with
//!   reservations in flight; each change retried as it was until answered.
//! - The sweeper: expiries, execution limits (USAGE_UNKNOWN, later resolved
//!   by a settle naming the operation) and refills, racing the gateways.
//! - Snapshots taken as the server's snapshotter takes them (the cut, then
//!   each shard's state, racing the round's traffic); a restarted process
//!   recovers from the last one and the log after its cut, and the checker
//!   holds the result to the replay of the whole log.
//! - A network that loses replies, and delivers some requests twice: an
//!   impatient duplicate while the first is in flight, or a copy 1–40
//!   rounds late, answered by then from the on-disk idempotency index; and
//!   partitions a gateway from the ledger for 2–8 rounds (it sends nothing,
//!   hears nothing; its calls wait and retry).
//! - Emergency shards of `embed`, and now and then of `chat` (of its
//!   primary dimension, requests; its token dimensions are not carved)
//!   ([`run`]'s `shards`): issued to a gateway
//!   (the server's own body translation, signed with a fixed key), held in
//!   the client crate's real `ShardBook`, spent by local calls while the
//!   gateway is cut off (settled below and above the hold, released, usage
//!   unknown), reconciled once it is back (a lost answer retried with the
//!   same receipts, now and then sent twice, late past the grace), offered
//!   to a second gateway (refused by its book, a client gateway's among
//!   them, and the client gateway's shards offered to the others; with
//!   `--stolen-shards` the second gateway then presents it to the ledger
//!   under its own id, which must refuse it), lost with a gateway restart
//!   (refused to the new process's book, its reconcile under the new boot
//!   epoch refused by the ledger).
//! - Ledger faults: failed appends, an append written but its answer lost
//!   (in doubt: the node re-claims the log and rebuilds), a fatal append (the
//!   node restarts), a crash with batches in flight (appends held, the writer
//!   tasks aborted, a new process claims the log and recovers), replies lost
//!   on the way back, clock jumps past leases, execution limits and epochs.
//!   With `--torn-appends` (not the release gate's interleavings), half of
//!   the appends armed to be in doubt keep only a prefix of their records,
//!   as a Kafka append can: a publish or epoch roll cut after its
//!   successor's opening is finished by the first batch after the rebuild.
//! - Take-overs that leave the old process running (`RunConfig::zombies`,
//!   on unless `--no-zombies`): a new writer claims the log while the old
//!   one's writers still answer the gateways that route to it, until an
//!   append or a claim confirmation fences them (or they are killed 1–3
//!   rounds later).
//! - The projector (in one run of three; [`run`]'s `projection`): the real
//!   `reservoir_projections::Projector` follows the log a step at a time,
//!   crashes between deriving a step and committing it, restarts with its
//!   database closed and opened again, and in some runs prunes finished
//!   records (the retention rule). At the end it catches up and must equal
//!   a projector rebuilt from the whole log byte for byte, and the ledger's
//!   live partitions; it draws from a generator of its own, so the world's
//!   interleavings are the same with it or without (`--no-projector`).
//!   Then `reservoir-replay verify` ([`run`]'s `replay`: the audit tool's
//!   engine and comparison) re-derives every partition from the log and
//!   must find nothing in it and equal the projector's database, every
//!   balance and record (gate `replay_disagrees`).
//! - The idempotency index (`RetiredIndex`, RocksDB) is the real one, in a
//!   temporary directory per run (in `/dev/shm` where there is one): records
//!   leave memory after a 20 s window and retries are answered from it. It
//!   is the only RocksDB in the loop (the log is the memory log), opened
//!   once per run (a few ms).
//! - The log is either unordered (the embedded log's contract) or ordered
//!   (Kafka's: the writer pipelines batches); 1–3 shards; batches of 2–64.
//!
//! ## What it found
//! With zombies, within a few interleavings: a writer whose claim was
//! superseded answered *rejections* from its stale memory, with no log
//! round-trip, so nothing fenced them — a settle refused `WrongState
//! (Reserved)` for a call the new writer had started, a start or release
//! refused `UnknownReservation` for one the new writer had made (52 of 300
//! interleavings, seeds 1–300, at 1b01de6; 14 of seeds 1–100 with shards).
//! Fixed in the server: a batch that appends nothing but answers decisions
//! from state confirms the writer's claim first
//! (`reservoir_log::EventLog::confirm_claim`; on Kafka, the read-back to the
//! partition's end), and answers 503 when it cannot. Seeds 1–300 then pass
//! with zombies, which are now on by default.
//!
//! The gates `duplicate_refund` and `available_negative` have no plant:
//! core's state machine has no second end for a reservation and every term
//! is an unsigned, checked integer, so only a broken core could reach them;
//! they are backstops.
//!
//! While the client gateway was being added (its count of background steps
//! the client gave up on, not a gate): a call whose start was answered too
//! late (the client gave up and gave it back in the background) and had
//! in fact started was settled by the client at 0 units *without usage*;
//! on `chat`, which limits tokens beside requests, the ledger refuses such
//! a settle (`usage_missing`), so the call waited for its execution limit
//! and its whole hold was retired as usage unknown, for a provider call
//! never made. Fixed in the client (the settle carries a usage of no input
//! and no output, and the start's operation id), with a test of its own.
//!
//! When the projector joined: with the retention rule on, a projector
//! restarted after it pruned the last records of a partition that had gone
//! idle (still inside their idempotency window at its last event) restored
//! that partition without them, and counted fewer evictions than one that
//! never restarted or a rebuild: its database was not the rebuild's, byte
//! for byte (with the fix reverted, 9 of seeds 1–2,000). Fixed in the
//! projector: a record the rule prunes leaves its partition's memory then,
//! counted as evicted
//! (`reservoir_core::retention::forget_finished`), with a test of its own.
//!
//! Not a bug, but a contract a client must know: a refusal is not a
//! receipt (it makes no record), so a second copy of a refused reserve (an
//! impatient duplicate, a late packet) can be admitted after it. A client
//! that takes the first refusal as final while another copy is in flight
//! holds a reservation it does not know of until its lease expires.
//!
//! ## What is not simulated yet
//! A socket between gateway and ledger (the client gateway's HTTP is the
//! server's router called in process; the other gateways' bodies go through
//! the server's translations); the client crate's owner routing in cluster
//! mode; the start scheduler at any other gateway than the client gateway
//! (the other gateways start as soon as they are answered); a client gateway that keeps its
//! unresolved calls across a restart (a restarted one orphans them);
//! shards that carve a route's token dimensions (a shard of
//! `chat` carves requests only: a cut-off gateway's tokens are not bounded
//! by it, and not recorded on reconcile); several nodes and Kafka
//! ownership (beyond the one zombie above); the projector's Kafka-side
//! fence (records of a fenced writer that landed: the memory log refuses
//! them at the append); `reservoir-replay`'s other commands (its `verify`
//! runs, see the projector above; `audit`, `state` and `export` do not); a gate for "UNKNOWN never counted as unused" beyond core's
//! state machine (which has no edge from a started call to a refund). The
//! serving loop of `reservoir_server::start_with_clock` (recover → writers →
//! re-claim on doubt) is re-stated in [`node`] rather than shared, so a
//! change there must be mirrored here. The sweeper's loop is re-stated too (`CollectDue`, then
//! the commands), because the shard answers refills in hash-map order
//! (foldhash with per-process keys): the simulator sorts them, the server
//! does not need to.
//!
//! ## Determinism
//! One ChaCha8 stream per run, seeded from the seed, decides everything the
//! world does, in a fixed order; the whole run is one `current_thread` tokio
//! runtime, where tasks run in the order they were woken. Nothing sleeps:
//! appends are held in flight at a `Notify`, not a timer, and the only
//! timer left (the writer's 30 s wait for a commit) never fires. Nothing the
//! world waits on may wake its waiters in an order tokio randomises: a
//! `tokio::sync::watch` does (its waiters are spread over eight `Notify`s
//! by tokio's per-runtime random generator), and while held appends waited
//! on one, seed 490076 gave one of two trace hashes, by chance (found when
//! chunks of the release gate began to carry a digest of their runs; the
//! test runs that seed eight times). The writer's own stop signal is still a
//! watch: the shards of a process wake on it in an order that may vary. No
//! trace has shown that yet (seeds 490001–490300 run three times gave one
//! runs digest), but it is the next place to look if a digest ever differs. Tokio's
//! `test-util` (paused time) is not used: enabling a tokio feature from this
//! crate would unify into every crate of a workspace build and compile tokio
//! and the server a second time. What reaches the trace is what the callers
//! learnt (no log positions, no hash-map orders), and the trace hash is the
//! SHA-256 of its lines: the same seed gives the same hash, which a test asserts.
//!
//! ## Why a purpose-built scheduler
//! The code under test is tokio code in one process, talking over channels,
//! a trait (`EventLog`) and a clock we inject. A simulation crate that runs
//! tokio code on simulated hosts and a simulated network (turmoil, madsim)
//! would buy a simulated socket at the price of its own runtime or a
//! patched tokio for the whole workspace, and hide the one thing we must
//! control: when each batch is decided, appended and answered. Rounds and
//! waves over the real pipeline, with faults at our own trait boundaries
//! (the log's `EventLog`, the client's `Transport` and `Timer`), keep that
//! explicit; the client gateway's HTTP goes through the server's router as
//! a tower service, which is the HTTP a socket would deliver, minus the
//! socket. Revisit when several nodes join (turmoil then fits best).
//!
//! ## Planted bugs
//! [`Plant`] switches on a known bug, to show the checker fails; the test
//! asserts each is found and how many interleavings it took. All are
//! planted in the simulator, at boundaries it owns, never in the server or
//! core: a cargo feature of the server would be unified into the workspace
//! build (`cargo test --workspace` builds each crate once, with the union of
//! features), so either the shipped code would carry the bug's switch or the
//! server would be compiled twice. The plants:
//! - `double-refund`: what the writer *receives*: when a release is answered
//!   in a closed generation, the simulator sends the active generation a
//!   `MoveIn` of the same units that never left (the refund credited twice).
//! - `debt-not-carried`: what the writer *writes*: the log wrapper drops the
//!   debt of the `MovedOut`/`MovedIn` of a generation switch or rollback (a
//!   codec that loses a field), so the debt stays behind in the closed
//!   generation of the log while the writer's memory carried it.
//! - `lost-write`: what the log *answers*: every 23rd append is acknowledged
//!   without being written, so acknowledged steps are missing from the log
//!   (and from the state a restart rebuilds).
//! - `index-forgets`: what the writer *reads*: after every check the
//!   writers' global id index (`Writers::index`, shared with the shards)
//!   loses the ids held by closed generations, so a reserve retried or
//!   delivered late for one of them is decided anew in the active
//!   generation: a second debit for one id.
//! - `shard-after-restart`: what the gateway *keeps*: a restarted gateway
//!   comes back under its old boot epoch and installs its shards again
//!   without their receipts, so a shard is spent twice (or reconciled with
//!   the second process's receipts only).
//! - `fallback-after-send`: what the client gateway's transport *tells the
//!   client*: a reserve whose answer was lost is reported as never sent
//!   (a connection error after the bytes went out), so a client cut off
//!   before it hears again admits the call from a shard while the ledger
//!   holds it too.
//! - `input-uncounted`: what the gateway *sends*: a settle's usage loses
//!   the gateway's counted input when the provider reported none (a body
//!   translation that drops a field), which only a stream cancelled before
//!   `message_start` makes; the model keeps what the gateway meant.
//! - `projector-skips`: what the projector *reads*: the followed projector
//!   loses one entry of the log, so its database is no longer a rebuild's.
//! - `replay-skips`: what the audit tool *reads*: `reservoir-replay
//!   verify` loses one entry of the log, so its engine finds a gap.
//! - `scheduler-weights-swapped`: what the client gateway's scheduler is
//!   *configured* with: the tenants' weights the wrong way round (a table
//!   keyed by the wrong names), so the lighter tenant's calls start ahead.
//! - `identity-cloned`: what a second gateway *is*: it runs under the id
//!   and boot epoch of the gateway a shard was issued to (a cloned machine
//!   image), so its book takes the other's shard when it is offered.
//! - `binding-from-document`: what the ledger is *told*: a reconcile
//!   names the gateway id and boot epoch its shard document is bound to
//!   instead of the presenter's own (an SDK or proxy that copies them from
//!   the document), so the ledger takes a shard presented by the restarted
//!   process of its gateway, or by a second gateway, and the probe's check
//!   (refused or unavailable, nothing else) fails.

/// The allocator of everything that links this crate: the `reservoir-sim`
/// binary and the test binary (the CI run is the simulator's largest user).
/// A run allocates and frees small strings and records all the time (log
/// entries cloned for every replay, JSON of the idempotency index): glibc's
/// malloc and free were about 20% of a run's CPU (perf, 20 interleavings),
/// and with mimalloc the same run was 1.37x faster (bench-results/sim.md).
/// Which allocator runs cannot change a trace: nothing the world decides
/// reads an address.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod check;
pub mod chunk;
pub mod cli;
pub mod node;
pub mod report;
mod rng;
pub mod run;
pub mod workload;

pub use check::{Finding, Gate};
pub use report::Summary;
pub use run::{
    policies_valid, run, Plant, RunConfig, RunOutcome, STOLEN_UNAVAILABLE, STOLEN_UNSENT,
    TORN_APPEND,
};

/// Runs seeds `first .. first + n` on `threads` threads (each run stays on
/// its thread), calling `done` after each with the summary so far and the
/// run; returns the summary (its wall time set) and the failing runs, by seed.
pub fn run_seeds(
    first: u64,
    n: u64,
    config: &RunConfig,
    threads: usize,
    done: impl Fn(&Summary, &RunOutcome) + Sync,
) -> (Summary, Vec<RunOutcome>) {
    let started = std::time::Instant::now();
    let next = std::sync::atomic::AtomicU64::new(0);
    let summary = std::sync::Mutex::new(Summary::default());
    let failing = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= n {
                    return;
                }
                let outcome = run(first + i, config);
                let mut s = summary.lock().expect("summary lock");
                s.add(&outcome);
                done(&s, &outcome);
                drop(s);
                if !outcome.passed() {
                    failing.lock().expect("failing lock").push(outcome);
                }
            });
        }
    });
    let mut summary = summary.into_inner().expect("summary lock");
    summary.wall = started.elapsed();
    let mut failing = failing.into_inner().expect("failing lock");
    failing.sort_by_key(|o| o.seed);
    (summary, failing)
}

/// The one command that replays a run of `config` exactly.
pub fn replay_command(seed: u64, config: &RunConfig) -> String {
    format!(
        "reservoir-sim --seed {seed} --steps {}{}",
        config.steps,
        config.flags()
    )
}
