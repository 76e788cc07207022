//! `log_suite!`: the behaviours every [`EventLog`] must show, run against each
//! implementation.
//!
//! An implementation provides a [`Harness`]: something that opens (and, for the
//! restart test, reopens) the same log as a given writer and claims a log
//! partition. Then one line instantiates the whole suite as a module of tests:
//! ```ignore
//! log_suite!(embedded, crate::embedded::harness());
//! log_suite!(kafka, crate::kafka::harness().await, shared_by_writers);   // the expression may await
//! ```
//! Each behaviour is a generic `async fn` below, so a failure names the
//! implementation (`embedded::tail_following`) and the behaviour.
//!
//! `shared_by_writers` adds the cases that need two writers on one log at
//! once (a writer whose claim another superseded): the Kafka and memory logs
//! are shared like that. The embedded log is not: its RocksDB lock lets one
//! process, and one instance, open it (`embedded` tests that a second open is
//! refused), so no second writer can supersede the first while it runs.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reservoir_log::{fence, Claim, EventLog, EventReader, LogEntry, LogError, Position, Record};

use crate::fixtures;

/// How the suite gets at one implementation.
pub trait Harness: Send + Sync + 'static {
    type Log: EventLog;

    /// Opens the harness's log (the same one every time) as `writer_id`. Must
    /// work again after an earlier instance was dropped (restart recovery).
    fn open(&self, writer_id: &str) -> impl Future<Output = Self::Log> + Send;

    /// Claims a log partition for the log's writer.
    fn claim(
        log: &Self::Log,
        log_partition: u32,
    ) -> impl Future<Output = Result<Claim, LogError>> + Send;
}

/// Instantiates the suite: `log_suite!(module_name, harness_expression)`, or
/// `log_suite!(module_name, harness_expression, shared_by_writers)` for a log
/// several writers share (see the module doc). The expression is evaluated
/// inside each test's async body (it may `.await`).
#[macro_export]
macro_rules! log_suite {
    ($name:ident, $harness:expr, shared_by_writers) => {
        $crate::log_suite!(@module $name, $harness; a_superseded_writer_is_fenced);
    };
    ($name:ident, $harness:expr) => {
        $crate::log_suite!(@module $name, $harness;);
    };
    (@module $name:ident, $harness:expr; $($extra:ident),*) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::log_suite!(@tests $harness;
                append_read_round_trip,
                positions_are_dense_and_in_batch_order,
                command_events_are_never_split,
                ordering_per_ledger_partition_under_concurrent_appenders,
                read_respects_bounds,
                tail_following,
                reopen_recovers_every_acknowledged_entry,
                records_without_the_held_claim_are_refused,
                $($extra),*
            );
        }
    };
    (@tests $harness:expr; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let harness = $harness;
                $crate::suite::$test(&harness).await;
            }
        )*
    };
}

/// Claims the partition `subject`'s records go to; returns (log, claim, log partition).
async fn claimed<H: Harness>(h: &H, writer: &str, subject: &str) -> (H::Log, Claim, u32) {
    let log = h.open(writer).await;
    let log_partition = log.log_partition_for(&fixtures::key(subject));
    let claim = H::claim(&log, log_partition).await.expect("claim");
    (log, claim, log_partition)
}

fn records(claim: &Claim, subject: &str, first_sequence: u64, sizes: &[usize]) -> Vec<Record> {
    let mut sequence = first_sequence;
    sizes
        .iter()
        .map(|&n| {
            let r = fixtures::record(subject, &claim.writer_id, claim.epoch, sequence, n);
            sequence += n as u64;
            r
        })
        .collect()
}

async fn read_all<L: EventLog>(
    log: &L,
    log_partition: u32,
    from: u64,
) -> Vec<(Position, LogEntry)> {
    let end = log.end_offset(log_partition).await.unwrap();
    let mut out = Vec::new();
    let mut next = from;
    while next < end {
        let chunk = log.read(log_partition, next, 500).await.unwrap();
        assert!(!chunk.is_empty(), "read stalled at {next} before end {end}");
        next = chunk.last().unwrap().0.offset + 1;
        out.extend(chunk);
    }
    out
}

