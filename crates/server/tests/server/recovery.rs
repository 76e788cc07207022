//! Restart on the same log: state, receipts and positions come back from the
//! log alone, and idempotent retries still answer the original receipts.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reservoir_core::PartitionKey;
use reservoir_log::memory::MemoryLog;
use reservoir_log::{EventLog, EventReader, LogEntry, LogError, Position, Record};
use reservoir_server::writer::RetiredIndex;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::support::*;

/// A memory log whose reads wait for a permit: recovery is held back at will.
struct GatedLog {
    inner: MemoryLog,
    gate: Semaphore,
}

impl EventReader for GatedLog {
    fn log_partition_for(&self, key: &PartitionKey) -> u32 {
        self.inner.log_partition_for(key)
    }
    fn log_partitions(&self) -> u32 {
        self.inner.log_partitions()
    }
    async fn read(
        &self,
        p: u32,
        from: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        let _permit = self.gate.acquire().await.expect("gate open");
        self.inner.read(p, from, max).await
    }
    async fn end_offset(&self, p: u32) -> Result<u64, LogError> {
        self.inner.end_offset(p).await
    }
    async fn wait_for(&self, p: u32, offset: u64, timeout: Duration) -> Result<bool, LogError> {
        self.inner.wait_for(p, offset, timeout).await
    }
}

