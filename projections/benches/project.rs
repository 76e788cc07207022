//! Projector throughput on the embedded log, beside the cost of reading the log.
//!
//! `cargo bench -p reservoir-projections --bench project` builds an embedded log
//! of server-shaped traffic (untimed): reserve → start → settle cycles over 18
//! partitions (6 tenants × 3 routes), settles reporting usage (model, output and
//! input tokens, so digests, efficiency and input drift all get work), some
//! releases, refusals (requests over the policy's limit everywhere, a tenant
//! whose budget is too small for its traffic, and its debt). One record per
//! command, appended in batches of 512 records, like the writer. About 200,000
//! events by default; `PROJECT_BENCH_EVENTS=n` changes that. Time is data: the
//! commands' `now` is a simulated clock, 1 ms a tick.
//!
//! Then, in rounds (3 of them, each measurement once per round, so all three
//! see the same load on a shared machine):
//! - read: `EventLog::read` of the whole log in chunks of 256 entries, decoded
//!   (the reads a projector makes, alone);
//! - catch_up: `Projector::catch_up` into an empty projection database with
//!   `ProjectorConfig::default()` (WAL-less batches, 256 entries a step);
//! - catch_up, sync: the same with `sync_writes: true`.
//!
//! Reported: medians of events/s, and each catch_up's ratio to the read rate as
//! the median of the per-round ratios. Every projection is checked after its
//! run (untimed): every partition conserves and equals the writer's own state,
//! roll-ups, efficiency histograms, digests, input drift and refusals count
//! exactly what the log holds, no findings. The report goes to stdout and
//! `bench-results/projector.md`.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reservoir_core::{
    apply, decide, refusal_event, Command, EventBody, OperationId, Partition, PartitionKey, Policy,
    RefillRule, RequestDigest, ReservationId, Usage,
};
use reservoir_log::embedded::EmbeddedLog;
use reservoir_log::{Claim, EventLog, EventReader, LogEntry, Record};
use reservoir_projections::projector::stored_partition;
use reservoir_projections::{store, Projections, Projector, ProjectorConfig};

const DEFAULT_EVENTS: u64 = 200_000;
const RUNS: usize = 3;
/// Entries per read, as the projector's default step.
const READ_ENTRIES: usize = 256;
/// Records per log append.
const APPEND_RECORDS: usize = 512;
/// New reservations per simulated millisecond, over all partitions.
const RESERVES_PER_TICK: u64 = 4;
const BASE_MS: u64 = 1_784_469_600_000;
const TENANTS: [&str; 6] = ["acme", "globex", "initech", "umbrella", "hooli", "tiny"];
/// Its budget is too small for its share of the traffic: refusals and debt.
const TIGHT_TENANT: &str = "tiny";
const ROUTES: [&str; 3] = ["chat.generate", "summarize", "embed"];
const MODELS: [&str; 2] = ["claude-sonnet-4", "claude-haiku-4"];

/// Deterministic generator (xorshift64*), fixed seed: no runtime randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the log holds, counted from the events as they are appended: what a
/// correct projection must show.
#[derive(Default)]
struct Expected {
    events: u64,
    records: u64,
    reserved: u64,
    settled: u64,
    released: u64,
    /// Route → (settles, sum of actual units, sum of reserved units).
    settles_by_route: BTreeMap<String, (u64, u64, u64)>,
    /// (route, model) → output samples (model `default` without output tokens).
    samples_by_model: BTreeMap<(String, String), u64>,
    /// Route → (samples, counted input, reported input).
    drift_by_route: BTreeMap<String, (u64, u64, u64)>,
    refusals_by_tenant: BTreeMap<String, u64>,
}

/// The writer's side: the core's decide/apply per partition, one record per
/// command, appended under a claim.
struct Writer {
    log: Arc<EmbeddedLog>,
    claim: Claim,
    keys: Vec<PartitionKey>,
    partitions: Vec<Partition>,
    pending: Vec<Record>,
    expected: Expected,
}

