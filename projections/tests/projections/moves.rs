//! The projector checks every capacity move against its other half: a pair
//! that agrees is no finding; a `MovedIn` whose units differ from its
//! `MovedOut` is one, located at the half that disagrees, however the log is
//! cut into steps, and the partitions still project and conserve.

use reservoir_core::{Command, MoveId, Policy};
use reservoir_projections::{store, Projector};

use super::support::*;

fn move_out(id: &str, to: &reservoir_core::PartitionKey, units: u64) -> Command {
    Command::MoveOut {
        move_id: MoveId::new(id).unwrap(),
        to: to.clone(),
        units,
        further_units: Vec::new(),
    }
}

fn move_in(id: &str, from: &reservoir_core::PartitionKey, units: u64) -> Command {
    Command::MoveIn {
        move_id: MoveId::new(id).unwrap(),
        from: from.clone(),
        units,
        debt_units: 0,
        further: Vec::new(),
    }
}

#[tokio::test]
async fn a_move_whose_halves_disagree_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let g1 = key("t1", "chat");
    let g2 = reservoir_core::PartitionKey {
        policy_generation: 2,
        ..g1.clone()
    };
    driver.open_partition(&g1, Policy::example("t1", "chat", 1), 0);
    let successor = Command::OpenSuccessor {
        key: g2.clone(),
        policy: Policy::example("t1", "chat", 2),
    };
    driver.submit(&g2, successor, 1).unwrap();
    driver.submit(&g1, Command::Close, 2).unwrap();
    // A pair that agrees, then one whose arriving half says 90 of 100.
    driver.submit(&g1, move_out("mv-ok", &g2, 400), 3).unwrap();
    driver.submit(&g2, move_in("mv-ok", &g1, 400), 3).unwrap();
    driver.submit(&g1, move_out("mv-bad", &g2, 100), 4).unwrap();
    driver.submit(&g2, move_in("mv-bad", &g1, 90), 4).unwrap();
    driver.flush().await;

    let mut dumps = Vec::new();
    for read_entries_max in [1, 4_096] {
        let path = dir.path().join(format!("projection-{read_entries_max}"));
        let db = store::open(path).unwrap();
        let mut projector =
            Projector::open(driver.log.clone(), db.clone(), config(read_entries_max)).unwrap();
        projector.catch_up().await.unwrap();
        let p = projector.projections();
        let findings = p.at().findings().unwrap();
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].key, g2);
        assert!(findings[0].error.contains("mv-bad"), "{findings:?}");
        for key in [&g1, &g2] {
            let balance = p.at().partition_balance(key).unwrap().unwrap();
            balance.ledger.check().unwrap();
            assert!(!balance.quarantined, "{key}");
            assert_eq!(balance.ledger, driver.partitions[key].ledger, "{key}");
        }
        dumps.push(reservoir_projections::dump(&db).unwrap());
    }
    assert_eq!(
        dumps[0], dumps[1],
        "the same however the log is cut into steps"
    );
}
