//! The embedded RocksDB log: the shared suite, and what only it promises — one
//! process at a time, and a crash (SIGKILL mid-append) leaves exactly a dense
//! prefix holding every acknowledged entry.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use reservoir_log::embedded::EmbeddedLog;
use reservoir_log::{codec, fence, Claim, EventLog, EventReader, LogEntry, LogError, Record};
use sha2::{Digest, Sha256};

use crate::fixtures;
use crate::suite::Harness;

/// A log in a fresh temporary directory, reopened at the same path.
pub struct EmbeddedHarness {
    dir: tempfile::TempDir,
}

impl EmbeddedHarness {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("log")
    }
}

impl Harness for EmbeddedHarness {
    type Log = EmbeddedLog;

    async fn open(&self, writer_id: &str) -> EmbeddedLog {
        EmbeddedLog::open(self.path(), writer_id).unwrap()
    }

    async fn claim(log: &EmbeddedLog, log_partition: u32) -> Result<Claim, LogError> {
        log.claim(log_partition).await
    }
}

// Not `shared_by_writers`: one process, and one instance, holds the log (the
// lock test below), so no second writer can supersede the first.
crate::log_suite!(suite, crate::embedded::EmbeddedHarness::new());

#[tokio::test]
async fn a_second_open_is_refused_while_the_first_holds_the_lock() {
    let h = EmbeddedHarness::new();
    let first = h.open("a").await;
    let err = EmbeddedLog::open(h.path(), "b").unwrap_err();
    assert!(
        matches!(&err, LogError::Unavailable(m) if m.contains("locked")),
        "{err}"
    );
    drop(first);
    EmbeddedLog::open(h.path(), "b").unwrap();
}

#[tokio::test]
async fn claims_survive_reopen_and_only_partition_0_exists() {
    let h = EmbeddedHarness::new();
    let log = h.open("a").await;
    assert!(
        log.append(vec![fixtures::record("t", "a", 1, 1, 1)])
            .await
            .is_err(),
        "no claim yet"
    );
    assert_eq!(log.claim(0).await.unwrap().epoch, 1);
    assert_eq!(log.claim(0).await.unwrap().epoch, 2);
    assert!(matches!(log.claim(1).await, Err(LogError::Invalid(_))));
    assert!(matches!(log.read(1, 0, 1).await, Err(LogError::Invalid(_))));
    drop(log);
    let log = h.open("b").await;
    assert_eq!(
        log.claim(0).await.unwrap(),
        Claim {
            writer_id: "b".into(),
            epoch: 3
        }
    );
}

/// Concurrent appenders share synced writes: many appends, fewer fsyncs, and
/// every append still gets its own dense, contiguous positions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_are_group_committed() {
    let h = EmbeddedHarness::new();
    let log = Arc::new(h.open("a").await);
    let claim = log.claim(0).await.unwrap();
    let before = log.synced_writes();
    const TASKS: u64 = 16;
    const APPENDS: u64 = 40;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (log, claim) = (log.clone(), claim.clone());
            tokio::spawn(async move {
                let mut positions = Vec::new();
                for i in 0..APPENDS {
                    let batch = vec![
                        fixtures::record(
                            &format!("g-{t}"),
                            &claim.writer_id,
                            claim.epoch,
                            1 + 2 * i,
                            1,
                        ),
                        fixtures::record(
                            &format!("g-{t}"),
                            &claim.writer_id,
                            claim.epoch,
                            2 + 2 * i,
                            1,
                        ),
                    ];
                    let p = log.append(batch).await.unwrap();
                    assert_eq!(p[1].offset, p[0].offset + 1, "one append stays contiguous");
                    positions.extend(p);
                }
                positions
            })
        })
        .collect();
    let mut offsets = Vec::new();
    for t in tasks {
        offsets.extend(t.await.unwrap().into_iter().map(|p| p.offset));
    }
    offsets.sort_unstable();
    let first = offsets[0];
    assert_eq!(
        offsets,
        (first..first + TASKS * APPENDS * 2).collect::<Vec<_>>(),
        "dense, no duplicates"
    );
    let writes = log.synced_writes() - before;
    eprintln!("{} appends in {writes} synced writes", TASKS * APPENDS);
    assert!(
        writes < TASKS * APPENDS,
        "no appends were grouped: {writes} writes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_an_unencodable_record_writes_nothing() {
    let h = EmbeddedHarness::new();
    let log = h.open("a").await;
    let claim = log.claim(0).await.unwrap();
    let end = log.end_offset(0).await.unwrap();
    let good = fixtures::record("t", &claim.writer_id, claim.epoch, 1, 1);
    let too_big = fixtures::record(
        "t",
        &claim.writer_id,
        claim.epoch,
        2,
        codec::MAX_EVENTS_PER_RECORD + 1,
    );
    let err = log.append(vec![good, too_big]).await.unwrap_err();
    assert!(matches!(err, LogError::Invalid(_)), "{err}");
    assert_eq!(
        log.end_offset(0).await.unwrap(),
        end,
        "the whole batch is refused"
    );
}