impl Writer {
    fn submit(&mut self, p: usize, command: Command, now: u64) -> bool {
        let partition = &mut self.partitions[p];
        let (events, admitted) = match decide(partition, &command, now) {
            Ok(events) => (events, true),
            Err(rejection) => match refusal_event(partition, &command, &rejection, now) {
                Some(refusal) => (vec![refusal], false),
                None => panic!("{command:?} on {}: {rejection:?}", self.keys[p]),
            },
        };
        for event in &events {
            apply(partition, event);
            let e = &mut self.expected;
            let key = &self.keys[p];
            match &event.body {
                EventBody::Reserved { .. } => e.reserved += 1,
                EventBody::Released { .. } => e.released += 1,
                EventBody::AdmissionRefused { .. } => {
                    *e.refusals_by_tenant.entry(key.subject.clone()).or_default() += 1
                }
                EventBody::Settled {
                    id,
                    actual_units,
                    usage,
                    ..
                } => {
                    e.settled += 1;
                    let reserved = partition.reservation(id).unwrap().reserved_units;
                    let s = e.settles_by_route.entry(key.route.clone()).or_default();
                    s.0 += 1;
                    s.1 += actual_units;
                    s.2 += reserved;
                    let model = match usage {
                        Some(Usage {
                            output_tokens: Some(_),
                            model: Some(model),
                            ..
                        }) => model.clone(),
                        _ => "default".to_string(),
                    };
                    *e.samples_by_model
                        .entry((key.route.clone(), model))
                        .or_default() += 1;
                    if let Some(Usage {
                        counted_input_tokens: Some(counted),
                        reported_input_tokens: Some(reported),
                        ..
                    }) = usage
                    {
                        let d = e.drift_by_route.entry(key.route.clone()).or_default();
                        d.0 += 1;
                        d.1 += counted;
                        d.2 += reported;
                    }
                }
                _ => {}
            }
        }
        self.expected.events += events.len() as u64;
        self.expected.records += 1;
        self.pending.push(Record {
            key: self.keys[p].clone(),
            writer_id: self.claim.writer_id.clone(),
            claim_epoch: self.claim.epoch,
            events,
        });
        admitted
    }

    async fn flush(&mut self) {
        let batch = std::mem::take(&mut self.pending);
        if !batch.is_empty() {
            self.log.append(batch).await.unwrap();
        }
    }
}

fn policy(subject: &str, route: &str) -> Policy {
    let (burst, refill) = if subject == TIGHT_TENANT {
        (20_000, 400)
    } else {
        (50_000_000, 2_000)
    };
    Policy {
        burst_units: burst,
        opening_units: burst,
        refill: RefillRule {
            units: refill,
            interval_ms: 1,
        },
        ..Policy::example(subject, route, 1)
    }
}

fn digest(n: u64) -> RequestDigest {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&n.to_be_bytes());
    RequestDigest(d)
}

/// What a settle reports: mostly model + output + counted/reported input;
/// some only model + output; some nothing (the digest falls back to `default`).
fn usage(rng: &mut Rng, actual_units: u64) -> Option<Usage> {
    let model = MODELS[rng.below(MODELS.len() as u64) as usize].to_string();
    let counted = actual_units * (10 + rng.below(50)) / 100;
    let output = actual_units - counted;
    match rng.below(20) {
        0..=13 => Some(Usage {
            cache_read_input_tokens: None,
            model: Some(model),
            output_tokens: Some(output),
            counted_input_tokens: Some(counted),
            reported_input_tokens: Some(counted + counted * rng.below(8) / 100),
        }),
        14..=16 => Some(Usage {
            model: Some(model),
            output_tokens: Some(output),
            ..Usage::default()
        }),
        _ => None,
    }
}

