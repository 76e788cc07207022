//! `reservoir-replay`: the replay and audit tool of the `replay/` folder.
//! Re-derives any state of the ledger from the event log alone (embedded log
//! directory or Kafka topic) with the core's own `try_apply`: audit statements
//! for a disputed tenant, state as of a time or position, verification and
//! rebuilding of projections, and export for analytics. See the crate docs
//! (`replay/src/lib.rs`) for the pieces.
//!
//! Exit status: 0 clean; 1 the output is complete but findings (or, for
//! `verify`, differences) were reported; 2 bad usage or an unreadable log or
//! output; 3 `--strict` stopped at the first finding.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use reservoir_log::EventReader;
use reservoir_projections::{store, Projector, ProjectorConfig};
use reservoir_replay::audit::{self, Format, Scope, Statement};
use reservoir_replay::engine::{self, Nothing};
use reservoir_replay::export::{ExportFormat, Exporter};
use reservoir_replay::{
    log_ends, progress, state, verify, Engine, Finding, Point, Source, SourceSpec, Stop,
};

/// Replay allocates a few small strings per record on one thread and frees
/// them on another (parallel decode); glibc's allocator spent over half the
/// run in malloc/free doing that, mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc's C API (linked through `mimalloc`; its `extended` feature would
// declare the same function).
extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}
/// `mi_option_arena_eager_commit` in mimalloc's `mi_option_e`.
const MI_OPTION_ARENA_EAGER_COMMIT: std::ffi::c_int = 4;

/// Arenas are committed as they are used, not all at once: replay grows its
/// heap to gigabytes, and committing whole arenas up front costs page faults
/// on memory never touched (`MIMALLOC_ARENA_EAGER_COMMIT=0`, set in code; the
/// environment variable still overrides it when given).
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none() {
        // SAFETY: called first thing in `main`, before any other thread exists
        // (mimalloc's option setters are not thread safe).
        unsafe { mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
    }
}

const AFTER_HELP: &str = "\
Bad input. A record that does not decode, a gap in a partition's sequence
numbers, a capacity move whose halves do not pair in every dimension, a shard
reminted twice or from a partition that did not issue it, or an event the core
refuses (broken conservation, amounts that do not
add up, an illegal transition) is a finding, reported with its log position
(log partition and offset) and ledger partition. With --strict the run stops at
the first finding (exit 3). Without it, every finding is reported and the run
continues, which means: an undecodable entry is skipped; after a gap, the
partition accepts the event's sequence and goes on; a refused event is skipped
(the partition keeps its state from before it, and the gap it leaves is not
reported twice); later events of that partition are still applied, so they may
report further findings of their own. The exit status is then 1.

