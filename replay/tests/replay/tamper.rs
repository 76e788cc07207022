//! A log deliberately corrupted or tampered with is caught and located: a
//! changed amount, a missing event, bytes that do not decode (in the embedded
//! log, and on a Kafka topic). Each finding names the log position and the
//! ledger partition; `--strict` stops at the first.

use std::path::Path;

use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use reservoir_core::EventBody;
use reservoir_log::embedded::{ENTRIES_CF, META_CF};
use reservoir_log::{codec, EventReader, LogEntry};
use serde_json::Value;

use super::support::*;

const ACME: &str = "acme|chat|2026-07|g1";

fn open(dir: &Path) -> rocksdb::DB {
    let cfs = [ENTRIES_CF, META_CF]
        .map(|n| rocksdb::ColumnFamilyDescriptor::new(n, rocksdb::Options::default()));
    rocksdb::DB::open_cf_descriptors(&rocksdb::Options::default(), dir, cfs).unwrap()
}

/// Every (offset, raw value) of the log.
fn entries(db: &rocksdb::DB) -> Vec<(u64, Vec<u8>)> {
    let cf = db.cf_handle(ENTRIES_CF).unwrap();
    db.iterator_cf(cf, rocksdb::IteratorMode::Start)
        .map(|i| {
            let (k, v) = i.unwrap();
            (u64::from_be_bytes((*k).try_into().unwrap()), v.to_vec())
        })
        .collect()
}

/// Offset of the first acme record holding an event matching `pick`.
fn find(db: &rocksdb::DB, pick: impl Fn(&EventBody) -> bool) -> (u64, Vec<u8>) {
    entries(db)
        .into_iter()
        .find(|(_, v)| match codec::decode(v).unwrap() {
            LogEntry::Record(r) => {
                r.key.subject == "acme" && r.events.iter().any(|e| pick(&e.body))
            }
            LogEntry::Claim(_) => false,
        })
        .expect("event in the log")
}

fn is(body: &EventBody, kind: &str, id: &str) -> bool {
    body.type_name() == kind && body.reservation_id().is_some_and(|r| r.as_str() == id)
}

fn tampered_copy(log_dir: &Path, name: &str) -> std::path::PathBuf {
    let copy = log_dir.parent().unwrap().join(name);
    copy_dir(log_dir, &copy);
    copy
}

/// The audit's findings (jsonl), with its exit code.
fn audit_findings(log: &Path, strict: bool) -> (Option<i32>, Vec<Value>, String) {
    audit_findings_in(&["--log-dir", log.to_str().unwrap()], strict)
}

