//! `reservoir-loadgen`: the command line of the load benchmark.
//!
//! - `run`: one bounded run against `reservoir` (HTTP) or `redis` (Lua), printing
//!   a table and, as the last line, the JSON summary (also appended to
//!   `--json-out`). Exits 2 when the run had errors.
//! - `publish`: only publishes the policies `run` would publish (for another
//!   client, such as `wrk` or `redis-benchmark`); for Redis it also loads the
//!   scripts and prints their digests.
//! - `report`: the Markdown comparison of several JSON result lines.
//! - `wait`: waits (bounded) until a target answers (`/readyz` or `PING`).
//! - `free-port`: prints a free TCP port on 127.0.0.1.
//! - `fsync-probe`: times small appends + fdatasync on a directory's disk.

use clap::{Parser, Subcommand, ValueEnum};
use reservoir_loadgen::redis_ledger::BucketPolicy;
use reservoir_loadgen::report::{markdown, native_markdown, parse_lines, parse_native, Labels};
use reservoir_loadgen::run::{fresh_run_id, publish, run, Dims, RunConfig, Stop, Target};
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "reservoir-loadgen",
    version,
    about = "Load benchmark for Reservoir and a Redis + Lua baseline"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    Reservoir,
    Redis,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run reserve -> start -> settle cycles against one target.
    Run(RunArgs),
    /// Publish the policies `run` would publish, and nothing else (takes the
    /// same arguments; only the target, subjects and policy ones matter). For
    /// Redis, also load the scripts and print `NAME SHA1` for each.
    Publish(RunArgs),
    /// Print the Markdown comparison of JSON result lines.
    Report {
        /// File of JSON lines written by `run --json-out`.
        file: String,
        /// File of native-client measurement lines (`scripts/bench-http`'s
        /// targets `reservoir-wrk`, `redis-*-native`): adds their table and ratios.
        #[arg(long)]
        native: Option<String>,
        #[arg(long, default_value = "reservoir")]
        reservoir_label: String,
        #[arg(long, default_value = "redis-always")]
        redis_always_label: String,
        #[arg(long, default_value = "redis-none")]
        redis_none_label: String,
    },
    /// Wait until the target answers, at most --timeout-secs.
    Wait {
        #[arg(long, value_enum)]
        target: Kind,
        /// Base URL of the target.
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 60.0)]
        timeout_secs: f64,
    },
    /// Print a free TCP port on 127.0.0.1.
    FreePort,
    /// Time `count` small appends each followed by fdatasync in DIR (the disk the
    /// durable targets write to) and print p50/p99.
    FsyncProbe {
        #[arg(long)]
        dir: String,
        #[arg(long, default_value_t = 200)]
        count: usize,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The system under test.
    #[arg(long, value_enum)]
    target: Kind,
    /// Base URL: http://127.0.0.1:8080 for reservoir, redis://127.0.0.1:6379 for redis.
    #[arg(long)]
    url: Option<String>,
    /// Name of this run in reports (default: the target).
    #[arg(long)]
    label: Option<String>,
    /// Concurrent clients, one connection each.
    #[arg(long, default_value_t = 64, env = "LOADGEN_CLIENTS")]
    clients: usize,
    /// Subjects (tenants) the clients are spread over.
    #[arg(long, default_value_t = 8, env = "LOADGEN_SUBJECTS")]
    subjects: usize,
    /// Measure for this long after warm-up (ignored with --cycles).
    #[arg(long, default_value_t = 10.0, env = "LOADGEN_DURATION_SECS")]
    duration_secs: f64,
    /// Run exactly this many cycles instead of a fixed duration.
    #[arg(long, env = "LOADGEN_CYCLES")]
    cycles: Option<u64>,
    /// Unmeasured warm-up, seconds.
    #[arg(long, default_value_t = 2.0, env = "LOADGEN_WARMUP_SECS")]
    warmup_secs: f64,
    /// Hard cap on the whole run, seconds.
    #[arg(long, default_value_t = 600.0)]
    max_secs: f64,
    /// Stop early after this many errors.
    #[arg(long, default_value_t = 10_000)]
    max_errors: u64,
    /// Units reserved per cycle.
    #[arg(long, default_value_t = 600)]
    units: u64,
    /// Units settled per cycle.
    #[arg(long, default_value_t = 180)]
    actual_units: u64,
    /// 1: a one-dimension policy (`--units`, `--actual-units`); 3: requests,
    /// input tokens and output tokens, reserved from `--counted-input-tokens`
    /// and `--max-tokens`, settled from the usage (`--reported-input-tokens`,
    /// `--output-tokens`).
    #[arg(long, default_value = "1", value_parser = ["1", "3"])]
    dimensions: String,
    /// Three dimensions: input tokens counted before the call.
    #[arg(long, default_value_t = 500)]
    counted_input_tokens: u64,
    /// Three dimensions: the request's max_tokens (the output reserved).
    #[arg(long, default_value_t = 1_500)]
    max_tokens: u64,
    /// Three dimensions: input tokens the provider reported, at settle.
    #[arg(long, default_value_t = 480)]
    reported_input_tokens: u64,
    /// Three dimensions: output tokens the provider reported, at settle.
    #[arg(long, default_value_t = 450)]
    output_tokens: u64,
    #[arg(long, default_value = "tenant-")]
    subject_prefix: String,
    /// Reservoir in cluster mode: only subjects whose log partition the node
    /// at --url owns (from its `GET /v1/cluster/node`), as a gateway that
    /// knows the topic's placement would send them; nothing is forwarded.
    #[arg(long)]
    owned_only: bool,
    #[arg(long, default_value = "chat")]
    route: String,
    #[arg(long, default_value = "2026-11")]
    epoch: String,
    /// Do not publish policies first (they exist already).
    #[arg(long)]
    no_publish: bool,
    /// Process id of the server (on this machine), to report its CPU use.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Append the JSON summary line to this file.
    #[arg(long)]
    json_out: Option<String>,
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

/// The run `a` describes, and where its JSON line goes.
fn config(a: RunArgs) -> (RunConfig, Option<String>) {
    let target = match a.target {
        Kind::Reservoir => Target::Reservoir {
            url: a.url.unwrap_or_else(|| "http://127.0.0.1:8080".into()),
        },
        Kind::Redis => Target::Redis {
            url: a.url.unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
        },
    };
    let cfg = RunConfig {
        label: a.label.unwrap_or_else(|| target.kind().to_string()),
        target,
        clients: a.clients,
        subjects: a.subjects,
        subject_prefix: a.subject_prefix,
        owned_only: a.owned_only,
        subject_names: Vec::new(),
        route: a.route,
        epoch: a.epoch,
        units: a.units,
        actual_units: a.actual_units,
        dims: (a.dimensions == "3").then_some(Dims {
            counted_input_tokens: a.counted_input_tokens,
            max_tokens: a.max_tokens,
            reported_input_tokens: a.reported_input_tokens,
            output_tokens: a.output_tokens,
        }),
        stop: match a.cycles {
            Some(n) => Stop::Cycles(n),
            None => Stop::After(secs(a.duration_secs)),
        },
        warmup: secs(a.warmup_secs),
        max_time: secs(a.max_secs),
        max_errors: a.max_errors,
        policy: BucketPolicy::default(),
        publish: !a.no_publish,
        run_id: fresh_run_id(),
        server_pid: a.server_pid,
    };
    (cfg, a.json_out)
}

async fn publish_cmd(a: RunArgs) -> Result<ExitCode, String> {
    let (cfg, _) = config(a);
    if let Some(scripts) = publish(&cfg).await? {
        for (name, sha) in scripts.digests() {
            println!("{name} {sha}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_cmd(a: RunArgs) -> Result<ExitCode, String> {
    let (cfg, json_out) = config(a);
    let summary = run(cfg).await?;
    let line = summary.json_line();
    // A closed stdout (e.g. piped into `head`) must not lose the --json-out line.
    let _ = writeln!(std::io::stdout(), "{}{line}", summary.table());
    if let Some(path) = json_out {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("opening {path}: {e}"))?;
        writeln!(f, "{line}").map_err(|e| format!("writing {path}: {e}"))?;
    }
    Ok(if summary.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

async fn wait_cmd(kind: Kind, url: String, timeout: Duration) -> Result<ExitCode, String> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        let ready = match kind {
            Kind::Reservoir => {
                let mut c = reservoir_loadgen::http::HttpConn::new(
                    reservoir_loadgen::http::authority_of(&url)?,
                );
                match c.get("/readyz").await {
                    Ok((s, _)) if s.is_success() => true,
                    Ok((s, _)) => {
                        last = format!("/readyz answered {s}");
                        false
                    }
                    Err(e) => {
                        last = e.to_string();
                        false
                    }
                }
            }
            Kind::Redis => {
                let attempt = async {
                    let client = redis::Client::open(url.as_str())?;
                    let mut conn = client.get_multiplexed_async_connection().await?;
                    redis::cmd("PING").query_async::<String>(&mut conn).await
                };
                match attempt.await {
                    Ok(_) => true,
                    Err(e) => {
                        last = e.to_string();
                        false
                    }
                }
            }
        };
        if ready {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{url} not ready after {timeout:?}: {last}"))
}

fn fsync_probe(dir: &str, count: usize) -> Result<ExitCode, String> {
    let path = std::path::Path::new(dir).join("fsync-probe.tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    let mut times = Vec::with_capacity(count.max(1));
    for _ in 0..count.max(1) {
        f.write_all(&[b'x'; 256]).map_err(|e| e.to_string())?;
        let t = Instant::now();
        f.sync_data().map_err(|e| e.to_string())?;
        times.push(t.elapsed());
    }
    let _ = std::fs::remove_file(&path);
    times.sort();
    let q = |p: f64| times[((times.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
    println!(
        "fdatasync after a 256 B append, {} times: p50 {:.2} ms, p99 {:.2} ms",
        times.len(),
        q(0.50),
        q(0.99)
    );
    Ok(ExitCode::SUCCESS)
}

fn report_cmd(file: &str, native: Option<&str>, labels: &Labels<'_>) -> Result<ExitCode, String> {
    let read = |f: &str| std::fs::read_to_string(f).map_err(|e| format!("reading {f}: {e}"));
    let runs = parse_lines(&read(file)?)?;
    let mut md = markdown(&runs, labels);
    if let Some(f) = native {
        md.push('\n');
        md.push_str(&native_markdown(&parse_native(&read(f)?)?, labels));
    }
    let _ = write!(std::io::stdout(), "{md}");
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().cmd {
        Cmd::Run(a) => run_cmd(a).await,
        Cmd::Publish(a) => publish_cmd(a).await,
        Cmd::Report {
            file,
            native,
            reservoir_label,
            redis_always_label,
            redis_none_label,
        } => report_cmd(
            &file,
            native.as_deref(),
            &Labels {
                reservoir: &reservoir_label,
                redis_always: &redis_always_label,
                redis_none: &redis_none_label,
                baseline: Some("baseline"),
            },
        ),
        Cmd::Wait {
            target,
            url,
            timeout_secs,
        } => wait_cmd(target, url, secs(timeout_secs)).await,
        Cmd::FsyncProbe { dir, count } => fsync_probe(&dir, count),
        Cmd::FreePort => std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| {
                println!("{}", a.port());
                ExitCode::SUCCESS
            })
            .map_err(|e| e.to_string()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("reservoir-loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}
