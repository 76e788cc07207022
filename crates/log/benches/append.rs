//! Append throughput of the logs, each beside its raw baseline in the same run.
//!
//! `cargo bench -p reservoir-log --bench append` prints, per batch size (1, 64,
//! 1024 records of one event each, one appender):
//! - embedded: `EmbeddedLog::append` (encode + queue + one synced WriteBatch),
//!   against raw RocksDB: the same encoded bytes written with plain synced
//!   `WriteBatch`es on a database opened with the same options;
//! - one row with concurrent appenders of batch 1, to show group commit;
//! - Kafka rows from [`kafka_rows`] (the Kafka log against raw idempotent rdkafka
//!   produce of the same bytes, to the same broker).
//!
//! Embedded and raw run side by side in alternating slices of 10 batches, and
//! the ratio is the median of the per-slice ratios (over 3 runs), because the
//! machine is shared. The bar: embedded ≥ 80% of raw at batch 1024.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reservoir_log::embedded::{rocksdb_options, EmbeddedLog, ENTRIES_CF};
use reservoir_log::{codec, Claim, EventLog, LogEntry, Record};
use rocksdb::{ColumnFamilyDescriptor, WriteBatch, WriteOptions, DB};

const BATCH_SIZES: [usize; 3] = [1, 64, 1024];
const RUNS: usize = 3;
/// Batches per side before switching to the other side.
const SLICE_BATCHES: usize = 10;
/// Events written per measurement at each batch size (enough to take ~0.1-1 s).
fn events_per_run(batch: usize) -> usize {
    match batch {
        1 => 3_000,
        64 => 64 * 200,
        _ => batch * 100,
    }
}

/// One result line: what was measured, its rate, and its baseline's.
pub struct Row {
    pub log: &'static str,
    pub batch: usize,
    pub events_per_sec: f64,
    pub baseline: &'static str,
    pub baseline_events_per_sec: f64,
    /// Median of per-slice (rate / baseline rate), each slice pair measured back
    /// to back: steadier than the ratio of medians on a shared machine.
    pub ratio: f64,
}

fn key(i: usize) -> reservoir_core::PartitionKey {
    reservoir_core::PartitionKey::new(
        format!("tenant-{}", i % 16),
        "chat.generate",
        "2026-07-19T14:00Z",
        31,
    )
    .unwrap()
}

/// `count` one-event records (a Reserved each, the commonest event) under `claim`.
fn records(claim: &Claim, count: usize, first_sequence: u64) -> Vec<Record> {
    (0..count)
        .map(|i| {
            let sequence = first_sequence + i as u64;
            Record {
                key: key(i),
                writer_id: claim.writer_id.clone(),
                claim_epoch: claim.epoch,
                events: vec![reservoir_core::Event {
                    further: Vec::new(),
                    sequence,
                    at_ms: 1_784_469_600_000 + sequence,
                    body: reservoir_core::EventBody::Reserved {
                        id: reservoir_core::ReservationId::new(format!("rl-{sequence:012}"))
                            .unwrap(),
                        digest: reservoir_core::RequestDigest([sequence as u8; 32]),
                        reserved_units: 600,
                        held_units: 600,
                        expires_at_ms: 1_784_469_780_000 + sequence,
                        shadow: None,
                        sizing: None,
                        shadow_dimension: None,
                    },
                }],
            }
        })
        .collect()
}

