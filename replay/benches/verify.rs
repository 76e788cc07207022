//! `verify` throughput: events per second re-derived from the log and compared
//! with a projection, through the real `reservoir-replay` binary.
//!
//! Setup (not timed): a log of `BENCH_EVENTS` events (default 10,000,000) over
//! `BENCH_PARTITIONS` ledger partitions (default 1,000), one event per record
//! (one command each, as the server writes most of them), partitions
//! interleaved in runs of 64 records, written straight through
//! `EmbeddedLog::append` in batches of 16,384 records. Each partition runs
//! reserve → start → settle cycles (every tenth cycle also logs a refusal).
//! The projection it is compared with is written directly from the
//! generator's own `apply`-folded state, encoded as the projector encodes it
//! (building it with the projector would take far longer than the run being
//! measured; the integration tests compare against real projector output).
//!
//! Timed: `reservoir-replay verify --balances-only` and full `verify` (every
//! reservation record too) on the embedded log, the median (and the best) of `BENCH_ROUNDS`
//! (default 3). With `RESERVOIR_TEST_BROKERS` set, also a Kafka topic of
//! `BENCH_KAFKA_EVENTS` events (default 1,000,000) read from the broker, the
//! same number of rounds.
//!
//! Run: `cargo bench -p reservoir-replay --bench verify` (scripts/bench-replay).
//! `BENCH_DIR` keeps the generated log between runs.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use reservoir_core::{
    apply, Event, EventBody, OperationId, Partition, PartitionKey, Policy, RefusalReason,
    RequestDigest, ReservationId,
};
use reservoir_log::embedded::EmbeddedLog;
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::{Claim, EventLog, EventReader, Record};
use reservoir_projections::model::{ClaimState, Cursor};
use reservoir_projections::store;
use reservoir_replay::engine::{Engine, PartState};

const BATCH_RECORDS: usize = 16_384;
const RUN_RECORDS: u64 = 64;
const BASE_MS: u64 = 1_780_000_000_000;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// One partition's generator: the next event of its reserve/start/settle cycle.
struct Gen {
    key: PartitionKey,
    partition: Partition,
    step: u64,
}

impl Gen {
    fn new(p: u64) -> Self {
        Self {
            key: PartitionKey::new(format!("tenant-{p}"), "chat.generate", "2026-07", 1).unwrap(),
            partition: Partition::default(),
            step: 0,
        }
    }

    fn next(&mut self) -> Event {
        let sequence = self.partition.last_sequence + 1;
        let at_ms = BASE_MS + sequence;
        let body = if self.step == 0 {
            let mut policy = Policy::example(&self.key.subject, &self.key.route, 1);
            policy.burst_units = 1 << 50;
            policy.opening_units = 1 << 50;
            policy.max_reservation_units = 1 << 40;
            EventBody::PartitionOpened {
                key: self.key.clone(),
                opening_units: policy.opening_units,
                policy,
            }
        } else {
            let cycle = (self.step - 1) / 4;
            let id = ReservationId::new(format!("r-{cycle}")).unwrap();
            match (self.step - 1) % 4 {
                0 => EventBody::Reserved {
                    id,
                    digest: RequestDigest([7; 32]),
                    reserved_units: 100,
                    held_units: 100,
                    expires_at_ms: at_ms + 180_000,
                    shadow: None,
                    sizing: None,
                    shadow_dimension: None,
                },
                1 => EventBody::Started {
                    id,
                    operation_id: OperationId::new(format!("op-{cycle}")).unwrap(),
                    execution_deadline_ms: at_ms + 600_000,
                },
                2 => EventBody::Settled {
                    id,
                    actual_units: 60,
                    refunded_units: 40,
                    from_available_units: 0,
                    overdraft_units: 0,
                    overdraft_limit_breached: false,
                    from_usage_unknown: false,
                    usage: None,
                },
                _ if cycle.is_multiple_of(10) => EventBody::AdmissionRefused {
                    dimension: None,
                    id: ReservationId::new(format!("x-{cycle}")).unwrap(),
                    requested_units: 1 << 45,
                    reason: RefusalReason::RequestTooLarge,
                    retry_after_ms: None,
                },
                _ => {
                    self.step += 1;
                    return self.next();
                }
            }
        };
        self.step += 1;
        let event = Event {
            further: Vec::new(),
            sequence,
            at_ms,
            body,
        };
        apply(&mut self.partition, &event);
        event
    }
}

