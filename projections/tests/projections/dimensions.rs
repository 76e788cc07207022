//! A three-dimension policy on the read side (issue 15): balances, roll-ups,
//! efficiency and refusals per dimension, folded by the writer's own code
//! from a real embedded log and checked against the writer's state.

use reservoir_core::{
    Command, Dimension, OperationId, PartitionKey, Policy, RequestDigest, ReservationId,
};
use reservoir_projections::{store, Projector};

use super::support::*;

fn reserve(id: &str, input: u64, output: u64) -> Command {
    Command::Reserve {
        id: ReservationId::new(id).unwrap(),
        digest: RequestDigest([9; 32]),
        units: 1,
        sizing: None,
        further_units: vec![input, output],
    }
}

fn run(
    driver: &mut Driver,
    key: &PartitionKey,
    id: &str,
    now: u64,
    held: (u64, u64),
    used: (u64, u64),
) {
    let rid = ReservationId::new(id).unwrap();
    driver
        .submit(key, reserve(id, held.0, held.1), now)
        .unwrap();
    let start = Command::Start {
        id: rid.clone(),
        operation_id: OperationId::new(format!("op-{id}")).unwrap(),
    };
    driver.submit(key, start, now).unwrap();
    let settle = Command::Settle {
        id: rid,
        operation_id: None,
        actual_units: 1,
        usage: None,
        further_actual_units: vec![used.0, used.1],
    };
    driver.submit(key, settle, now).unwrap();
}

#[tokio::test]
async fn balances_rollups_efficiency_and_refusals_per_dimension() {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let (a, b) = (key("t1", "chat"), key("t2", "chat"));
    for k in [&a, &b] {
        driver.open_partition(
            k,
            Policy::example_three_dimensions(&k.subject, "chat", 1),
            0,
        );
    }
    // t1: output used at half of what was held; t2: output past the hold and
    // available, so it owes output tokens and is frozen.
    run(&mut driver, &a, "a1", 10, (1_000, 4_000), (1_000, 2_000));
    run(&mut driver, &a, "a2", 20, (500, 2_000), (500, 1_000));
    run(&mut driver, &b, "b1", 10, (1_000, 2_000), (900, 25_000));
    // The frozen partition's refusal names output_tokens.
    assert!(driver.submit(&b, reserve("b2", 10, 10), 30).is_err());
    driver.flush().await;

    let db = store::open(dir.path().join("projection")).unwrap();
    let mut projector = Projector::open(driver.log.clone(), db, config(8)).unwrap();
    projector.catch_up().await.unwrap();
    let projections = projector.projections();

    // Each partition's further dimensions are the writer's, term for term.
    for k in [&a, &b] {
        let balance = projections.at().partition_balance(k).unwrap().unwrap();
        let live = &driver.partitions[k];
        assert_eq!(balance.dimensions.len(), 2);
        for (d, state) in balance.dimensions.iter().zip(&live.further) {
            assert_eq!(d.ledger, state.ledger, "{k} {:?}", d.dimension);
            d.ledger.check().unwrap();
        }
    }
    let frozen = projections.at().partition_balance(&b).unwrap().unwrap();
    assert!(frozen.frozen, "frozen by output debt alone");
    assert_eq!(frozen.debt_units, 0, "the primary dimension owes nothing");
    assert_eq!(frozen.dimensions[1].debt_units, 5_000);

    // The route's roll-up sums each dimension with its own kind only.
    let route = projections.at().route_balance("chat").unwrap().unwrap();
    let output = &route.dimensions[&Dimension::OutputTokens];
    assert_eq!(output.partitions, 2);
    assert_eq!(output.ledger.spent_units, 2_000 + 1_000 + 25_000);
    assert_eq!(output.debt_units, 5_000);
    assert_eq!(
        route.dimensions[&Dimension::InputTokens].ledger.spent_units,
        2_400
    );
    assert_eq!(route.ledger.spent_units, 3, "three requests");
    assert_eq!(route.frozen_partitions, 1);

    // Efficiency of output tokens alone, per route and per tenant.
    let eff = projections
        .at()
        .efficiency_by_route(&store::dimension_key("chat", Dimension::OutputTokens))
        .unwrap();
    assert_eq!(
        (eff.samples, eff.settled_units, eff.reserved_units),
        (3, 28_000, 8_000)
    );
    let t1 = projections
        .at()
        .efficiency_by_tenant(&store::dimension_key("t1", Dimension::OutputTokens))
        .unwrap();
    assert_eq!(t1.overall_permille(), Some(500));
    // The primary dimension's histogram stays what it was: requests, 1 of 1.
    assert_eq!(
        projections
            .at()
            .efficiency_by_route("chat")
            .unwrap()
            .overall_permille(),
        Some(1_000)
    );

    // The output estimate learns the output tokens the settles used (they
    // report no usage): not their primary amount, one request each.
    let estimate = projections
        .at()
        .route_estimate("chat", Some(store::DEFAULT_MODEL), 1)
        .unwrap();
    assert_eq!(estimate.samples, 3, "{estimate:?}");
    assert!(estimate.p50_units >= Some(1_000), "{estimate:?}");

    let refusals = projections.at().refusals("t2").unwrap();
    assert_eq!(refusals.len(), 1);
    assert_eq!(refusals[0].dimension, Some(Dimension::OutputTokens));
    assert_eq!(refusals[0].burst_units, 20_000);
    check_conservation_in_dimensions(&projections, &driver);
}

/// Every stored partition's invariants hold in every dimension.
fn check_conservation_in_dimensions(
    projections: &reservoir_projections::Projections,
    driver: &Driver,
) {
    for b in projections.at().all_balances().unwrap() {
        let stored =
            reservoir_projections::projector::stored_partition(projections.db(), &b.key).unwrap();
        stored.partition.check_invariants().unwrap();
        assert_eq!(stored.partition.further, driver.partitions[&b.key].further);
    }
}