/// Builds the log in `dir` with at least `target` events; returns the writer
/// (its partitions are the truth the projection is checked against).
async fn build_log(dir: &Path, target: u64) -> Writer {
    let log = Arc::new(EmbeddedLog::open(dir, "bench-writer").unwrap());
    let claim = log.claim(0).await.unwrap();
    let keys: Vec<PartitionKey> = TENANTS
        .iter()
        .flat_map(|t| {
            ROUTES
                .iter()
                .map(move |r| PartitionKey::new(*t, *r, "2026-07-19T14:00Z", 1).unwrap())
        })
        .collect();
    let mut writer = Writer {
        log,
        claim,
        partitions: vec![Partition::default(); keys.len()],
        keys,
        pending: Vec::new(),
        expected: Expected::default(),
    };
    for p in 0..writer.keys.len() {
        let key = writer.keys[p].clone();
        let policy = policy(&key.subject, &key.route);
        assert!(writer.submit(p, Command::OpenPartition { key, policy }, BASE_MS));
    }
    let mut rng = Rng(0x5EED_CAFE);
    let mut schedule: BTreeMap<u64, Vec<(usize, Command)>> = BTreeMap::new();
    let (mut tick, mut n) = (0u64, 0u64);
    while writer.expected.events < target {
        tick += 1;
        let now = BASE_MS + tick;
        for (p, command) in schedule.remove(&tick).unwrap_or_default() {
            writer.submit(p, command, now);
        }
        for _ in 0..RESERVES_PER_TICK {
            n += 1;
            let p = rng.below(writer.keys.len() as u64) as usize;
            let id = ReservationId::new(format!("rl-01J{n:022}")).unwrap();
            // 1% over the policy's 8,000-unit limit: refused, and logged.
            let units = if rng.below(100) == 0 {
                9_000 + rng.below(5_000)
            } else {
                200 + rng.below(5_800)
            };
            let reserve = Command::Reserve {
                further_units: Vec::new(),
                id: id.clone(),
                digest: digest(n),
                units,
                sizing: None,
            };
            if !writer.submit(p, reserve, now) {
                continue;
            }
            let mut at = |t: u64, command: Command| {
                schedule.entry(tick + t).or_default().push((p, command));
            };
            if rng.below(100) < 8 {
                at(1 + rng.below(20), Command::Release { id });
                continue;
            }
            let operation_id = OperationId::new(format!("op-{n:020}")).unwrap();
            let start = 1 + rng.below(3);
            at(
                start,
                Command::Start {
                    id: id.clone(),
                    operation_id: operation_id.clone(),
                },
            );
            // Mostly below the reservation, sometimes a little above.
            let actual_units = (units * (25 + rng.below(90)) / 100).max(1);
            let usage = usage(&mut rng, actual_units);
            at(
                start + 5 + rng.below(300),
                Command::Settle {
                    further_actual_units: Vec::new(),
                    id,
                    operation_id: Some(operation_id),
                    actual_units,
                    usage,
                },
            );
        }
        if writer.pending.len() >= APPEND_RECORDS {
            writer.flush().await;
        }
    }
    // Every call in flight ends: no reservation is left open.
    while let Some((tick, commands)) = schedule.pop_first() {
        for (p, command) in commands {
            writer.submit(p, command, BASE_MS + tick);
        }
        if writer.pending.len() >= APPEND_RECORDS {
            writer.flush().await;
        }
    }
    writer.flush().await;
    writer
}

/// (a): the whole log read and decoded, `READ_ENTRIES` at a time. Returns the
/// events read.
async fn read_all(log: &EmbeddedLog) -> u64 {
    let (mut offset, mut events) = (0u64, 0u64);
    loop {
        let entries = log.read(0, offset, READ_ENTRIES).await.unwrap();
        let Some((last, _)) = entries.last() else {
            return events;
        };
        offset = last.offset + 1;
        for (_, entry) in &entries {
            if let LogEntry::Record(record) = entry {
                events += record.events.len() as u64;
            }
        }
        black_box(&entries);
    }
}

/// (b), (c): a projection of the whole log into an empty database in `dir`.
/// Returns the events projected, the time `catch_up` took, and the projections.
async fn project(
    log: &Arc<EmbeddedLog>,
    dir: &Path,
    config: ProjectorConfig,
) -> (u64, Duration, Projections) {
    let db = store::open(dir).unwrap();
    let mut projector = Projector::open(log.clone(), db, config).unwrap();
    let started = Instant::now();
    let events = projector.catch_up().await.unwrap();
    let elapsed = started.elapsed();
    (events, elapsed, projector.projections())
}