Points (--from, --to, --as-of): OFFSET (log partition 0, the embedded log),
LP:OFFSET[,LP:OFFSET...] (inclusive; log partitions not named are not limited),
an RFC 3339 time like 2026-07-19T14:00:00Z, or <n>ms since the Unix epoch
(compared with each event's writer-assigned time).";

#[derive(Parser, Debug)]
#[command(name = "reservoir-replay", version, about = "Replay and audit the Reservoir event log", after_help = AFTER_HELP)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    /// Stop at the first finding (exit 3) instead of reporting all and continuing.
    #[arg(long, global = true)]
    strict: bool,
    /// No progress bar (it is shown only on a terminal anyway).
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
struct LogArgs {
    /// The embedded log: the server's --data-dir or its `log` directory. Opened
    /// as a read-only RocksDB secondary, so the server may keep running.
    #[arg(long, global = true, env = "RESERVOIR_LOG_DIR")]
    log_dir: Option<PathBuf>,
    /// Kafka bootstrap servers (read the topic instead of an embedded log).
    #[arg(
        long,
        global = true,
        env = "RESERVOIR_BROKERS",
        conflicts_with = "log_dir"
    )]
    brokers: Option<String>,
    #[arg(long, global = true, env = "RESERVOIR_TOPIC", default_value = reservoir_log::kafka::TOPIC_DEFAULT)]
    topic: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// A statement for one tenant: every event, the change of every
    /// conservation term, running balances, the check after each event, and a summary.
    Audit {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        route: Option<String>,
        /// First row printed (inclusive); the history before it is still replayed.
        #[arg(long)]
        from: Option<Point>,
        /// Last row printed (inclusive); replay stops there. Statements
        /// that meet overlap by the events at the shared point: end one
        /// 1 ms (or one offset) before the next one's --from.
        #[arg(long)]
        to: Option<Point>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
        /// Output file (standard output when absent; `html` wants a file).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Rows an HTML statement holds at most (it is drawn at the end).
        #[arg(long, default_value_t = audit::HTML_ROWS_MAX_DEFAULT)]
        html_rows_max: usize,
        /// Cut the statement in one dimension (requests, input_tokens,
        /// output_tokens, tokens): its terms in every partition that limits
        /// it. Absent: each partition's primary dimension.
        #[arg(long, value_parser = parse_dimension)]
        dimension: Option<reservoir_core::Dimension>,
    },
    /// Balances and reservations as they stood at a point, as deterministic
    /// JSON (the bytes the live projection stores).
    State {
        /// Inclusive; the end of the log when absent.
        #[arg(long)]
        as_of: Option<Point>,
        /// Print the same document from a projection database instead of the log.
        #[arg(long, value_name = "DIR")]
        from_projections: Option<PathBuf>,
    },
    /// Re-derive every partition and compare with a projection database, up to
    /// where it has consumed the log. Differences: JSON lines (partition, term,
    /// expected, found) on stdout; exit 1.
    Verify {
        #[arg(long, value_name = "DIR")]
        projections: PathBuf,
        /// Compare balances only, not every reservation record.
        #[arg(long)]
        balances_only: bool,
        /// Differences printed at most (all are counted).
        #[arg(long, default_value_t = 1000)]
        max_differences: usize,
    },
    /// Build fresh projections from the log with the projector's own code.
    Rebuild {
        /// A new (absent or empty) directory.
        #[arg(long, value_name = "DIR")]
        into: PathBuf,
    },
    /// The events of a range as JSON lines or an Avro object container file.
    Export {
        #[arg(long)]
        from: Option<Point>,
        #[arg(long)]
        to: Option<Point>,
        #[arg(long, value_enum, default_value = "jsonl")]
        format: ExportFormat,
        /// Output file (standard output when absent).
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(clean) => {
            if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(Stop::Strict(finding)) => {
            eprintln!("reservoir-replay: stopped (--strict) at the first finding: {finding}");
            ExitCode::from(3)
        }
        Err(Stop::Error(e)) => {
            eprintln!("reservoir-replay: {e}");
            ExitCode::from(2)
        }
    }
}

fn report_findings(findings: &[Finding]) {
    for f in findings {
        eprintln!("finding: {f}");
    }
    if !findings.is_empty() {
        eprintln!("reservoir-replay: {} finding(s)", findings.len());
    }
}

fn spec(log: &LogArgs) -> Result<SourceSpec, Stop> {
    match (&log.log_dir, &log.brokers) {
        (Some(dir), None) => Ok(SourceSpec::Embedded {
            log_dir: dir.clone(),
        }),
        (None, Some(brokers)) => Ok(SourceSpec::Kafka {
            brokers: brokers.clone(),
            topic: log.topic.clone(),
        }),
        _ => Err(Stop::Error(
            "name the log: --log-dir DIR (embedded) or --brokers HOST:PORT [--topic T]".into(),
        )),
    }
}

fn output(path: Option<&PathBuf>) -> Result<Output, Stop> {
    let Some(path) = path else {
        return Ok(Output {
            writer: Box::new(BufWriter::new(std::io::stdout().lock())),
            file: None,
        });
    };
    let mut partial = path.clone().into_os_string();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let file = std::fs::File::create(&partial)
        .map_err(|e| Stop::Error(format!("cannot create {}: {e}", path.display())))?;
    Ok(Output {
        writer: Box::new(BufWriter::new(file)),
        file: Some((partial, path.clone())),
    })
}

