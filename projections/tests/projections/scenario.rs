//! The first seed's scenario end to end, in simulated time: a tenant with a
//! 120,000 tokens-a-minute contract sends ~500-token prompts whose completions
//! are skewed (mean ≈ 1,850, p90 ≈ 2,500, clipped to [200, 4,000]), each call
//! taking 30 s, at 110% of the contract. Once with a fixed 4,000-token output
//! reservation, once sized the way `reservoir serve` sizes a reserve without
//! units: `size_reservation` with the route's p90 from the live projection
//! (cold: the ceiling) and the input drift the projection measured.
//!
//! The bucket refills the contract (120,000 a minute) and holds 90,000 (45 s
//! of it). Reservations are held for the whole call, so — the seed's C ÷ R
//! arithmetic — the bucket lets at most 90,000 ÷ R calls be in flight, and the
//! tenant needs 28 (56 a minute × 30 s): fixed reservations of 4,500 allow 20,
//! p90-sized ones of ≈ 3,000 allow 30.
//!
//! Every command goes through the core's `decide`/`apply` and the real
//! embedded log; the projector follows the log as the server's does, and the
//! sizing reads what it has projected so far (so early reserves are sized
//! cold, as on a fresh route).

use std::collections::BTreeMap;

use reservoir_core::{
    size_reservation, Command, EstimatorConfig, OperationId, RequestDigest, ReservationId, Usage,
};
use reservoir_projections::{store, Projector, Verdict};

use super::support::*;

const MINUTES: u64 = 30;
/// Minutes left out of the throughput figures (the digest's route warms up).
const WARM_UP_MINUTES: u64 = 5;
/// 110% of the contract: 120,000 × 1.1 / (500 + 1,850) ≈ 56 calls a minute.
const CALLS_PER_MINUTE: u64 = 56;

/// The p90 estimator, as a policy would publish it.
fn p90() -> EstimatorConfig {
    EstimatorConfig {
        quantile_ppm: 900_000,
        floor_units: 200,
        ceiling_units: 4_000,
        min_samples: 100,
        default_max_tokens: None,
        sibling_route: None,
    }
}

/// The seed's contract with a bucket of 45 s of it (see the module docs).
fn scenario_contract(tenant: &str, route: &str) -> reservoir_core::Policy {
    let mut policy = contract(tenant, route);
    policy.burst_units = 90_000;
    policy.opening_units = 90_000;
    policy
}

#[derive(Debug, Default)]
struct Outcome {
    offered: u64,
    admitted: u64,
    refused: u64,
    /// Settled units (actual use) after the warm-up.
    settled_units: u64,
    /// Of those settles, the reserved units (efficiency = settled ÷ reserved).
    reserved_units: u64,
    /// Settles that used more than was reserved, and by how much at most.
    overshoots: u64,
    max_overshoot_units: u64,
    max_debt_units: u64,
}

impl Outcome {
    /// Settled units per minute after the warm-up, as a share of the contract.
    fn throughput(&self) -> f64 {
        let minutes = (MINUTES - WARM_UP_MINUTES) as f64;
        self.settled_units as f64 / minutes / CONTRACT_PER_MINUTE as f64
    }