/// [`audit_findings`] of the log `source` names (`--log-dir …` or `--brokers … --topic …`).
fn audit_findings_in(source: &[&str], strict: bool) -> (Option<i32>, Vec<Value>, String) {
    let mut args = source.to_vec();
    args.extend(["audit", "--tenant", "acme", "--format", "jsonl"]);
    if strict {
        args.push("--strict");
    }
    let out = replay(&args);
    let findings = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["kind"] == "finding")
        .map(|l| l["finding"].clone())
        .collect();
    (out.status.code(), findings, text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_missing_and_undecodable_entries_are_located() {
    let (dir, log_dir) = embedded_history().await;
    let clean = audit_findings(&log_dir, true);
    assert_eq!(clean.0, Some(0), "the untouched log is clean: {}", clean.2);
    let live = dir.path().join("projections");
    drop(project_embedded(&log_dir, &live).await);

    // 1. A changed amount: r1 settled for 100 units more than the record says.
    let changed = tampered_copy(&log_dir, "changed");
    let offset = {
        let db = open(&changed);
        let (offset, value) = find(&db, |b| is(b, "Settled", "r1"));
        let LogEntry::Record(mut record) = codec::decode(&value).unwrap() else {
            unreachable!()
        };
        for e in &mut record.events {
            if let EventBody::Settled { actual_units, .. } = &mut e.body {
                *actual_units += 100;
            }
        }
        let bytes = codec::encode(&LogEntry::Record(record)).unwrap();
        db.put_cf(
            db.cf_handle(ENTRIES_CF).unwrap(),
            offset.to_be_bytes(),
            bytes,
        )
        .unwrap();
        offset
    };
    let (code, findings, _) = audit_findings(&changed, false);
    assert_eq!(code, Some(1));
    let f = &findings[0];
    assert_eq!(
        (
            f["kind"].as_str(),
            f["offset"].as_u64(),
            f["partition"].as_str()
        ),
        (Some("refused"), Some(offset), Some(ACME)),
        "{findings:?}"
    );
    assert_eq!(f["log_partition"], 0);
    // The HTML statement shows every finding, highlighted, at its place.
    let page_path = dir.path().join("changed.html");
    let out = audit(
        changed.to_str().unwrap(),
        "acme",
        "html",
        &["-o", page_path.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&page_path).unwrap();
    assert_eq!(
        page.matches("<tr class=\"finding\"").count(),
        findings.len()
    );
    let first = page.find("<tr class=\"finding\" id=\"finding-0\"").unwrap();
    assert!(page[first..].contains(&format!("offset {offset}")));
    let later_row = format!("<td>0:{}</td>", offset + 1);
    if let Some(later) = page.find(&later_row) {
        assert!(first < later, "the finding is placed before later rows");
    }
    let (code, _, stderr) = audit_findings(&changed, true);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!("offset {offset}")) && stderr.contains(ACME),
        "{stderr}"
    );
    // verify against the projection of the true log: findings and differences.
    let out = replay(&[
        "--log-dir",
        changed.to_str().unwrap(),
        "verify",
        "--projections",
        live.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&format!("offset {offset}")),
        "{}",
        text(&out.stderr)
    );

    // 2. A missing event: r1's Started record removed, later entries moved up.
    let missing = tampered_copy(&log_dir, "missing");
    let (removed, next_acme) = {
        let db = open(&missing);
        let (removed, _) = find(&db, |b| is(b, "Started", "r1"));
        let all = entries(&db);
        let cf = db.cf_handle(ENTRIES_CF).unwrap();
        let mut batch = rocksdb::WriteBatch::default();
        let last = all.last().unwrap().0;
        batch.delete_cf(cf, last.to_be_bytes());
        for (offset, value) in all.iter().filter(|(o, _)| *o > removed) {
            batch.put_cf(cf, (offset - 1).to_be_bytes(), value);
        }
        db.write(batch).unwrap();
        // The first acme record after the removed one, at its new offset.
        let next = all
            .iter()
            .filter(|(o, _)| *o > removed)
            .find(|(_, v)| matches!(codec::decode(v).unwrap(), LogEntry::Record(r) if r.key.subject == "acme"))
            .unwrap()
            .0
            - 1;
        (removed, next)
    };
    let (code, findings, _) = audit_findings(&missing, false);
    assert_eq!(code, Some(1));
    let gap = findings
        .iter()
        .find(|f| f["kind"] == "sequence_gap")
        .expect("a gap finding");
    assert_eq!(gap["offset"].as_u64(), Some(next_acme), "{findings:?}");
    assert_eq!(gap["partition"], ACME);
    assert!(next_acme >= removed);

    // 3. Bytes that do not decode: r2's Reserved record cut in half (its
    // partition key still readable at the front).
    let garbled = tampered_copy(&log_dir, "garbled");
    let offset = {
        let db = open(&garbled);
        let (offset, value) = find(&db, |b| is(b, "Reserved", "r2"));
        db.put_cf(
            db.cf_handle(ENTRIES_CF).unwrap(),
            offset.to_be_bytes(),
            &value[..value.len() / 2],
        )
        .unwrap();
        offset
    };
    let (code, findings, _) = audit_findings(&garbled, false);
    assert_eq!(code, Some(1));
    let f = &findings[0];
    assert_eq!(
        (
            f["kind"].as_str(),
            f["offset"].as_u64(),
            f["partition"].as_str()
        ),
        (Some("undecodable"), Some(offset), Some(ACME)),
        "{findings:?}"
    );
    // Default mode continued past it: later events were still audited.
    let out = replay(&["--log-dir", garbled.to_str().unwrap(), "--strict", "state"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        text(&out.stderr).contains(&format!("offset {offset}")),
        "{}",
        text(&out.stderr)
    );
    let out = replay(&[
        "--log-dir",
        garbled.to_str().unwrap(),
        "export",
        "--format",
        "jsonl",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "export reports the finding and continues"
    );
    assert!(text(&out.stdout).lines().count() > 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_writes_jsonl_and_an_avro_container() {
    let (dir, log_dir) = embedded_history().await;
    let log = log_dir.to_str().unwrap();
    let out = replay(&["--log-dir", log, "export", "--format", "jsonl"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(events
        .iter()
        .any(|e| e["type"] == "Settled" && e["partition"]["subject"] == "acme"));
    let avro = dir.path().join("events.avro");
    let out = replay(&[
        "--log-dir",
        log,
        "export",
        "--format",
        "avro",
        "-o",
        avro.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let reader = apache_avro::Reader::new(std::fs::File::open(&avro).unwrap()).unwrap();
    let mut n_events = 0;
    for value in reader {
        let apache_avro::types::Value::Record(fields) = value.unwrap() else {
            panic!("not a record")
        };
        let (_, apache_avro::types::Value::Array(items)) =
            fields.iter().find(|(n, _)| n == "events").unwrap()
        else {
            panic!("no events")
        };
        n_events += items.len();
    }
    assert_eq!(n_events, events.len());
    // A range: the same events cut by position.
    let out = replay(&["--log-dir", log, "export", "--from", "10", "--to", "20"]);
    let ranged: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(ranged
        .iter()
        .all(|e| (10..=20).contains(&e["offset"].as_u64().unwrap())));
    assert!(!ranged.is_empty());
}

/// A generation switch moves capacity as a pair; a log with one half removed,
/// or with the arriving half altered, is found and located by the audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_move_is_found_and_located() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]).await;
    for generation in [1, 2] {
        let mut p = policy("acme", "chat", 0);
        p.generation = generation;
        let body = serde_json::json!({"accounting_epoch": "2026-07", "policy": p});
        let (status, body) = server.post("/v1/policies", body).await;
        assert_eq!(status, 201, "{body}");
        if generation == 1 {
            let r =
                serde_json::json!({"id": "r1", "subject": "acme", "route": "chat", "units": 300});
            let (status, body) = server.post("/v1/reservations", r).await;
            assert_eq!(status, 201, "{body}");
        }
        let ms: u64 = std::env::var("SLEEP_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
    server.stop();
    let log_dir = dir.path().join("log");
    let clean = audit_findings(&log_dir, true);
    assert_eq!(clean.0, Some(0), "the untouched log is clean: {}", clean.2);
    let moved = |b: &EventBody, kind: &str| b.type_name() == kind;

    // 1. The arriving half removed (later entries moved up).
    let removed = tampered_copy(&log_dir, "move-half-removed");
    let out_offset = {
        let db = open(&removed);
        let (out_offset, _) = find(&db, |b| moved(b, "MovedOut"));
        let (in_offset, _) = find(&db, |b| moved(b, "MovedIn"));
        assert!(in_offset > out_offset, "the halves are appended in order");
        let all = entries(&db);
        let cf = db.cf_handle(ENTRIES_CF).unwrap();
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_cf(cf, all.last().unwrap().0.to_be_bytes());
        for (offset, value) in all.iter().filter(|(o, _)| *o > in_offset) {
            batch.put_cf(cf, (offset - 1).to_be_bytes(), value);
        }
        db.write(batch).unwrap();
        out_offset
    };
    let (code, findings, _) = audit_findings(&removed, false);
    assert_eq!(code, Some(1));
    let f = findings
        .iter()
        .find(|f| f["kind"] == "move_unpaired")
        .unwrap_or_else(|| panic!("an unpaired move: {findings:?}"));
    assert_eq!(f["offset"].as_u64(), Some(out_offset), "{f}");
    assert_eq!(f["partition"], ACME);

    // 2. The arriving half altered: 100 more units arrive than left.
    let altered = tampered_copy(&log_dir, "move-altered");
    let in_offset = {
        let db = open(&altered);
        let (offset, value) = find(&db, |b| moved(b, "MovedIn"));
        let LogEntry::Record(mut record) = codec::decode(&value).unwrap() else {
            unreachable!()
        };
        for e in &mut record.events {
            if let EventBody::MovedIn { units, .. } = &mut e.body {
                *units += 100;
            }
        }
        let bytes = codec::encode(&LogEntry::Record(record)).unwrap();
        db.put_cf(
            db.cf_handle(ENTRIES_CF).unwrap(),
            offset.to_be_bytes(),
            bytes,
        )
        .unwrap();
        offset
    };
    let (code, findings, _) = audit_findings(&altered, false);
    assert_eq!(code, Some(1));
    let f = findings
        .iter()
        .find(|f| f["kind"] == "move_mismatch")
        .unwrap_or_else(|| panic!("a mismatched move: {findings:?}"));
    assert_eq!(f["offset"].as_u64(), Some(in_offset), "{f}");
    assert_eq!(f["partition"], "acme|chat|2026-07|g2");
}

/// On a topic, a value that does not decode (the first acme record cut in
/// half, produced by hand to the end of its partition) is a finding at its
/// offset, naming the ledger partition the front of the value still names;
/// the audit reads on past it, and `--strict` stops there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_value_on_the_topic_is_located() {
    let Some(brokers) = brokers() else { return };
    let (_dir, topic) = kafka_history(&brokers, "garbled").await;

    let log = kafka(&brokers, &topic).await;
    let mut first_acme = None;
    for p in 0..log.log_partitions() {
        let entries = log.read(p, 0, usize::MAX).await.unwrap();
        first_acme = entries
            .into_iter()
            .find(|(_, e)| matches!(e, LogEntry::Record(r) if r.key.subject == "acme"));
        if first_acme.is_some() {
            break;
        }
    }
    let (position, entry) = first_acme.expect("an acme record on the topic");
    let value = codec::encode(&entry).unwrap();
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let delivery = producer
        .send(
            FutureRecord::<(), [u8]>::to(&topic)
                .partition(position.log_partition as i32)
                .payload(&value[..value.len() / 2]),
            Duration::from_secs(30),
        )
        .await
        .expect("produce");
    let offset = u64::try_from(delivery.offset).unwrap();

    let source = ["--brokers", brokers.as_str(), "--topic", topic.as_str()];
    let (code, findings, stderr) = audit_findings_in(&source, false);
    assert_eq!(code, Some(1), "{stderr}");
    let undecodable: Vec<_> = findings
        .iter()
        .filter(|f| f["kind"] == "undecodable")
        .map(|f| (f["offset"].as_u64(), f["partition"].as_str()))
        .collect();
    assert_eq!(undecodable, [(Some(offset), Some(ACME))], "{findings:?}");
    let (code, _, stderr) = audit_findings_in(&source, true);
    assert_eq!(code, Some(3), "--strict stops at it: {stderr}");
    assert!(
        stderr.contains(&format!("offset {offset}")) && stderr.contains(ACME),
        "{stderr}"
    );
}