/// Where a command writes. A file (`-o`) is written beside its name
/// (`NAME.partial`) and renamed once complete: a run that fails part way
/// leaves no truncated statement or export behind, and an older file of that
/// name stays as it was.
struct Output {
    writer: Box<dyn Write>,
    /// (written to, renamed to)
    file: Option<(PathBuf, PathBuf)>,
}

impl Output {
    /// Flushes, and moves a file to its name.
    fn finish(mut self) -> Result<(), Stop> {
        self.writer.flush()?;
        if let Some((partial, path)) = self.file.take() {
            std::fs::rename(&partial, &path).map_err(|e| {
                Stop::Error(format!(
                    "cannot move {} to {}: {e}",
                    partial.display(),
                    path.display()
                ))
            })?;
        }
        Ok(())
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.flush()
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Some((partial, _)) = self.file.take() {
            let _ = std::fs::remove_file(partial);
        }
    }
}

/// Ok(true) clean, Ok(false) findings or differences reported.
async fn run(cli: Cli) -> Result<bool, Stop> {
    let started = std::time::Instant::now();
    if let Command::Audit {
        format: Format::Html,
        output: None,
        ..
    } = &cli.command
    {
        if std::io::stdout().is_terminal() {
            return Err(Stop::Error(
                "an HTML statement is a file: name it with -o FILE (or redirect standard output)"
                    .into(),
            ));
        }
    }
    if let Command::State {
        from_projections: Some(dir),
        ..
    } = &cli.command
    {
        let mut out = output(None)?;
        state::write_projection_document(&mut out, dir)?;
        out.flush()?;
        return Ok(true);
    }
    match &cli.command {
        Command::Audit { from, to, .. } | Command::Export { from, to, .. } => {
            check_range(from.as_ref(), to.as_ref())?
        }
        _ => {}
    }
    // verify: the projection database opens (RocksDB replays its WAL) while
    // the log does (likewise).
    let projections_opening = match &cli.command {
        Command::Verify { projections, .. } => {
            let dir = projections.clone();
            Some(std::thread::spawn(move || verify::open(&dir)))
        }
        _ => None,
    };
    let source = Source::open(&spec(&cli.log)?)
        .await
        .map_err(|e| Stop::Error(e.to_string()))?;
    let ends = log_ends(&source).await?;
    let log_opened = started.elapsed();
    match cli.command {
        Command::Audit {
            tenant,
            route,
            from,
            to,
            format,
            output: path,
            html_rows_max,
            dimension,
        } => {
            let limit = Point::as_upper(to.as_ref(), &ends);
            let mut engine = Engine::new(source.log_partitions(), cli.strict, limit.until_ms);
            engine.filter = Box::new(audit::filter(tenant.clone(), route.clone()));
            let mut out = output(path.as_ref())?;
            let named = match &route {
                Some(route) => format!("tenant {tenant} on route {route}"),
                None => format!("tenant {tenant}"),
            };
            let scope = Scope {
                tenant,
                route,
                from,
                to,
                dimension,
            };
            let mut statement = Statement::new(&mut out, format, scope);
            statement.html_rows_max = html_rows_max;
            let bar = progress::bar(limit.ends.iter().sum(), cli.quiet);
            let result = engine::run(&source, &mut engine, &limit, &mut statement, &|n| {
                bar.inc(n)
            })
            .await;
            bar.finish_and_clear();
            result?;
            statement.finish(&engine.findings);
            if let Some(e) = statement.error.take() {
                return Err(e.into());
            }
            if statement.primaries.len() > 1 {
                // Refused before the output is complete: no statement whose
                // totals add requests to tokens is left behind.
                let kinds: Vec<&str> = statement.primaries.iter().map(|d| d.name()).collect();
                return Err(Stop::Error(format!(
                    "the partitions of {named} count in {} (their primary dimensions): a statement adds one kind of unit; cut it with --dimension, once for each",
                    kinds.join(" and ")
                )));
            }
            if statement.summary.partitions.is_empty() {
                // An empty statement is right for an idle tenant and wrong
                // for a misspelt one: say which it may be.
                eprintln!("no events of {named} in the log (up to --to): the statement is empty; check the name");
            }
            drop(statement);
            out.finish()?;
            report_findings(&engine.findings);
            Ok(engine.findings.is_empty())
        }
        Command::State { as_of, .. } => {
            let limit = Point::as_upper(as_of.as_ref(), &ends);
            let mut engine = Engine::new(source.log_partitions(), cli.strict, limit.until_ms);
            let bar = progress::bar(limit.ends.iter().sum(), cli.quiet);
            let result =
                engine::run(&source, &mut engine, &limit, &mut Nothing, &|n| bar.inc(n)).await;
            bar.finish_and_clear();
            result?;
            let findings = std::mem::take(&mut engine.findings);
            let (balances, reservations) = state::entries_of(&mut engine);
            let mut out = output(None)?;
            state::write_document(&mut out, &balances, &reservations)?;
            out.flush()?;
            report_findings(&findings);
            Ok(findings.is_empty())
        }
        Command::Verify {
            projections,
            balances_only,
            max_differences,
        } => {
            let (db, secondary) = match projections_opening {
                Some(opening) => opening.join().expect("projection opener")?,
                None => verify::open(&projections)?,
            };
            let (consumed, mut differences) = verify::projection_ends(&db, &ends)?;
            let projections_opened = started.elapsed();
            let limit = engine::Limit {
                ends: consumed,
                until_ms: None,
            };
            let mut engine = Engine::new(source.log_partitions(), cli.strict, None);
            let bar = progress::bar(limit.ends.iter().sum(), cli.quiet);
            let result =
                engine::run(&source, &mut engine, &limit, &mut Nothing, &|n| bar.inc(n)).await;
            bar.finish_and_clear();
            result?;
            let replayed = started.elapsed();
            let findings = std::mem::take(&mut engine.findings);
            let events = engine.stats.events;
            let mut expected = verify::Expected::of(&mut engine);
            // What the projection's retention rule deleted is not expected of it.
            if let Some(before) = verify::pruned_before_ms(&db)? {
                expected.without_pruned(before);
            }
            let encoded = started.elapsed();
            verify::compare_column(
                "balance",
                &expected.balances,
                &db,
                store::BALANCES,
                &mut differences,
            )?;
            let reservations = if balances_only {
                0
            } else {
                verify::compare_reservations(&expected, &db, &mut differences)?
            };
            let compared = started.elapsed();
            let mut out = output(None)?;
            for d in differences.iter().take(max_differences) {
                serde_json::to_writer(&mut out, d).map_err(|e| Stop::Error(e.to_string()))?;
                out.write_all(b"\n")?;
            }
            out.flush()?;
            drop(out);
            report_findings(&findings);
            let total = started.elapsed();
            if !cli.quiet {
                let s = |d: std::time::Duration| d.as_secs_f64();
                let replay = s(replayed) - s(projections_opened);
                eprintln!(
                    "verify: {} partitions, {} reservations, {events} events; replay {:.2} s ({:.0} events/s), total {:.2} s; {} difference(s); phases: open log {:.2} s, open projections (concurrently) {:.2} s more, replay {:.2} s, encode balances {:.2} s, compare (encoding reservations) {:.2} s, output {:.2} s",
                    expected.balances.len(),
                    reservations,
                    replay,
                    events as f64 / replay.max(1e-9),
                    s(total),
                    differences.len(),
                    s(log_opened),
                    s(projections_opened) - s(log_opened),
                    replay,
                    s(encoded) - s(replayed),
                    s(compared) - s(encoded),
                    s(total) - s(compared),
                );
            }
            // Everything below is only memory: leave it to the process exit
            // (freeing millions of strings and two databases' memtables costs
            // seconds). The secondary instances' temporary directories are
            // still removed.
            let diffs_empty = differences.is_empty();
            std::mem::forget((expected, engine, differences));
            verify::leak_db(db, secondary);
            source.leak();
            Ok(findings.is_empty() && diffs_empty)
        }
        Command::Rebuild { into } => {
            if into.exists()
                && std::fs::read_dir(&into)
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(true)
            {
                return Err(Stop::Error(format!(
                    "{} exists and is not empty: rebuild writes a fresh projection",
                    into.display()
                )));
            }
            let db = store::open(&into).map_err(|e| Stop::Error(e.to_string()))?;
            let source = Arc::new(source);
            let mut projector = Projector::open(source, db.clone(), ProjectorConfig::default())
                .map_err(|e| Stop::Error(e.to_string()))?;
            let bar = progress::bar(ends.iter().sum(), cli.quiet);
            loop {
                let at: u64 = projector.positions().iter().sum();
                if projector
                    .positions()
                    .iter()
                    .zip(&ends)
                    .all(|(at, end)| at >= end)
                {
                    break;
                }
                let outcome = projector
                    .step_toward(&ends)
                    .await
                    .map_err(|e| Stop::Error(format!("the projector stopped: {e}")))?;
                let now: u64 = projector.positions().iter().sum();
                bar.inc(now - at);
                if outcome.entries == 0 {
                    break;
                }
            }
            bar.finish_and_clear();
            let findings = projector
                .projections()
                .at()
                .findings()
                .map_err(|e| Stop::Error(e.to_string()))?;
            for f in &findings {
                eprintln!(
                    "finding (partition quarantined by the projector): log partition {} offset {} partition {} sequence {}: {}",
                    f.log_partition, f.offset, f.key, f.sequence, f.error
                );
            }
            if let (true, Some(f)) = (cli.strict, findings.first()) {
                return Err(Stop::Strict(Finding {
                    log_partition: f.log_partition,
                    offset: f.offset,
                    partition: Some(f.key.to_string()),
                    event_index: Some(f.event_index),
                    sequence: Some(f.sequence),
                    kind: "refused",
                    detail: f.error.clone(),
                }));
            }
            db.flush().map_err(|e| Stop::Error(e.to_string()))?;
            Ok(findings.is_empty())
        }
        Command::Export {
            from,
            to,
            format,
            output: path,
        } => {
            let limit = Point::as_upper(to.as_ref(), &ends);
            let mut engine = Engine::new(source.log_partitions(), cli.strict, limit.until_ms);
            let mut out = output(path.as_ref())?;
            let mut exporter = Exporter::new(&mut out, format, from, to);
            let bar = progress::bar(limit.ends.iter().sum(), cli.quiet);
            let result =
                engine::run(&source, &mut engine, &limit, &mut exporter, &|n| bar.inc(n)).await;
            bar.finish_and_clear();
            result?;
            let (records, events) = (exporter.records, exporter.events);
            exporter.finish().map_err(Stop::Error)?;
            out.finish()?;
            report_findings(&engine.findings);
            if !cli.quiet {
                eprintln!("export: {records} records, {events} events");
            }
            Ok(engine.findings.is_empty())
        }
    }
}