// --- Crash test -------------------------------------------------------------------

const CHILD_ENV: &str = "RESERVOIR_CRASH_CHILD_LOG";
const CHILD_TASKS: usize = 4;

fn batch_digest(records: &[Record]) -> String {
    let mut hash = Sha256::new();
    for r in records {
        hash.update(codec::encode(&LogEntry::Record(r.clone())).unwrap());
    }
    hex::encode(hash.finalize())
}

/// Not a test on its own: the child process of `sigkill_mid_append_keeps_exactly_an_acknowledged_prefix`.
/// It appends from several tasks forever, printing `ack <first offset> <records> <sha256>`
/// after each append returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of sigkill_mid_append_keeps_exactly_an_acknowledged_prefix"]
async fn crash_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let writer = format!("crash-child-{}", std::process::id());
    let log = Arc::new(EmbeddedLog::open(PathBuf::from(path), writer.clone()).unwrap());
    let claim = log.claim(0).await.unwrap();
    let mut tasks = Vec::new();
    for task in 0..CHILD_TASKS {
        let (log, claim) = (log.clone(), claim.clone());
        tasks.push(tokio::spawn(async move {
            let mut sequence = 1u64;
            let mut round = 0usize;
            loop {
                round += 1;
                let batch: Vec<Record> = (0..1 + (round * 7 + task) % 32)
                    .map(|i| {
                        let events = 1 + (i + round) % 3;
                        let r = fixtures::record(
                            &format!("crash-{task}"),
                            &claim.writer_id,
                            claim.epoch,
                            sequence,
                            events,
                        );
                        sequence += events as u64;
                        r
                    })
                    .collect();
                let digest = batch_digest(&batch);
                let count = batch.len();
                let positions = log.append(batch).await.unwrap();
                let mut out = std::io::stdout().lock();
                writeln!(out, "ack {} {count} {digest}", positions[0].offset).unwrap();
                out.flush().unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

struct Ack {
    first: u64,
    count: u64,
    digest: String,
}

fn parse_ack(line: &str) -> Option<Ack> {
    let mut parts = line.strip_prefix("ack ")?.split(' ');
    Some(Ack {
        first: parts.next()?.parse().ok()?,
        count: parts.next()?.parse().ok()?,
        digest: parts.next()?.to_string(),
    })
}

/// Runs the child until it has acknowledged `acks_before_kill` appends, checks
/// the lock holds against this process meanwhile, SIGKILLs it, and returns every
/// ack it printed.
fn run_child_and_kill(path: &Path, acks_before_kill: usize) -> Vec<Ack> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "embedded::crash_child",
            "--exact",
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acks = Vec::new();
    while acks.len() < acks_before_kill {
        let line = lines
            .next()
            .expect("child exited before enough acks")
            .unwrap();
        if let Some(ack) = parse_ack(&line) {
            acks.push(ack);
        }
        if acks.len() == 1 {
            let err = EmbeddedLog::open(path, "intruder").unwrap_err();
            assert!(
                matches!(&err, LogError::Unavailable(m) if m.contains("locked")),
                "{err}"
            );
        }
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no flush, mid-append
    child.wait().unwrap();
    // Lines already in the pipe were printed after their append returned: acknowledged too.
    acks.extend(lines.map_while(Result::ok).filter_map(|l| parse_ack(&l)));
    acks
}

#[test]
fn sigkill_mid_append_keeps_exactly_an_acknowledged_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut acknowledged: Vec<Ack> = Vec::new();
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        let acks = run_child_and_kill(&path, 5 + round * 13);
        assert!(!acks.is_empty());
        acknowledged.extend(acks);

        runtime.block_on(async {
            let log = EmbeddedLog::open(&path, "checker").unwrap();
            let end = log.end_offset(0).await.unwrap();
            // Every entry 0..end is there, decodes, and sits at its offset
            // (`read` checks keys are dense and values decode: no torn record).
            let mut entries = Vec::new();
            while (entries.len() as u64) < end {
                let chunk = log.read(0, entries.len() as u64, 1024).await.unwrap();
                assert!(!chunk.is_empty());
                entries.extend(chunk);
            }
            assert_eq!(entries.len() as u64, end);
            // Entries past the last acknowledgement were made durable but their
            // answer died with the child (like any commit whose reply is lost).
            let acknowledged_end = acknowledged
                .iter()
                .map(|a| a.first + a.count)
                .max()
                .unwrap_or(0);
            eprintln!(
                "round {round}: {end} entries, {} past the last acknowledged one",
                end.saturating_sub(acknowledged_end)
            );
            for ack in &acknowledged {
                assert!(
                    ack.first + ack.count <= end,
                    "acknowledged entries {}..+{} lost",
                    ack.first,
                    ack.count
                );
                let records: Vec<Record> = entries
                    [ack.first as usize..(ack.first + ack.count) as usize]
                    .iter()
                    .map(|(_, e)| match e {
                        LogEntry::Record(r) => r.clone(),
                        other => panic!("expected a record at {}, found {other:?}", ack.first),
                    })
                    .collect();
                assert_eq!(
                    batch_digest(&records),
                    ack.digest,
                    "entries at {} are what was acknowledged",
                    ack.first
                );
            }
            // One claim per child run, each above the last; every record written
            // under the claim of its time counts.
            let claims: Vec<u64> = entries
                .iter()
                .filter_map(|(_, e)| match e {
                    LogEntry::Claim(c) => Some(c.epoch),
                    LogEntry::Record(_) => None,
                })
                .collect();
            assert_eq!(claims, (1..=round as u64 + 1).collect::<Vec<_>>());
            let records = entries.len() - claims.len();
            let mut validity = fence::Validity::default();
            assert_eq!(fence::valid_records(&mut validity, entries).len(), records);
        });
    }
    let total: u64 = acknowledged.iter().map(|a| a.count).sum();
    eprintln!(
        "{ROUNDS} kills, {} acknowledged appends, {total} records checked",
        acknowledged.len()
    );
}

/// A `SecondaryLog` follows a log another instance holds open and writes:
/// it sees what was written before it opened and what is written after,
/// never takes the lock, and is refused on a directory that is no log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secondary_follows_the_primary_without_its_lock() {
    use reservoir_log::embedded::SecondaryLog;
    let h = EmbeddedHarness::new();
    let primary = h.open("a").await;
    let claim = primary.claim(0).await.unwrap();
    let first = primary
        .append(vec![fixtures::record("t", "a", claim.epoch, 1, 1)])
        .await
        .unwrap();
    let secondary_dir = tempfile::tempdir().unwrap();
    let secondary = SecondaryLog::open(&h.path(), secondary_dir.path()).unwrap();
    assert_eq!(secondary.log_partitions(), 1);
    assert_eq!(secondary.end_offset(0).await.unwrap(), first[0].offset + 1);
    let later = primary
        .append(vec![fixtures::record("t", "a", claim.epoch, 2, 1)])
        .await
        .unwrap();
    assert!(
        secondary
            .wait_for(0, later[0].offset, std::time::Duration::from_secs(10))
            .await
            .unwrap(),
        "the secondary catches up with the primary"
    );
    let (counted, validity) = fence::read_valid(&secondary, 0).await.unwrap();
    let counted: Vec<_> = counted.into_iter().map(|(pos, _)| pos).collect();
    assert_eq!(counted, [first, later].concat());
    assert_eq!(validity.current_claim(), Some(&claim));
    assert!(matches!(
        secondary.read(1, 0, 1).await,
        Err(LogError::Invalid(_))
    ));
    // Raw values, undecoded, for a reader that decodes in bulk (replay).
    let mut offsets = Vec::new();
    secondary
        .for_each_value(0, secondary.caught_up_end(), |offset, value| {
            assert!(codec::decode(value).is_ok(), "offset {offset}");
            offsets.push(offset);
        })
        .unwrap();
    assert_eq!(offsets, (0..secondary.caught_up_end()).collect::<Vec<_>>());
    // The primary still writes while the secondary is open.
    primary
        .append(vec![fixtures::record("t", "a", claim.epoch, 3, 1)])
        .await
        .unwrap();

    let not_a_log = tempfile::tempdir().unwrap();
    let err = SecondaryLog::open(not_a_log.path(), secondary_dir.path()).unwrap_err();
    assert!(
        matches!(&err, LogError::Invalid(m) if m.contains("not an embedded log directory")),
        "{err}"
    );
}

/// The entries a read takes from the tail (small appends and claims, kept
/// after their synced write) are the ones the disk holds: read once through
/// the tail, again from the disk, and once more after a reopen, all equal to
/// what was appended, across a large append the tail does not keep and a
/// new claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tail_hands_over_what_the_disk_holds() {
    let h = EmbeddedHarness::new();
    let log = h.open("a").await;
    let first = log.claim(0).await.unwrap();
    let batch = |claim: &Claim, from: u64, n: usize| -> Vec<Record> {
        (0..n as u64)
            .map(|i| fixtures::record("t", &claim.writer_id, claim.epoch, from + i * 4, 3))
            .collect()
    };
    let mut appended = vec![LogEntry::Claim(first.clone())];
    for records in [
        batch(&first, 1, 3),
        batch(&first, 100, 70),
        batch(&first, 900, 2),
    ] {
        log.append(records.clone()).await.unwrap();
        appended.extend(records.into_iter().map(LogEntry::Record));
    }
    assert_eq!(log.tail_entries(), 2, "the large append let the tail go");
    let second = log.claim(0).await.unwrap();
    let records = batch(&second, 2_000, 5);
    log.append(records.clone()).await.unwrap();
    appended.push(LogEntry::Claim(second.clone()));
    appended.extend(records.into_iter().map(LogEntry::Record));
    assert_eq!(log.tail_entries(), 8);

    let end = appended.len() as u64;
    assert_eq!(read_in_fours(&log, end).await, appended, "through the tail");
    assert_eq!(log.tail_entries(), 0, "each entry handed over once");
    assert_eq!(read_in_fours(&log, end).await, appended, "from the disk");
    drop(log);
    let log = h.open("b").await;
    assert_eq!(read_in_fours(&log, end).await, appended, "after a reopen");
}

/// Every entry below `end`, read four at a time.
async fn read_in_fours(log: &EmbeddedLog, end: u64) -> Vec<LogEntry> {
    let mut out = Vec::new();
    while (out.len() as u64) < end {
        let chunk = log.read(0, out.len() as u64, 4).await.unwrap();
        assert!(!chunk.is_empty());
        for (position, entry) in chunk {
            assert_eq!(position.offset, out.len() as u64, "dense, in order");
            out.push(entry);
        }
    }
    out
}