pub async fn append_read_round_trip<H: Harness>(h: &H) {
    let (log, claim, p) = claimed(h, "writer-a", "round-trip").await;
    let batch = records(&claim, "round-trip", 1, &[1, 3, 2]);
    let positions = log.append(batch.clone()).await.unwrap();
    assert_eq!(positions.len(), 3);
    let read = log.read(p, positions[0].offset, 10).await.unwrap();
    let got: Vec<LogEntry> = read.iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(
        got,
        batch.into_iter().map(LogEntry::Record).collect::<Vec<_>>()
    );
    assert_eq!(
        read.iter().map(|(pos, _)| *pos).collect::<Vec<_>>(),
        positions
    );
    // The claim is in the log too, before the records, and they count.
    let all = read_all(&log, p, 0).await;
    assert!(all
        .iter()
        .any(|(_, e)| e == &LogEntry::Claim(claim.clone())));
    let mut validity = fence::Validity::default();
    let counted = fence::valid_records(&mut validity, all);
    assert_eq!(
        counted
            .iter()
            .filter(|(pos, _)| positions.contains(pos))
            .count(),
        3
    );
}

pub async fn positions_are_dense_and_in_batch_order<H: Harness>(h: &H) {
    let (log, claim, p) = claimed(h, "writer-a", "dense").await;
    let mut all = Vec::new();
    for round in 0..5u64 {
        let start = log.end_offset(p).await.unwrap();
        let positions = log
            .append(records(&claim, "dense", 1 + round * 10, &[1, 1, 1, 1]))
            .await
            .unwrap();
        let offsets: Vec<u64> = positions.iter().map(|pos| pos.offset).collect();
        assert!(offsets[0] >= start);
        assert!(
            offsets.windows(2).all(|w| w[1] == w[0] + 1),
            "one append is contiguous: {offsets:?}"
        );
        assert!(positions.iter().all(|pos| pos.log_partition == p));
        assert!(log.end_offset(p).await.unwrap() > *offsets.last().unwrap());
        all.extend(offsets);
    }
    assert!(
        all.windows(2).all(|w| w[1] > w[0]),
        "monotonic across appends: {all:?}"
    );
    // Dense: every offset of the partition holds exactly one entry.
    let entries = read_all(&log, p, 0).await;
    for (i, (pos, _)) in entries.iter().enumerate() {
        assert_eq!(pos.offset, entries[0].0.offset + i as u64);
    }
    assert!(log.append(Vec::new()).await.unwrap().is_empty());
}

pub async fn command_events_are_never_split<H: Harness>(h: &H) {
    let (log, claim, p) = claimed(h, "writer-a", "atomic").await;
    let batch = records(&claim, "atomic", 1, &[500, 1, 64]);
    let positions = log.append(batch.clone()).await.unwrap();
    for (pos, record) in positions.iter().zip(&batch) {
        let read = log.read(p, pos.offset, 1).await.unwrap();
        assert_eq!(read.len(), 1);
        match &read[0].1 {
            LogEntry::Record(r) => {
                assert_eq!(
                    r.events.len(),
                    record.events.len(),
                    "one entry holds the whole command"
                );
                assert_eq!(r, record);
            }
            other => panic!("expected a record, found {other:?}"),
        }
    }
}

