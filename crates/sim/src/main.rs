//! `reservoir-sim`: runs interleavings of the simulation and prints the gate
//! table; or replays one seed and prints its trace.
//!
//! - `reservoir-sim --interleavings N [--seed S] [--steps M]`: seeds S..S+N,
//!   the gate table at the end, a progress bar on stderr, and for every
//!   failing seed (the first ten) the command that replays it. Exits 1 on
//!   any finding.
//! - `reservoir-sim --seed S --steps M`: that one run, its findings, the
//!   last lines of its trace (`--trace`: all of it) and its trace hash.
//! - `--save FILE` with `--interleavings`: the run also written as a chunk
//!   of the release gate (`reservoir_sim::chunk`); `--merge FILE...`: chunks
//!   merged into one gate table; `--import-table FILE --save FILE`: a gate
//!   table printed before chunks were saved, read back into a chunk.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use reservoir_sim::chunk::{self, Chunk};
use reservoir_sim::cli::Cli;
use reservoir_sim::{replay_command, run, run_seeds, RunConfig, RunOutcome};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = cli.config();
    if !cli.merge.is_empty() {
        return merge(&cli.merge);
    }
    if let Some(table) = &cli.import_table {
        return import(table, &cli);
    }
    match cli.interleavings {
        None => one(&cli, &config),
        Some(n) => many(&cli, &config, n),
    }
}

/// A line of the command's output, into a `String` that [`emit`] writes.
macro_rules! say {
    ($out:expr) => { $out.push('\n') };
    ($out:expr, $($arg:tt)*) => {
        writeln!($out, $($arg)*).expect("writing to a String cannot fail")
    };
}

/// Writes the command's output and returns its exit code. A reader that
/// went away (`reservoir-sim --merge FILE | head`) leaves the code as it
/// was: the verdict is the gates', not the pipe's.
fn emit(out: &str, code: ExitCode) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => code,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => code,
        Err(e) => error(format!("cannot write the output: {e}")),
    }
}

/// Prints `message` as the command's error and fails.
fn error(message: String) -> ExitCode {
    eprintln!("reservoir-sim: {message}");
    ExitCode::from(2)
}

fn write_chunk(path: &Path, chunk: &Chunk) -> Result<(), String> {
    let json = serde_json::to_vec(chunk).expect("a chunk serializes");
    std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn import(table: &Path, cli: &Cli) -> ExitCode {
    let save = cli.save.as_deref().expect("clap requires --save");
    let imported = std::fs::read_to_string(table)
        .map_err(|e| format!("cannot read {}: {e}", table.display()))
        .and_then(|text| Chunk::from_table(&text, cli.source.clone()))
        .map_err(|e| format!("{}: {e}", table.display()))
        .and_then(|chunk| write_chunk(save, &chunk).map(|()| chunk));
    match imported {
        Ok(chunk) => {
            let out = format!("{}: seeds {:?}\n", save.display(), chunk.seeds());
            emit(&out, ExitCode::SUCCESS)
        }
        Err(e) => error(e),
    }
}

fn merge(files: &[PathBuf]) -> ExitCode {
    let mut chunks = Vec::new();
    for path in files {
        let read = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| serde_json::from_slice::<Chunk>(&bytes).map_err(|e| e.to_string()));
        match read {
            Ok(c) => chunks.push(c),
            Err(e) => return error(format!("{}: {e}", path.display())),
        }
    }
    let merged = match chunk::merge(chunks) {
        Ok(m) => m,
        Err(e) => return error(e),
    };
    let ranges: Vec<String> = merged
        .ranges
        .iter()
        .map(|r| format!("{}–{}", r.start, r.end - 1))
        .collect();
    let mut out = String::new();
    say!(
        out,
        "{} interleavings in {} chunks, seeds {}",
        merged.summary.interleavings,
        merged.chunks.len(),
        ranges.join(", ")
    );
    say!(out);
    say!(out, "| seeds | interleavings | source | runs digest |");
    say!(out, "| --- | ---: | --- | --- |");
    for c in &merged.chunks {
        let seeds = c.seeds();
        say!(
            out,
            "| {}–{} | {} | {} | {} |",
            seeds.start,
            seeds.end - 1,
            c.interleavings,
            c.source,
            c.runs_digest.as_deref().unwrap_or("- (read from a table)")
        );
    }
    say!(out);
    out.push_str(&merged.summary.table());
    if merged.summary.findings() == 0 {
        say!(
            out,
            "\nevery gate passed in {} interleavings",
            merged.summary.interleavings
        );
        return emit(&out, ExitCode::SUCCESS);
    }
    say!(out, "\nfailing interleavings, the first:");
    for (seed, finding) in &merged.summary.failures {
        say!(out, "- seed {seed}: {finding}");
    }
    emit(&out, ExitCode::FAILURE)
}