/// Refuses a `--from` after `--to` (same log partition, or both times): it
/// would print an empty statement as if nothing had happened.
fn check_range(from: Option<&Point>, to: Option<&Point>) -> Result<(), Stop> {
    let inverted = match (from, to) {
        (Some(Point::TimeMs(from)), Some(Point::TimeMs(to))) => from > to,
        (Some(Point::Positions(from)), Some(Point::Positions(to))) => from
            .iter()
            .any(|(lp, offset)| to.get(lp).is_some_and(|end| offset > end)),
        _ => false,
    };
    let shown = |p: Option<&Point>| match p {
        Some(Point::TimeMs(t)) => format!("{t}ms"),
        Some(Point::Positions(map)) => map
            .iter()
            .map(|(lp, offset)| format!("{lp}:{offset}"))
            .collect::<Vec<_>>()
            .join(","),
        None => String::new(),
    };
    match inverted {
        true => Err(Stop::Error(format!(
            "--from {} is after --to {}: nothing is between them",
            shown(from),
            shown(to)
        ))),
        false => Ok(()),
    }
}

/// `--dimension`: one of the dimension names.
fn parse_dimension(name: &str) -> Result<reservoir_core::Dimension, String> {
    reservoir_core::Dimension::from_name(name).ok_or_else(|| {
        format!("{name:?} is not a dimension: requests, input_tokens, output_tokens or tokens")
    })
}