pub async fn ordering_per_ledger_partition_under_concurrent_appenders<H: Harness>(h: &H) {
    let log = Arc::new(h.open("writer-a").await);
    let subjects: Vec<String> = (0..6).map(|i| format!("order-{i}")).collect();
    let mut claims = BTreeMap::new();
    for s in &subjects {
        let p = log.log_partition_for(&fixtures::key(s));
        if let std::collections::btree_map::Entry::Vacant(slot) = claims.entry(p) {
            slot.insert(H::claim(&log, p).await.unwrap());
        }
    }
    let starts: BTreeMap<u32, u64> = {
        let mut m = BTreeMap::new();
        for p in claims.keys() {
            m.insert(*p, log.end_offset(*p).await.unwrap());
        }
        m
    };
    // One task per ledger partition, each appending its commands in sequence
    // order; the tasks race, so appends interleave and group.
    let mut tasks = Vec::new();
    for s in subjects.clone() {
        let log = log.clone();
        let claim = claims[&log.log_partition_for(&fixtures::key(&s))].clone();
        tasks.push(tokio::spawn(async move {
            let mut sequence = 1;
            for round in 0..20 {
                let sizes = [1 + round % 3, 2];
                let batch = records(&claim, &s, sequence, &sizes);
                sequence += sizes.iter().sum::<usize>() as u64;
                log.append(batch).await.unwrap();
            }
            sequence - 1
        }));
    }
    let mut last = BTreeMap::new();
    for (s, t) in subjects.iter().zip(tasks) {
        last.insert(s.clone(), t.await.unwrap());
    }
    for (p, start) in starts {
        let mut seen: BTreeMap<String, u64> = BTreeMap::new();
        for (_, entry) in read_all(&*log, p, start).await {
            if let LogEntry::Record(r) = entry {
                let prev = seen.entry(r.key.subject.clone()).or_insert(0);
                for e in &r.events {
                    assert_eq!(
                        e.sequence,
                        *prev + 1,
                        "{}: sequences in order, none lost or doubled",
                        r.key.subject
                    );
                    *prev = e.sequence;
                }
            }
        }
        for (s, n) in &seen {
            assert_eq!(Some(n), last.get(s), "{s}: every event present");
        }
    }
}

pub async fn read_respects_bounds<H: Harness>(h: &H) {
    let (log, claim, p) = claimed(h, "writer-a", "bounds").await;
    let positions = log
        .append(records(&claim, "bounds", 1, &[1; 10]))
        .await
        .unwrap();
    let first = positions[0].offset;
    let end = log.end_offset(p).await.unwrap();
    assert_eq!(log.read(p, first, 3).await.unwrap().len(), 3);
    assert_eq!(log.read(p, first, 0).await.unwrap().len(), 0);
    assert!(log.read(p, end, 10).await.unwrap().is_empty());
    assert!(log.read(p, end + 1000, 10).await.unwrap().is_empty());
    let tail = log.read(p, end - 2, 100).await.unwrap();
    assert_eq!(
        tail.iter().map(|(pos, _)| pos.offset).collect::<Vec<_>>(),
        vec![end - 2, end - 1]
    );
}