fn one(cli: &Cli, config: &RunConfig) -> ExitCode {
    let started = Instant::now();
    let outcome = run(cli.seed, config);
    let mut out = String::new();
    for line in &outcome.trace {
        say!(out, "{line}");
    }
    say!(
        out,
        "seed {} steps {}: {} rounds, {:.1} min simulated, {:.2} s wall, trace hash {}",
        outcome.seed,
        outcome.steps,
        outcome.rounds,
        outcome.simulated_ms as f64 / 60_000.0,
        started.elapsed().as_secs_f64(),
        outcome.trace_hash
    );
    if outcome.passed() {
        say!(out, "every gate passed");
        return emit(&out, ExitCode::SUCCESS);
    }
    for f in &outcome.findings {
        say!(out, "FINDING {}: {}", f.gate.name(), f.detail);
    }
    say!(out, "replay: {}", replay_command(outcome.seed, config));
    emit(&out, ExitCode::FAILURE)
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
    let failing_count = AtomicU64::new(0);
    let (mut summary, failing) = run_seeds(cli.seed, n, config, cli.threads, |s, outcome| {
        if !outcome.passed() {
            let failing = failing_count.fetch_add(1, Ordering::SeqCst) + 1;
            bar.set_message(format!("{failing} failing"));
        }
        bar.inc(1);
        let done = s.interleavings;
        if !terminal && done % every == 0 {
            eprintln!(
                "reservoir-sim: {done}/{n} interleavings, {} failing, {:.0} s",
                failing_count.load(Ordering::SeqCst),
                started.elapsed().as_secs_f64()
            );
        }
    });
    bar.finish_and_clear();
    summary.wall = started.elapsed();
    if let Some(path) = &cli.save {
        let chunk = Chunk::new(&summary, cli.seed, config, cli.source.clone());
        if let Err(e) = write_chunk(path, &chunk) {
            return error(e);
        }
    }
    let mut out = String::new();
    say!(
        out,
        "reservoir-sim --interleavings {n} --seed {} --steps {}{}",
        cli.seed,
        cli.steps,
        config.flags()
    );
    say!(out, "runs digest {}", summary.runs_digest());
    say!(out);
    out.push_str(&summary.table());
    if failing.is_empty() {
        say!(out, "\nevery gate passed in {n} interleavings");
        return emit(&out, ExitCode::SUCCESS);
    }
    say!(out, "\n{} failing interleavings; the first:", failing.len());
    for outcome in failing.iter().take(10) {
        say!(out, "- seed {}: {}", outcome.seed, first(outcome));
        say!(out, "  replay: {}", replay_command(outcome.seed, config));
    }
    if let Some(o) = failing.first() {
        say!(out, "\nlast steps of seed {}:", o.seed);
        for line in &o.trace {
            say!(out, "  {line}");
        }
    }
    emit(&out, ExitCode::FAILURE)
}

fn first(o: &RunOutcome) -> String {
    o.findings.first().map_or(String::new(), |f| {
        format!("{}: {}", f.gate.name(), f.detail)
    })
}
