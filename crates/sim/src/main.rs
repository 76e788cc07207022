//! `reservoir-sim`: runs interleavings of the simulation and prints the gate
//! table; or replays one seed and prints its trace.
//!
//! - `reservoir-sim --interleavings N [--seed S] [--steps M]`: seeds S..S+N,
//!   the gate table at the end, a progress bar on stderr, and for every
//!   failing seed (the first ten) the command that replays it. Exits 1 on
//!   any finding.
//! - `reservoir-sim --seed S --steps M`: that one run, its findings, the
//!   last lines of its trace (`--trace`: all of it) and its trace hash.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use reservoir_sim::{replay_command, run, Plant, RunConfig, RunOutcome, Summary};

#[derive(Parser)]
#[command(
    name = "reservoir-sim",
    version,
    about = "Deterministic simulation of Reservoir's write path under faults"
)]
struct Cli {
    /// Runs this many interleavings (seeds `seed`, `seed`+1, …) and prints the gate table.
    #[arg(long)]
    interleavings: Option<u64>,
    /// The (first) seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Rounds per interleaving, before the quiet drain.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Plants a known bug: double-refund, debt-not-carried, lost-write, index-forgets or shard-after-restart.
    #[arg(long, value_parser = parse_plant)]
    plant: Option<Plant>,
    /// One run: prints its whole trace, not only the last lines.
    #[arg(long)]
    trace: bool,
    /// Never take the log over while the old process runs on (zombie
    /// writers are on by default).
    #[arg(long)]
    no_zombies: bool,
    /// Threads running interleavings (each run stays on one thread).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn parse_plant(name: &str) -> Result<Plant, String> {
    Plant::from_name(name).ok_or_else(|| {
        let names: Vec<_> = Plant::ALL.iter().map(|p| p.name()).collect();
        format!("unknown plant {name:?}; one of {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = RunConfig {
        steps: cli.steps,
        plant: cli.plant,
        keep_trace: cli.trace && cli.interleavings.is_none(),
        zombies: !cli.no_zombies,
    };
    match cli.interleavings {
        None => one(&cli, &config),
        Some(n) => many(&cli, &config, n),
    }
}

fn one(cli: &Cli, config: &RunConfig) -> ExitCode {
    let started = Instant::now();
    let outcome = run(cli.seed, config);
    for line in &outcome.trace {
        println!("{line}");
    }
    println!(
        "seed {} steps {}: {} rounds, {:.1} min simulated, {:.2} s wall, trace hash {}",
        outcome.seed,
        outcome.steps,
        outcome.rounds,
        outcome.simulated_ms as f64 / 60_000.0,
        started.elapsed().as_secs_f64(),
        outcome.trace_hash
    );
    if outcome.passed() {
        println!("every gate passed");
        return ExitCode::SUCCESS;
    }
    print_failure(&outcome, config);
    ExitCode::FAILURE
}

fn print_failure(outcome: &RunOutcome, config: &RunConfig) {
    for f in &outcome.findings {
        println!("FINDING {}: {}", f.gate.name(), f.detail);
    }
    println!("replay: {}", replay_command(outcome.seed, config));
}

fn many(cli: &Cli, config: &RunConfig, n: u64) -> ExitCode {
    // A bar on a terminal; elsewhere (CI logs, a file) a line every 5 %.
    let terminal = std::io::stderr().is_terminal();
    let target = match terminal {
        true => ProgressDrawTarget::stderr_with_hz(2),
        false => ProgressDrawTarget::hidden(),
    };
    let every = (n / 20).max(1);
    let bar = ProgressBar::with_draw_target(Some(n), target);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} interleavings ({per_sec}, eta {eta}) {msg}",
        )
        .expect("a valid progress template")
        .progress_chars("=> "),
    );
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let summary = Mutex::new(Summary::default());
    let failing = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..cli.threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    return;
                }
                let outcome = run(cli.seed + i, config);
                let mut s = summary.lock().expect("summary lock");
                s.add(&outcome);
                if !outcome.passed() {
                    let mut failing = failing.lock().expect("failing lock");
                    failing.push(outcome);
                    bar.set_message(format!("{} failing", failing.len()));
                }
                let done = s.interleavings;
                drop(s);
                bar.inc(1);
                if !terminal && done % every == 0 {
                    let failing = failing.lock().expect("failing lock").len();
                    eprintln!(
                        "reservoir-sim: {done}/{n} interleavings, {failing} failing, {:.0} s",
                        started.elapsed().as_secs_f64()
                    );
                }
            });
        }
    });
    bar.finish_and_clear();
    let mut summary = summary.into_inner().expect("summary lock");
    summary.wall = started.elapsed();
    println!(
        "reservoir-sim --interleavings {n} --seed {} --steps {}{}",
        cli.seed,
        cli.steps,
        cli.plant
            .map_or(String::new(), |p| format!(" --plant {}", p.name()))
    );
    println!();
    print!("{}", summary.table());
    let mut failing = failing.into_inner().expect("failing lock");
    failing.sort_by_key(|o| o.seed);
    if failing.is_empty() {
        println!("\nevery gate passed in {n} interleavings");
        return ExitCode::SUCCESS;
    }
    println!("\n{} failing interleavings; the first:", failing.len());
    for outcome in failing.iter().take(10) {
        println!("- seed {}: {}", outcome.seed, first(outcome));
        println!("  replay: {}", replay_command(outcome.seed, config));
    }
    if let Some(o) = failing.first() {
        println!("\nlast steps of seed {}:", o.seed);
        for line in &o.trace {
            println!("  {line}");
        }
    }
    ExitCode::FAILURE
}

fn first(o: &RunOutcome) -> String {
    o.findings.first().map_or(String::new(), |f| {
        format!("{}: {}", f.gate.name(), f.detail)
    })
}