/// The projection is the log's: panics on the first disagreement.
fn check(projections: &Projections, writer: &Writer) {
    let e = &writer.expected;
    let balances = projections.at().all_balances().unwrap();
    assert_eq!(balances.len(), writer.keys.len(), "partitions projected");
    for b in &balances {
        b.ledger.check().unwrap();
        assert!(!b.quarantined, "{} quarantined", b.key);
        let p = writer.keys.iter().position(|k| *k == b.key).unwrap();
        let live = &writer.partitions[p];
        assert_eq!(b.ledger, live.ledger, "{}", b.key);
        assert_eq!(b.debt_units, live.debt_units(), "{}", b.key);
        assert_eq!(b.last_sequence, live.last_sequence, "{}", b.key);
        assert_eq!(b.open_reservations, 0, "{}", b.key);
        let stored = stored_partition(projections.db(), &b.key).unwrap();
        stored.partition.check_invariants().unwrap();
        assert_eq!(stored.partition.reservations.len(), live.reservations.len());
    }
    assert!(projections.at().findings().unwrap().is_empty(), "findings");
    for tenant in TENANTS {
        let rollup = projections.at().tenant_balance(tenant).unwrap().unwrap();
        rollup.ledger.check().unwrap();
        let parts = balances.iter().filter(|b| b.key.subject == tenant);
        assert_eq!(
            rollup.ledger.spent_units,
            parts.map(|b| b.ledger.spent_units).sum::<u64>()
        );
        let refusals = projections.at().refusals(tenant).unwrap().len() as u64;
        let expected = e.refusals_by_tenant.get(tenant).copied().unwrap_or(0);
        assert_eq!(refusals, expected, "refusals of {tenant}");
    }
    for route in ROUTES {
        let rollup = projections.at().route_balance(route).unwrap().unwrap();
        rollup.ledger.check().unwrap();
        let (settles, actual, reserved) = e.settles_by_route[route];
        let efficiency = projections.at().efficiency_by_route(route).unwrap();
        assert_eq!(
            (
                efficiency.samples,
                efficiency.settled_units,
                efficiency.reserved_units
            ),
            (settles, actual, reserved),
            "efficiency of {route}"
        );
        let estimate = projections.at().route_estimate(route, None, 0).unwrap();
        assert_eq!(estimate.lifetime_samples, settles, "samples of {route}");
        for model in MODELS.iter().chain(&["default"]) {
            let estimate = projections
                .at()
                .route_estimate(route, Some(model), 0)
                .unwrap();
            let expected = e.samples_by_model[&(route.to_string(), model.to_string())];
            assert_eq!(estimate.lifetime_samples, expected, "{route} {model}");
            assert!(estimate.p50_units.is_some());
        }
        let drift = projections.at().input_drift(route).unwrap().unwrap();
        assert_eq!(
            (
                drift.samples,
                drift.counted_input_units,
                drift.reported_input_units
            ),
            e.drift_by_route[route],
            "drift of {route}"
        );
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// The 1-minute load average.
fn load() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn shell(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".to_string())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "?".to_string())
}

fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

struct Measurement {
    name: &'static str,
    rates: Vec<f64>,
    loads: Vec<f64>,
    /// Per round: this rate / that round's read rate.
    ratios: Vec<f64>,
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let target: u64 = std::env::var("PROJECT_BENCH_EVENTS")
        .ok()
        .map(|v| {
            v.parse()
                .expect("PROJECT_BENCH_EVENTS is a number of events")
        })
        .unwrap_or(DEFAULT_EVENTS);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();

    let built = Instant::now();
    let writer = rt.block_on(build_log(&dir.path().join("log"), target));
    let log = writer.log.clone();
    let entries = rt.block_on(log.end_offset(0)).unwrap();
    let e = &writer.expected;
    let refusals: u64 = e.refusals_by_tenant.values().sum();
    let traffic = format!(
        "{} events in {} log entries ({} records: {} reserved, {} settled, {} released, {} refused; {} partitions)",
        thousands(e.events as f64),
        thousands(entries as f64),
        thousands(e.records as f64),
        thousands(e.reserved as f64),
        thousands(e.settled as f64),
        thousands(e.released as f64),
        thousands(refusals as f64),
        writer.keys.len(),
    );
    println!("built {traffic} in {:.1?}", built.elapsed());

    let mut measurements = [
        ("read + decode (EventLog::read, 256 a read)", None),
        (
            "catch_up, default (no WAL, 256 a step)",
            Some(ProjectorConfig::default()),
        ),
        (
            "catch_up, sync_writes: true",
            Some(ProjectorConfig {
                sync_writes: true,
                ..ProjectorConfig::default()
            }),
        ),
    ]
    .map(|(name, config)| {
        (
            config,
            Measurement {
                name,
                rates: Vec::new(),
                loads: Vec::new(),
                ratios: Vec::new(),
            },
        )
    });
    for round in 0..RUNS {
        let mut read_rate = f64::NAN;
        for (config, m) in measurements.iter_mut() {
            m.loads.push(load());
            let rate = match config {
                None => {
                    let started = Instant::now();
                    let events = rt.block_on(read_all(&log));
                    let elapsed = started.elapsed();
                    assert_eq!(events, e.events, "events read");
                    read_rate = events as f64 / elapsed.as_secs_f64();
                    read_rate
                }
                Some(config) => {
                    let projection = tempfile::tempdir().unwrap();
                    let (events, elapsed, projections) =
                        rt.block_on(project(&log, projection.path(), config.clone()));
                    assert_eq!(events, e.events, "events projected");
                    check(&projections, &writer);
                    events as f64 / elapsed.as_secs_f64()
                }
            };
            m.ratios.push(rate / read_rate);
            m.rates.push(rate);
            println!(
                "round {}: {:<44} {:>12} events/s (load {:.2})",
                round + 1,
                m.name,
                thousands(rate),
                m.loads.last().unwrap()
            );
        }
    }

    let loads: Vec<f64> = measurements
        .iter()
        .flat_map(|(_, m)| m.loads.iter().copied())
        .collect();
    let max_load = loads.iter().copied().fold(f64::NAN, f64::max);
    let cores = shell("nproc", &[]);
    let mut report = String::new();
    report.push_str("# Projector throughput\n\n");
    report.push_str(&format!(
        "Command: `cargo bench -p reservoir-projections --bench project`{} at {}, {}. Machine: {} cores ({}).\n\n",
        if target == DEFAULT_EVENTS {
            String::new()
        } else {
            format!(" with `PROJECT_BENCH_EVENTS={target}`")
        },
        shell("git", &["describe", "--always", "--dirty"]),
        shell("date", &["-u", "+%Y-%m-%dT%H:%MZ"]),
        cores,
        cpu_model(),
    ));
    report.push_str(&format!(
        "Log: embedded (RocksDB), server-shaped traffic of {traffic}, one record per command, \
         appended {APPEND_RECORDS} records a batch. Settles report usage (model, output and input tokens).\n\n"
    ));
    report.push_str("```\n");
    report.push_str(&format!(
        "projector throughput, events/s (medians of {RUNS} runs; ratio = median of per-round ratios to read)\n"
    ));
    report.push_str(&format!(
        "{:<44} {:>12} {:>8}   {}\n",
        "measurement", "events/s", "vs read", "runs (load average before each)"
    ));
    for (_, m) in &measurements {
        let runs: Vec<String> = m
            .rates
            .iter()
            .zip(&m.loads)
            .map(|(r, l)| format!("{} ({l:.2})", thousands(*r)))
            .collect();
        report.push_str(&format!(
            "{:<44} {:>12} {:>7.1}%   {}\n",
            m.name,
            thousands(median(m.rates.clone())),
            100.0 * median(m.ratios.clone()),
            runs.join(", ")
        ));
    }
    report.push_str("```\n\n");
    report.push_str(
        "Each catch_up projects the whole log into an empty projection database; only \
         `catch_up` is timed (not opening the database, nor flushing its memtables after). \
         After every run the projection was checked: every partition conserves and equals the \
         writer's own ledger, debt and sequence, with no open reservation and no finding; tenant \
         and route roll-ups conserve; efficiency histograms, digest samples per route and model, \
         input drift and refusals count exactly what the log holds.\n",
    );
    if max_load > 1.0 {
        report.push_str(&format!(
            "\nThe machine was shared with other builds while this ran: load average up to {max_load:.2} \
             on {cores} cores before the measurements. Compare the ratios, not the absolute rates.\n"
        ));
    }
    println!("\n{report}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("bench-results/projector.md");
    std::fs::write(&path, &report).unwrap();
    println!("written to {}", path.display());
}
