//! The retention rule: records of reservations that finished longer ago than
//! the retention (in log time) are deleted with their id entry, the mark says
//! before when, open reservations and balances are untouched, and a rebuild
//! prunes exactly the same, however the log is cut into steps.

use std::time::Duration;

use reservoir_core::{Command, Policy, RequestDigest, ReservationId};
use reservoir_projections::{dump, store, Projector, ProjectorConfig};

use super::support::*;

fn reserve(id: &str) -> Command {
    Command::Reserve {
        further_units: Vec::new(),
        id: ReservationId::new(id).unwrap(),
        digest: RequestDigest([3; 32]),
        units: 10,
        sizing: None,
    }
}

fn retained(read_entries_max: usize) -> ProjectorConfig {
    ProjectorConfig {
        retention: Some(Duration::from_secs(10)),
        ..config(read_entries_max)
    }
}

#[tokio::test]
async fn finished_records_older_than_the_retention_are_pruned_and_open_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let chat = key("t1", "chat");
    let policy = Policy {
        idempotency_window_ms: 1_000,
        ..Policy::example("t1", "chat", 1)
    };
    driver.open_partition(&chat, policy, 0);
    driver.submit(&chat, reserve("open"), 5).unwrap();
    // r-i is reserved at i s and released 1 ms later.
    for i in 0..100u64 {
        let id = format!("r-{i}");
        driver.submit(&chat, reserve(&id), i * 1_000 + 10).unwrap();
        let release = Command::Release {
            id: ReservationId::new(&id).unwrap(),
        };
        driver.submit(&chat, release, i * 1_000 + 11).unwrap();
    }
    driver.flush().await;

    let db = store::open(dir.path().join("projection")).unwrap();
    let mut projector = Projector::open(driver.log.clone(), db.clone(), retained(16)).unwrap();
    projector.catch_up().await.unwrap();
    let p = projector.projections();
    // The newest event is at 99,011 ms: everything that finished before 89,011 ms is gone.
    assert_eq!(p.at().pruned_before_ms().unwrap(), Some(89_011));
    for i in 0..100u64 {
        let found = p
            .at()
            .reservation_by_id(&format!("r-{i}"))
            .unwrap()
            .is_some();
        assert_eq!(found, i * 1_000 + 11 >= 89_011, "r-{i}");
    }
    assert!(p.at().reservation_by_id("open").unwrap().is_some());
    // Balances and the partition as the projector reloads it are untouched.
    let balance = p.at().partition_balance(&chat).unwrap().unwrap();
    balance.ledger.check().unwrap();
    assert_eq!(balance.ledger, driver.partitions[&chat].ledger);
    let stored = reservoir_projections::projector::stored_partition(&db, &chat).unwrap();
    stored.partition.check_invariants().unwrap();
    assert_eq!(
        stored.partition.reservations.len(),
        driver.partitions[&chat].reservations.len()
    );

    // Rebuilt in one go with the same rule: the same database.
    let other = tempfile::tempdir().unwrap();
    let rebuilt_db = store::open(other.path()).unwrap();
    let mut rebuilt =
        Projector::open(driver.log.clone(), rebuilt_db.clone(), retained(4_096)).unwrap();
    rebuilt.catch_up().await.unwrap();
    assert_eq!(dump(&rebuilt_db).unwrap(), dump(&db).unwrap());

    // Without the rule every record stays.
    let all = rebuild(driver.log.clone(), &dir.path().join("all"), 64).await;
    let records = all
        .iter()
        .filter(|(cf, _, _)| cf == store::RESERVATIONS)
        .count();
    assert_eq!(records, 101);
}

/// A partition that goes idle keeps its last finished records in memory
/// (their idempotency window has not passed at its last event). When the
/// retention rule deletes them from the store, they leave that memory too,
/// counted as evicted: a projector restarted after the pruning (which
/// restores the partition from the store) and a rebuild in one go then
/// agree byte for byte. They did not before (the restarted one counted five
/// evictions fewer; found by the simulator).
#[tokio::test]
async fn records_pruned_from_an_idle_partition_leave_its_memory_as_in_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let (idle, busy) = (key("t1", "embed"), key("t2", "chat"));
    let window = |subject, route| Policy {
        idempotency_window_ms: 60_000,
        ..Policy::example(subject, route, 1)
    };
    driver.open_partition(&idle, window("t1", "embed"), 0);
    driver.open_partition(&busy, window("t2", "chat"), 0);
    let cycle = |driver: &mut Driver, key, id: &str, at: u64| {
        driver.submit(key, reserve(id), at).unwrap();
        let release = Command::Release {
            id: ReservationId::new(id).unwrap(),
        };
        driver.submit(key, release, at + 1).unwrap();
    };
    for i in 1..=5u64 {
        cycle(&mut driver, &idle, &format!("e-{i}"), i * 1_000);
    }
    for i in 6..=80u64 {
        cycle(&mut driver, &busy, &format!("c-{i}"), i * 1_000);
    }
    driver.flush().await;

    let path = dir.path().join("projection");
    let mut projector =
        Projector::open(driver.log.clone(), store::open(&path).unwrap(), retained(4)).unwrap();
    projector.catch_up().await.unwrap();
    let p = projector.projections();
    assert!(p.at().reservation_by_id("e-5").unwrap().is_none(), "pruned");
    drop((p, projector));
    // A restart: the idle partition is restored from the store.
    let db = store::open(&path).unwrap();
    let mut projector = Projector::open(driver.log.clone(), db.clone(), retained(4)).unwrap();
    cycle(&mut driver, &idle, "e-late", 90_000);
    driver.flush().await;
    projector.catch_up().await.unwrap();

    let other = tempfile::tempdir().unwrap();
    let rebuilt_db = store::open(other.path()).unwrap();
    let mut rebuilt =
        Projector::open(driver.log.clone(), rebuilt_db.clone(), retained(4_096)).unwrap();
    rebuilt.catch_up().await.unwrap();
    for db in [&db, &rebuilt_db] {
        let stored = reservoir_projections::projector::stored_partition(db, &idle).unwrap();
        stored.partition.check_invariants().unwrap();
        assert_eq!(stored.partition.evicted_reservations, 5);
    }
    assert!(
        dump(&rebuilt_db).unwrap() == dump(&db).unwrap(),
        "the restarted projector's database differs from the rebuild's"
    );
}