impl EventLog for GatedLog {
    async fn append(&self, batch: Vec<Record>) -> Result<Vec<Position>, LogError> {
        self.inner.append(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_recovery_is_done() {
    let inner = MemoryLog::new();
    let key = PartitionKey::new("t", "r", "e", 1).unwrap();
    let policy = policy("t", "r", 1, 1_000, 0);
    let opened = reservoir_core::decide(
        &Default::default(),
        &reservoir_core::Command::OpenPartition {
            key: key.clone(),
            policy,
        },
        1,
    )
    .unwrap();
    // An earlier writer's claim and record; they still count after our claim.
    let earlier = inner.claim("w");
    inner
        .append(vec![Record {
            key,
            writer_id: earlier.writer_id,
            claim_epoch: earlier.epoch,
            events: opened,
        }])
        .await
        .unwrap();
    let ours = inner.claim("test-writer");
    let log = Arc::new(GatedLog {
        inner,
        gate: Semaphore::new(0),
    });
    let dir = crate::support::tempdir().unwrap();
    let s = TestServer::start_unready(log.clone(), test_config(dir.path()), ours).await;
    assert_eq!(s.get("/healthz").await.0, StatusCode::OK);
    for _ in 0..3 {
        let (status, body) = s.get("/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(problem_type(&body), "not_ready");
        let (status, body) = s.reserve("a", "t", "r", 1).await;
        assert_eq!(
            (status, problem_type(&body)),
            (StatusCode::SERVICE_UNAVAILABLE, "not_ready")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    log.gate.add_permits(1_000);
    s.wait_ready().await;
    let (status, body) = s.reserve("a", "t", "r", 1).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    s.stop().await;
}

/// Some traffic of every kind; returns each reservation's last receipt.
async fn traffic(s: &TestServer) -> Vec<(String, &'static str, u64, serde_json::Value)> {
    s.publish(&policy("t", "r", 1, 10_000, 0), "e").await;
    s.publish(&policy("u", "r", 1, 10_000, 0), "e").await;
    let mut receipts = Vec::new();
    for i in 0..20 {
        let subject = if i % 2 == 0 { "t" } else { "u" };
        let id = format!("id-{i}");
        let (status, r) = s.reserve(&id, subject, "r", 100 + i).await;
        assert_eq!(status, StatusCode::CREATED);
        let r = match i % 4 {
            0 => {
                s.post(&format!("/v1/reservations/{id}/release"), json!({}))
                    .await
                    .1
            }
            1 => {
                s.post(
                    &format!("/v1/reservations/{id}/start"),
                    json!({"operation_id": "op"}),
                )
                .await
                .1
            }
            2 => {
                s.post(
                    &format!("/v1/reservations/{id}/start"),
                    json!({"operation_id": "op"}),
                )
                .await;
                s.post(
                    &format!("/v1/reservations/{id}/settle"),
                    json!({"actual_units": 2 * i}),
                )
                .await
                .1
            }
            _ => r,
        };
        receipts.push((id, subject, 100 + i, r));
    }
    receipts
}

async fn check_receipts(
    s: &TestServer,
    receipts: &[(String, &'static str, u64, serde_json::Value)],
) {
    for (id, _, _, r) in receipts {
        let (status, got) = s.get(&format!("/v1/reservations/{id}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&got, r, "{id}");
    }
}

async fn check_recovered(
    s: &TestServer,
    before: &[serde_json::Value],
    receipts: &[(String, &'static str, u64, serde_json::Value)],
) {
    assert_eq!(s.assert_conserved().await, before);
    for (id, subject, units, r) in receipts {
        let (status, got) = s.get(&format!("/v1/reservations/{id}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&got, r, "{id}");
        let (status, again) = s.reserve(id, subject, "r", *units).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&again, r);
    }
    let (_, active) = s.get("/v1/policies/t/r").await;
    assert_eq!(active["policy"]["generation"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_memory_log_recovers_every_receipt_and_balance() {
    let (s, log, dir) = TestServer::memory().await;
    let receipts = traffic(&s).await;
    let before = s.assert_conserved().await;
    s.stop().await;
    let s = TestServer::start(log, test_config(dir.path())).await;
    check_recovered(&s, &before, &receipts).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_embedded_log_recovers_every_receipt_and_balance() {
    let (s, dir) = TestServer::embedded().await;
    let receipts = traffic(&s).await;
    let before = s.assert_conserved().await;
    s.stop().await;
    // The log is closed once the stopped server's writers dropped it; reopen and re-claim.
    let s = TestServer::embedded_in(dir.path()).await;
    check_recovered(&s, &before, &receipts).await;
    // A later write lands after the new claim and is acknowledged.
    let (status, _) = s.reserve("after-restart", "t", "r", 1).await;
    assert_eq!(status, StatusCode::CREATED);
    s.stop().await;
}

/// Recovery as the server would run it, on the embedded log in `dir` (closed after).
async fn recover_directly(dir: &std::path::Path) -> reservoir_server::recovery::Recovered {
    let log = reservoir_log::embedded::EmbeddedLog::open(dir.join("log"), "inspector").unwrap();
    let snapshot = reservoir_server::snapshot::read(dir);
    let retired = RetiredIndex::open(&dir.join("retired")).unwrap();
    reservoir_server::recovery::recover(&log, 2, snapshot, &retired)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_plus_the_log_after_it_recovers_everything() {
    let dir = crate::support::tempdir().unwrap();
    let config = || {
        let mut c = test_config(dir.path());
        c.snapshot_interval = Some(Duration::from_secs(3_600));
        c
    };
    // Run 1: traffic, then a graceful stop writes a snapshot at the log's end.
    let s = TestServer::embedded_with(config()).await;
    let receipts = traffic(&s).await;
    let before = s.assert_conserved().await;
    s.stop().await;
    let snap = reservoir_server::snapshot::path(dir.path());
    assert!(snap.exists(), "snapshot written at shutdown");
    let first = std::fs::read(&snap).unwrap();
    let r = recover_directly(dir.path()).await;
    assert!(r.from_snapshot);
    assert_eq!(r.events, 0, "nothing after the cut to replay");

    // Run 2 starts from it and appends more.
    let s = TestServer::embedded_with(config()).await;
    check_recovered(&s, &before, &receipts).await;
    for i in 0..5 {
        let id = format!("tail-{i}");
        let (status, _) = s.reserve(&id, "t", "r", 10).await;
        assert_eq!(status, StatusCode::CREATED);
        if i % 2 == 0 {
            s.post(
                &format!("/v1/reservations/{id}/start"),
                json!({"operation_id": "op"}),
            )
            .await;
        }
    }
    let after = s.assert_conserved().await;
    let (_, tail_receipt) = s.get("/v1/reservations/tail-4").await;
    s.stop().await;

    // Put the first snapshot back: run 3 must replay the tail after its cut.
    std::fs::write(&snap, &first).unwrap();
    let r = recover_directly(dir.path()).await;
    assert!(r.from_snapshot);
    assert!(
        r.events >= 8,
        "the tail after the cut was replayed ({} events)",
        r.events
    );
    let s = TestServer::embedded_with(config()).await;
    assert_eq!(s.assert_conserved().await, after);
    assert_eq!(s.get("/v1/reservations/tail-4").await.1, tail_receipt);
    check_receipts(&s, &receipts).await;

    // A corrupt snapshot is ignored: the whole log is replayed.
    s.stop().await;
    std::fs::write(&snap, b"{not a snapshot").unwrap();
    let r = recover_directly(dir.path()).await;
    assert!(!r.from_snapshot);
    let s = TestServer::embedded_with(config()).await;
    assert_eq!(s.assert_conserved().await, after);
    check_receipts(&s, &receipts).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_fenced_writer_do_not_count() {
    use reservoir_core::{apply, decide, Command, Partition, RequestDigest, ReservationId};
    let log = MemoryLog::new();
    let key = PartitionKey::new("t", "r", "e", 1).unwrap();
    let scratch = crate::support::tempdir().unwrap();
    let retired = RetiredIndex::open(scratch.path()).unwrap();
    let mut p = Partition::default();
    let open = Command::OpenPartition {
        key: key.clone(),
        policy: policy("t", "r", 1, 1_000, 0),
    };
    let opened = decide(&p, &open, 1).unwrap();
    opened.iter().for_each(|e| apply(&mut p, e));
    let old = log.claim("old");
    let record = |claim: &reservoir_log::Claim, events| Record {
        key: key.clone(),
        writer_id: claim.writer_id.clone(),
        claim_epoch: claim.epoch,
        events,
    };
    log.append(vec![record(&old, opened)]).await.unwrap();
    let new = log.claim("new");
    // A zombie: the old writer appends after the new claim took the log. The
    // record lands (as on a shared Kafka topic) and the zombie is told it is fenced.
    let id = ReservationId::new("zombie").unwrap();
    let reserve = Command::Reserve {
        further_units: Vec::new(),
        id: id.clone(),
        digest: RequestDigest([1; 32]),
        units: 10,
        sizing: None,
    };
    let zombie = log
        .append(vec![record(&old, decide(&p, &reserve, 2).unwrap())])
        .await;
    assert!(matches!(zombie, Err(LogError::Fenced { .. })), "{zombie:?}");
    let r = reservoir_server::recovery::recover(&log, 2, None, &retired)
        .await
        .unwrap();
    assert_eq!((r.records, r.skipped_records), (1, 1));
    assert!(
        !r.index.contains_key(&id),
        "the fenced reserve does not count"
    );
    // The new writer's own records count.
    let mut after = Partition::default();
    for s in &r.shards {
        if let Some(ps) = s.partitions.get(&key) {
            after = ps.partition.clone();
        }
    }
    assert_eq!(after.last_sequence, 1);
    log.append(vec![record(&new, decide(&after, &reserve, 3).unwrap())])
        .await
        .unwrap();
    let r = reservoir_server::recovery::recover(&log, 2, None, &retired)
        .await
        .unwrap();
    assert_eq!((r.records, r.skipped_records), (2, 1));
    assert!(r.index.contains_key(&id));
}