    fn efficiency(&self) -> f64 {
        self.settled_units as f64 / self.reserved_units as f64
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Sizing {
    Fixed4000,
    DigestP90,
}

/// Runs one tenant on its own route for `MINUTES` of simulated time.
async fn run(tenant: &str, route: &str, sizing: Sizing) -> (Outcome, Verdict) {
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let key = key(tenant, route);
    driver.open_partition(&key, scenario_contract(tenant, route), 0);
    driver.flush().await;
    let db = store::open(dir.path().join("projection")).unwrap();
    let mut projector = Projector::open(driver.log.clone(), db, config(1_024)).unwrap();
    let projections = projector.projections();

    let mut rng = Rng::new(0x5EED);
    let mut out = Outcome::default();
    // Settle time → (id, reserved, actual output).
    let mut in_flight: BTreeMap<u64, Vec<(ReservationId, u64, u64)>> = BTreeMap::new();
    let mut n = 0u64;
    for second in 0..MINUTES * 60 {
        let now = second * SECOND_MS;
        let measured = second >= WARM_UP_MINUTES * 60;
        for (id, reserved, output) in in_flight.remove(&now).unwrap_or_default() {
            let actual = INPUT_UNITS + output;
            let settle = Command::Settle {
                further_actual_units: Vec::new(),
                id,
                operation_id: None,
                actual_units: actual,
                usage: Some(Usage {
                    cache_read_input_tokens: None,
                    model: Some("model-a".into()),
                    output_tokens: Some(output),
                    counted_input_tokens: Some(INPUT_UNITS),
                    reported_input_tokens: Some(INPUT_UNITS),
                }),
            };
            driver.submit(&key, settle, now).unwrap();
            if measured {
                out.settled_units += actual;
                out.reserved_units += reserved;
                if actual > reserved {
                    out.overshoots += 1;
                    out.max_overshoot_units = out.max_overshoot_units.max(actual - reserved);
                }
            }
        }
        let _ = driver.submit(&key, Command::Refill, now);
        for _ in 0..steady(second, CALLS_PER_MINUTE) {
            n += 1;
            out.offered += 1;
            let units = match sizing {
                Sizing::Fixed4000 => INPUT_UNITS + 4_000,
                Sizing::DigestP90 => {
                    // What `reservoir serve` does for a reserve without units.
                    let config = p90();
                    let own = projections
                        .at()
                        .route_estimate_at(route, None, config.quantile_ppm)
                        .unwrap();
                    let drift = projections
                        .at()
                        .input_drift(route)
                        .unwrap()
                        .and_then(|d| d.multiplier_ppm())
                        .unwrap_or(1_000_000);
                    size_reservation(&config, INPUT_UNITS, drift, None, own, None)
                        .unwrap()
                        .units
                }
            };
            let id = ReservationId::new(format!("c{n}")).unwrap();
            let reserve = Command::Reserve {
                further_units: Vec::new(),
                id: id.clone(),
                digest: RequestDigest([0; 32]),
                units,
                sizing: None,
            };
            if driver.submit(&key, reserve, now).is_err() {
                out.refused += 1;
                continue;
            }
            out.admitted += 1;
            let start = Command::Start {
                id: id.clone(),
                operation_id: OperationId::new(format!("op{n}")).unwrap(),
            };
            driver.submit(&key, start, now).unwrap();
            in_flight
                .entry(now + CALL_MS)
                .or_default()
                .push((id, units, output_units(&mut rng)));
        }
        let ledger = &driver.partitions[&key].ledger;
        out.max_debt_units = out
            .max_debt_units
            .max(ledger.debt_units().expect("debt is defined"));
        ledger.check().unwrap();
        if second % 10 == 0 {
            driver.flush().await;
            projector.catch_up().await.unwrap();
        }
    }
    driver.flush().await;
    projector.catch_up().await.unwrap();
    // The projection agrees with the writer and conserves.
    let balance = projections.at().partition_balance(&key).unwrap().unwrap();
    assert_eq!(balance.ledger, driver.partitions[&key].ledger);
    balance.ledger.check().unwrap();
    let verdict = projections.at().diagnosis(tenant).unwrap().verdict;
    (out, verdict)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_sizing_reaches_the_contract_where_fixed_sizing_cannot() {
    let (fixed, fixed_verdict) = run("fixed", "summarize", Sizing::Fixed4000).await;
    let (sized, sized_verdict) = run("sized", "summarize-sized", Sizing::DigestP90).await;
    for (name, o, v) in [
        ("fixed 4,000", &fixed, fixed_verdict),
        ("digest p90", &sized, sized_verdict),
    ] {
        println!(
            "{name}: throughput {:.1}% of the contract, efficiency {:.3}, \
             admitted {} of {} offered ({} refused), overshoots {} (max {} units), \
             max debt {} units, diagnosis {v:?}",
            o.throughput() * 100.0,
            o.efficiency(),
            o.admitted,
            o.offered,
            o.refused,
            o.overshoots,
            o.max_overshoot_units,
            o.max_debt_units,
        );
    }
    // Fixed reservations hold 4,500 for every ~2,350 used: about one call in
    // three is refused (the seed's customer saw the same) and the tenant gets
    // ~3/4 of the contract. (The seed's graph says 48%; with 30 s calls that
    // needs a bucket so small that p90 sizing could not reach 90% either.)
    assert!(fixed.throughput() < 0.8, "fixed: {fixed:?}");
    assert!(fixed.refused * 4 > fixed.offered, "fixed: {fixed:?}");
    assert_eq!(fixed_verdict, Verdict::OverReservation);
    // Sized at the route's p90: the contract, good efficiency, bounded overshoot.
    assert!(sized.throughput() >= 0.9, "sized: {sized:?}");
    assert!(sized.throughput() - fixed.throughput() >= 0.2);
    assert!(
        (0.75..=0.9).contains(&sized.efficiency()),
        "sized efficiency {}",
        sized.efficiency()
    );
    // About one call in ten outgrows a p90 reservation, never by more than
    // the clip (4,000) minus the p90, and the debt stays within the overdraft.
    let settles = sized.reserved_units / (INPUT_UNITS + 2_000);
    assert!(sized.overshoots * 5 < settles, "sized: {sized:?}");
    assert!(sized.max_overshoot_units < 2_000, "sized: {sized:?}");
    assert!(
        sized.max_debt_units <= scenario_contract("sized", "summarize-sized").max_overdraft_units,
        "sized: {sized:?}"
    );
    assert_ne!(sized_verdict, Verdict::OverReservation);
}