pub async fn tail_following<H: Harness>(h: &H) {
    let (log, claim, p) = claimed(h, "writer-a", "tail").await;
    let log = Arc::new(log);
    let end = log.end_offset(p).await.unwrap();
    // Existing entries: at once. The next one: not yet.
    assert!(log
        .wait_for(p, end - 1, Duration::from_millis(1))
        .await
        .unwrap());
    assert!(!log
        .wait_for(p, end, Duration::from_millis(50))
        .await
        .unwrap());
    let follower = {
        let log = log.clone();
        tokio::spawn(async move {
            let mut next = end;
            let mut got = Vec::new();
            while got.len() < 3 {
                assert!(
                    log.wait_for(p, next, Duration::from_secs(20))
                        .await
                        .unwrap(),
                    "tail never arrived"
                );
                for (pos, entry) in log.read(p, next, 10).await.unwrap() {
                    next = pos.offset + 1;
                    got.push(entry);
                }
            }
            got
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut appended = Vec::new();
    for i in 0..3 {
        let batch = records(&claim, "tail", 1 + i, &[1]);
        appended.extend(batch.clone().into_iter().map(LogEntry::Record));
        log.append(batch).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let got = tokio::time::timeout(Duration::from_secs(30), follower)
        .await
        .unwrap()
        .unwrap();
    // Another writer of the same Kafka partition could interleave; ours are in order.
    let ours: Vec<LogEntry> = got.into_iter().filter(|e| appended.contains(e)).collect();
    assert_eq!(ours, appended);
}

pub async fn reopen_recovers_every_acknowledged_entry<H: Harness>(h: &H) {
    let (log, claim, p) = claimed(h, "writer-a", "reopen").await;
    let mut acknowledged = Vec::new();
    for round in 0..4u64 {
        let batch = records(&claim, "reopen", 1 + round * 4, &[2, 2]);
        let positions = log.append(batch.clone()).await.unwrap();
        acknowledged.extend(
            positions
                .into_iter()
                .zip(batch.into_iter().map(LogEntry::Record)),
        );
    }
    let end = log.end_offset(p).await.unwrap();
    drop(log);

    let log = h.open("writer-b").await;
    assert!(
        log.end_offset(p).await.unwrap() >= end,
        "nothing acknowledged is lost"
    );
    for (pos, entry) in &acknowledged {
        let read = log.read(p, pos.offset, 1).await.unwrap();
        assert_eq!(&read[0].1, entry, "entry at {pos:?} survives the restart");
    }
    // A new writer takes over above the old claim and continues densely.
    let new_claim = H::claim(&log, p).await.unwrap();
    assert!(new_claim.epoch > claim.epoch);
    let before = log.end_offset(p).await.unwrap();
    let positions = log
        .append(records(&new_claim, "reopen", 17, &[1]))
        .await
        .unwrap();
    assert!(positions[0].offset >= before);
    // Records of the old writer after the new claim would not count; before it they do.
    let all = read_all(&log, p, 0).await;
    let mut validity = fence::Validity::default();
    let counted: Vec<Position> = fence::valid_records(&mut validity, all)
        .into_iter()
        .map(|(pos, _)| pos)
        .collect();
    for (pos, _) in &acknowledged {
        assert!(
            counted.contains(pos),
            "{pos:?} counts: written under the claim of its time"
        );
    }
    assert!(counted.contains(&positions[0]));
}

pub async fn records_without_the_held_claim_are_refused<H: Harness>(h: &H) {
    let (log, claim, p) = claimed(h, "writer-a", "refused").await;
    let end = log.end_offset(p).await.unwrap();
    let stale = Claim {
        writer_id: claim.writer_id.clone(),
        epoch: claim.epoch + 7,
    };
    let foreign = Claim {
        writer_id: "someone-else".into(),
        epoch: claim.epoch,
    };
    for bad in [stale, foreign] {
        let err = log
            .append(records(&bad, "refused", 1, &[1]))
            .await
            .unwrap_err();
        assert!(
            matches!(err, LogError::Invalid(_) | LogError::Fenced { .. }),
            "{err:?}"
        );
    }
    assert_eq!(log.end_offset(p).await.unwrap(), end, "nothing was written");
}

/// A writer whose claim a later one superseded (a zombie: paused, cut off, or
/// slow to learn it lost the log partition) is answered `Fenced`, a transient
/// error, for every batch it appends after the newer claim, and none of them
/// counts; the new holder's records do. (Whether its batches reach the log
/// is each log's own: Kafka and the memory log write the first one, as a
/// produce lands before its read-back, and refuse the rest.)
/// `shared_by_writers` only.
pub async fn a_superseded_writer_is_fenced<H: Harness>(h: &H) {
    let (zombie, old, p) = claimed(h, "zombie", "superseded").await;
    let before = zombie
        .append(records(&old, "superseded", 1, &[1]))
        .await
        .unwrap();
    let usurper = h.open("usurper").await;
    let new = H::claim(&usurper, p).await.unwrap();
    assert!(new.epoch > old.epoch, "{new:?} supersedes {old:?}");
    for i in 0..3 {
        let err = zombie
            .append(records(&old, "superseded", 2 + i, &[1]))
            .await
            .unwrap_err();
        assert!(
            matches!(err, LogError::Fenced { .. }) && err.transient(),
            "zombie batch {i}: {err:?}"
        );
    }
    let after = usurper
        .append(records(&new, "superseded", 2, &[1]))
        .await
        .unwrap();
    let (counted, validity) = fence::read_valid(&usurper, p).await.unwrap();
    let counted: Vec<Position> = counted.into_iter().map(|(pos, _)| pos).collect();
    assert_eq!(
        counted,
        [before, after].concat(),
        "only the acknowledged records count"
    );
    assert_eq!(validity.current_claim(), Some(&new));
}