/// Writes `events` events round-robin (in runs) over `partitions` partitions
/// through `append`, and returns the generators (their folded state).
async fn generate<L: EventLog>(
    log: &L,
    claims: &[Claim],
    events: u64,
    partitions: u64,
) -> HashMap<PartitionKey, Gen> {
    let mut gens: Vec<Gen> = (0..partitions).map(Gen::new).collect();
    let mut written = 0u64;
    let mut batches: Vec<Vec<Record>> = vec![Vec::new(); claims.len()];
    let mut p = 0usize;
    let started = Instant::now();
    while written < events {
        let gen = &mut gens[p];
        let lp = log.log_partition_for(&gen.key) as usize;
        for _ in 0..RUN_RECORDS.min(events - written) {
            let event = gen.next();
            batches[lp].push(Record {
                key: gen.key.clone(),
                writer_id: claims[lp].writer_id.clone(),
                claim_epoch: claims[lp].epoch,
                events: vec![event],
            });
            written += 1;
            if batches[lp].len() == BATCH_RECORDS {
                log.append(std::mem::take(&mut batches[lp])).await.unwrap();
            }
        }
        p = (p + 1) % gens.len();
    }
    for batch in batches {
        if !batch.is_empty() {
            log.append(batch).await.unwrap();
        }
    }
    eprintln!(
        "generated {written} events over {partitions} partitions in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    gens.into_iter().map(|g| (g.key.clone(), g)).collect()
}

/// The projection of the generated state, as the projector would store it.
fn write_projection(
    dir: &Path,
    gens: HashMap<PartitionKey, Gen>,
    ends: &[u64],
    claims: &[Claim],
    lp_of: impl Fn(&PartitionKey) -> u32,
) {
    let db = store::open(dir).unwrap();
    let mut engine = Engine::new(ends.len() as u32, false, None);
    for (key, g) in gens {
        let state = PartState::folded(g.partition, lp_of(&key), BASE_MS + 1);
        engine.partitions.insert(key, state);
    }
    let (balances, reservations) = reservoir_replay::state::entries_of(&mut engine);
    let put = |cf: &str, entries: &[(String, Vec<u8>)]| {
        let handle = db.cf_handle(cf).unwrap();
        for chunk in entries.chunks(100_000) {
            let mut batch = rocksdb::WriteBatch::default();
            for (k, v) in chunk {
                batch.put_cf(handle, k.as_bytes(), v);
            }
            db.write(batch).unwrap();
        }
    };
    let cursors: Vec<(String, Vec<u8>)> = ends
        .iter()
        .zip(claims)
        .enumerate()
        .map(|(lp, (&end, claim))| {
            let cursor = Cursor {
                next_offset: end,
                claim: Some(ClaimState {
                    writer_id: claim.writer_id.clone(),
                    epoch: claim.epoch,
                }),
            };
            (
                store::cursor_key(lp as u32),
                serde_json::to_vec(&cursor).unwrap(),
            )
        })
        .collect();
    put(store::CURSORS, &cursors);
    put(store::BALANCES, &balances);
    put(store::RESERVATIONS, &reservations);
    // Flush every column family (`flush` alone is the default one), as a
    // projector's clean close leaves it, so opening it replays no WAL.
    for name in store::COLUMN_FAMILIES {
        db.flush_cf(&db.cf_handle(name).unwrap()).unwrap();
    }
}

/// Runs the binary's `verify`; returns (wall seconds, its own summary line).
fn verify(log_args: &[&str], projections: &Path, balances_only: bool) -> (f64, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reservoir-replay"));
    cmd.args(log_args)
        .arg("verify")
        .arg("--projections")
        .arg(projections);
    if balances_only {
        cmd.arg("--balances-only");
    }
    let started = Instant::now();
    let out = cmd.output().expect("run reservoir-replay");
    let wall = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "verify failed ({}): {stderr}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    (wall, stderr.trim().to_string())
}

fn measure(name: &str, events: u64, log_args: &[&str], projections: &Path, rounds: u64) {
    for balances_only in [true, false] {
        let mut runs: Vec<(f64, String)> = (0..rounds.max(1))
            .map(|_| verify(log_args, projections, balances_only))
            .collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let walls: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.0)).collect();
        // The median run (the lower middle one of an even count) and its own line.
        let (median, line) = &runs[(runs.len() - 1) / 2];
        let what = if balances_only {
            "verify --balances-only"
        } else {
            "verify (balances + every reservation)"
        };
        println!(
            "{name}: {what}: {events} events in {median:.2} s wall = {:.0} events/s end to end (median of {rounds}; runs {} s; best {:.0} events/s)\n    binary said (median run): {line}",
            events as f64 / median,
            walls.join(", "),
            events as f64 / runs[0].0,
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists; nothing to list
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let events = env_u64("BENCH_EVENTS", 10_000_000);
    let partitions = env_u64("BENCH_PARTITIONS", 1_000);
    let rounds = env_u64("BENCH_ROUNDS", 3);
    let keep = std::env::var_os("BENCH_DIR").map(std::path::PathBuf::from);
    let temp = tempfile::tempdir().unwrap();
    let dir = keep.unwrap_or_else(|| temp.path().to_path_buf());
    let log_dir = dir.join(format!("log-{events}-{partitions}"));
    let projections = dir.join(format!("projections-{events}-{partitions}"));
    if !projections.join("CURRENT").exists() {
        let _ = std::fs::remove_dir_all(&log_dir);
        let _ = std::fs::remove_dir_all(&projections);
        runtime.block_on(async {
            let log = EmbeddedLog::open(&log_dir, "bench-writer").unwrap();
            let claim = log.claim(0).await.unwrap();
            let gens = generate(&log, std::slice::from_ref(&claim), events, partitions).await;
            let end = log.end_offset(0).await.unwrap();
            drop(log);
            write_projection(&projections, gens, &[end], &[claim], |_| 0);
        });
    }
    let log_arg = log_dir.to_str().unwrap();
    measure(
        "embedded",
        events,
        &["--log-dir", log_arg],
        &projections,
        rounds,
    );

    let Some(brokers) = std::env::var("RESERVOIR_TEST_BROKERS")
        .ok()
        .filter(|b| !b.trim().is_empty())
    else {
        println!("kafka: skipped (RESERVOIR_TEST_BROKERS is not set)");
        return;
    };
    let kafka_events = env_u64("BENCH_KAFKA_EVENTS", 1_000_000);
    let topic = format!("reservoir.bench.replay.{}", std::process::id());
    let kafka_projections = dir.join(format!("projections-kafka-{}", std::process::id()));
    runtime.block_on(async {
        let mut config = KafkaConfig::new(&brokers, "bench-writer");
        config.topic = topic.clone();
        config.partitions_for_new_topic = 2;
        let log = KafkaLog::connect(config).await.unwrap();
        let mut claims = Vec::new();
        for lp in 0..log.log_partitions() {
            claims.push(log.claim(lp).await.unwrap());
        }
        let gens = generate(&log, &claims, kafka_events, partitions.min(100)).await;
        let mut ends = Vec::new();
        for lp in 0..log.log_partitions() {
            ends.push(log.end_offset(lp).await.unwrap());
        }
        let lp_of = |k: &PartitionKey| log.log_partition_for(k);
        write_projection(&kafka_projections, gens, &ends, &claims, lp_of);
    });
    measure(
        "kafka",
        kafka_events,
        &["--brokers", &brokers, "--topic", &topic],
        &kafka_projections,
        rounds,
    );
    let _ = std::fs::remove_dir_all(&kafka_projections);
}
