//! A projection built live (the projector following the log while it is
//! written, in many small steps) and rebuilds from scratch are byte-identical.

use std::path::Path;
use std::time::Duration;

use reservoir_core::ReservationState;
use reservoir_log::{EventLog, Position};
use reservoir_projections::{dump, store, ProjectionError, Projector};
use tokio::sync::watch;

use super::support::*;

pub fn assert_same(a: &[store::DumpEntry], b: &[store::DumpEntry]) {
    if let Some(diff) = store::first_difference(a, b) {
        panic!("projections differ: {diff}");
    }
    assert_eq!(a.len(), b.len(), "projections differ in length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_projection_equals_rebuild_from_scratch() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("log");
    let mut driver = Driver::open(&log_path, "writer-1").await;
    let mut mixed = Mixed::new(&mut driver);
    mixed.run(&mut driver, 20).await;
    // A second writer takes over the log partition: a new claim mid-log.
    let driver = driver.reopen(&log_path, "writer-2").await;
    live_vs_rebuilt(driver, mixed, dir.path()).await;
}

/// The same on the Kafka log (a real Kafka-protocol broker, three log
/// partitions), when `RESERVOIR_TEST_BROKERS` names one; skipped loudly otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_projection_equals_rebuild_on_kafka() {
    let Some(brokers) = std::env::var("RESERVOIR_TEST_BROKERS")
        .ok()
        .filter(|b| !b.trim().is_empty())
    else {
        eprintln!("\n*** SKIPPED (no broker): RESERVOIR_TEST_BROKERS is not set (scripts/test starts Apache Kafka) ***\n");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::kafka(&brokers, 3).await;
    let mut mixed = Mixed::new(&mut driver);
    mixed.run(&mut driver, 20).await;
    live_vs_rebuilt(driver, mixed, dir.path()).await;
}

async fn live_vs_rebuilt<L: EventLog>(mut driver: Driver<L>, mut mixed: Mixed, dir: &Path) {
    let db = store::open(dir.join("live")).unwrap();
    let projector = Projector::open(driver.log.clone(), db.clone(), config(7)).unwrap();
    let projections = projector.projections();
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(projector.run(stopped));
    for _ in 0..6 {
        mixed.run(&mut driver, 15).await;
        for position in driver.last_positions.values() {
            projections
                .wait_for_position(*position, Duration::from_secs(30))
                .await
                .unwrap();
            assert!(projections.consumed(position.log_partition).unwrap() > position.offset);
        }
    }
    // A position no write has reached yet: a clear timeout.
    let last = driver.last_positions.values().next().unwrap();
    let beyond = Position {
        log_partition: last.log_partition,
        offset: last.offset + 10,
    };
    let waited = projections
        .wait_for_position(beyond, Duration::from_millis(100))
        .await;
    assert!(
        matches!(waited, Err(ProjectionError::Timeout { .. })),
        "{waited:?}"
    );
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();

    let live = dump(&db).unwrap();
    let rebuilt = rebuild(driver.log.clone(), &dir.join("rebuilt"), 1_024).await;
    assert_same(&live, &rebuilt);
    let entry_by_entry = rebuild(driver.log.clone(), &dir.join("one-by-one"), 1).await;
    assert_same(&live, &entry_by_entry);

    // The projection holds what the scenario did.
    let count = |cf: &str| live.iter().filter(|(c, ..)| c == cf).count();
    println!(
        "dump: {} key/values; {} reservations, {} refusals, {} digests",
        live.len(),
        count(store::RESERVATIONS),
        count(store::REFUSALS),
        count(store::DIGESTS)
    );
    check_conservation(&projections, &driver);
    let findings = projections.at().findings().unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].key, corrupt_key());
    assert!(findings[0].error.contains("sequence gap"), "{findings:?}");
    let quarantined = projections
        .at()
        .partition_balance(&corrupt_key())
        .unwrap()
        .unwrap();
    assert!(quarantined.quarantined && quarantined.skipped_events > 0);

    let mut states = std::collections::BTreeSet::new();
    for key in mixed_keys() {
        for (id, r) in &driver.partitions[&key].reservations {
            let record = projections
                .at()
                .reservation(&key, id.as_str())
                .unwrap()
                .unwrap();
            assert_eq!(&record.reservation, r);
            states.insert(format!("{:?}", r.state));
        }
    }
    for state in [
        ReservationState::Settled,
        ReservationState::SettledWithDebt,
        ReservationState::Released,
        ReservationState::Expired,
    ] {
        assert!(
            states.contains(&format!("{state:?}")),
            "{state:?} not exercised: {states:?}"
        );
    }
    assert!(!projections.at().refusals("t1").unwrap().is_empty());
    let estimate = projections
        .at()
        .route_estimate("chat", Some(store::DEFAULT_MODEL), 5)
        .unwrap();
    assert!(estimate.warm && estimate.samples > 5, "{estimate:?}");
    assert!(estimate.p50_units <= estimate.p90_units && estimate.p90_units <= estimate.p99_units);
    // Every settle feeds exactly one digest: its model's, or `default`.
    let all_models = projections.at().route_estimate("chat", None, 10).unwrap();
    let efficiency = projections.at().efficiency_by_route("chat").unwrap();
    assert_eq!(efficiency.samples, all_models.lifetime_samples);
    for model in ["model-a", "model-b"] {
        let e = projections
            .at()
            .route_estimate("chat", Some(model), 1)
            .unwrap();
        assert!(e.lifetime_samples > 0, "{e:?}");
    }
    // The scenario's gateway counts input 3% low (rounded down per call).
    let drift = projections.at().input_drift("chat").unwrap().unwrap();
    let ppm = drift.multiplier_ppm().unwrap();
    assert!((1_020_000..=1_031_000).contains(&ppm), "{drift:?} {ppm}");
    let t1 = projections.at().tenant_balance("t1").unwrap().unwrap();
    assert_eq!(t1.partitions, 2);
}