fn rate(events: usize, elapsed: Duration) -> f64 {
    events as f64 / elapsed.as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Rates of embedded and raw, one appender each, measured in alternating
/// slices of `SLICE_BATCHES` batches (both databases open side by side), so both
/// see the same load on a shared machine: (embedded events/s, raw events/s,
/// median of the per-slice ratios).
fn paired_run(rt: &tokio::runtime::Runtime, dir: &Path, batch: usize) -> (f64, f64, f64) {
    let log = EmbeddedLog::open(dir.join("embedded"), "bench").unwrap();
    let claim = rt.block_on(log.claim(0)).unwrap();
    let cfs = [ColumnFamilyDescriptor::new(ENTRIES_CF, rocksdb_options())];
    let db = DB::open_cf_descriptors(&rocksdb_options(), dir.join("raw"), cfs).unwrap();
    let cf = db.cf_handle(ENTRIES_CF).unwrap();
    let mut sync = WriteOptions::default();
    sync.set_sync(true);

    let total = events_per_run(batch);
    // Records are built before the clock starts (encoding is inside append);
    // the raw side gets the very bytes the codec makes of them.
    let all = records(&claim, total, 1);
    let values: Vec<Vec<u8>> = all
        .iter()
        .map(|r| codec::encode(&LogEntry::Record(r.clone())).unwrap())
        .collect();
    let mut embedded_batches: Vec<Vec<Record>> = all.chunks(batch).map(|c| c.to_vec()).collect();
    embedded_batches.reverse(); // popped from the back, in order
    let raw_batches: Vec<&[Vec<u8>]> = values.chunks(batch).collect();
    let slices = raw_batches.len().div_ceil(SLICE_BATCHES);

    let (mut embedded_time, mut raw_time) = (Duration::ZERO, Duration::ZERO);
    let mut ratios = Vec::new();
    let mut raw_offset = 0u64;
    for slice in 0..slices {
        let n = SLICE_BATCHES.min(raw_batches.len() - slice * SLICE_BATCHES);
        let embedded = |embedded_batches: &mut Vec<Vec<Record>>| {
            let start = Instant::now();
            rt.block_on(async {
                for _ in 0..n {
                    log.append(embedded_batches.pop().unwrap()).await.unwrap();
                }
            });
            start.elapsed()
        };
        let raw = |raw_offset: &mut u64| {
            let start = Instant::now();
            for chunk in &raw_batches[slice * SLICE_BATCHES..slice * SLICE_BATCHES + n] {
                let mut wb = WriteBatch::default();
                for v in *chunk {
                    wb.put_cf(cf, raw_offset.to_be_bytes(), v);
                    *raw_offset += 1;
                }
                db.write_opt(wb, &sync).unwrap();
            }
            start.elapsed()
        };
        // Alternate which side goes first.
        let (e, r) = if slice % 2 == 0 {
            let e = embedded(&mut embedded_batches);
            (e, raw(&mut raw_offset))
        } else {
            let r = raw(&mut raw_offset);
            (embedded(&mut embedded_batches), r)
        };
        embedded_time += e;
        raw_time += r;
        ratios.push(r.as_secs_f64() / e.as_secs_f64());
    }
    (
        rate(total, embedded_time),
        rate(total, raw_time),
        median(ratios),
    )
}

/// Embedded log, `appenders` concurrent tasks appending batches of 1: events/s.
/// Group commit shows as a rate above the single-appender batch-1 rate.
fn embedded_concurrent_run(rt: &tokio::runtime::Runtime, dir: &Path, appenders: usize) -> f64 {
    rt.block_on(async {
        let log = Arc::new(EmbeddedLog::open(dir.join("concurrent"), "bench").unwrap());
        let claim = log.claim(0).await.unwrap();
        let per_task = events_per_run(1) * 2;
        let start = Instant::now();
        let tasks: Vec<_> = (0..appenders)
            .map(|t| {
                let (log, claim) = (log.clone(), claim.clone());
                let recs = records(&claim, per_task, 1 + (t * per_task) as u64);
                tokio::spawn(async move {
                    for r in recs {
                        log.append(vec![r]).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        rate(per_task * appenders, start.elapsed())
    })
}

/// Kafka log vs raw idempotent rdkafka produce of the same bytes to the same
/// broker, at the same batch sizes. The Kafka engineer fills this in (broker from
/// the environment, e.g. `scripts/kafka env`); no rows when no broker is given.
fn kafka_rows(batch_sizes: &[usize]) -> Vec<Row> {
    kafka::rows(batch_sizes)
}

#[path = "append/kafka.rs"]
mod kafka;

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for batch in BATCH_SIZES {
        let (mut embedded, mut raw, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..RUNS {
            // Fresh databases per run so earlier runs' data does not weigh on later ones.
            let dir = tempfile::tempdir().unwrap();
            let (e, r, ratio) = paired_run(&rt, dir.path(), batch);
            embedded.push(e);
            raw.push(r);
            ratios.push(ratio);
        }
        rows.push(Row {
            log: "embedded",
            batch,
            events_per_sec: median(embedded),
            baseline: "raw rocksdb",
            baseline_events_per_sec: median(raw),
            ratio: median(ratios),
        });
    }
    let concurrent: Vec<f64> = (0..RUNS)
        .map(|_| embedded_concurrent_run(&rt, tempfile::tempdir().unwrap().path(), 8))
        .collect();
    let single_batch_1 = rows[0].events_per_sec;
    let concurrent = median(concurrent);
    rows.push(Row {
        log: "embedded, 8 appenders",
        batch: 1,
        events_per_sec: concurrent,
        baseline: "embedded, 1 appender",
        baseline_events_per_sec: single_batch_1,
        ratio: 0.0,
    });
    rows.extend(kafka_rows(&BATCH_SIZES));

    println!("\nappend throughput, events/s (one event per record; medians of {RUNS} runs; ratio = median of paired slices)");
    println!(
        "{:<24} {:>6} {:>14} {:<22} {:>14} {:>7}",
        "log", "batch", "events/s", "baseline", "events/s", "ratio"
    );
    for r in &rows {
        println!(
            "{:<24} {:>6} {:>14.0} {:<22} {:>14.0} {:>6.1}%",
            r.log,
            r.batch,
            r.events_per_sec,
            r.baseline,
            r.baseline_events_per_sec,
            100.0
                * if r.ratio > 0.0 {
                    r.ratio
                } else {
                    r.events_per_sec / r.baseline_events_per_sec
                }
        );
    }
    let at_1024 = rows
        .iter()
        .find(|r| r.log == "embedded" && r.batch == 1024)
        .unwrap();
    let ratio = at_1024.ratio;
    println!(
        "bar: embedded >= 80% of raw rocksdb at batch 1024: {}",
        if ratio >= 0.8 { "met" } else { "NOT met" }
    );
}
