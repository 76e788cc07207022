//! The diagnosis table on synthetic tenants, simulated in writer time through
//! the core and the real log, then projected: an over-reserving tenant, a
//! bursty one, one whose limit is too low, and a healthy one.

use std::collections::BTreeMap;
use std::sync::Arc;

use reservoir_core::{Command, OperationId, RequestDigest, ReservationId};
use reservoir_projections::{store, Projector, Verdict};

use super::support::*;

const MINUTES: u64 = 20;

struct Tenant {
    name: &'static str,
    reserve_units: u64,
    /// Calls arriving in simulated second `t`.
    arrivals: fn(u64) -> u64,
}

#[tokio::test]
async fn diagnosis_names_the_cause() {
    let tenants = [
        // Fixed 4,000-token output reservation, offered 110% of the contract.
        Tenant {
            name: "over",
            reserve_units: INPUT_UNITS + 4_000,
            arrivals: |t| steady(t, 56),
        },
        // Well-sized reservations, 80 calls at once every five minutes.
        Tenant {
            name: "bursty",
            reserve_units: INPUT_UNITS + 2_500,
            arrivals: |t| if t % 300 == 10 { 80 } else { 0 },
        },
        // Well-sized reservations, steady load at 150% of the contract.
        Tenant {
            name: "low-limit",
            reserve_units: INPUT_UNITS + 2_500,
            arrivals: |t| steady(t, 77),
        },
        // Well within the contract.
        Tenant {
            name: "healthy",
            reserve_units: INPUT_UNITS + 2_500,
            arrivals: |t| steady(t, 10),
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut driver = Driver::open(&dir.path().join("log"), "writer-1").await;
    let mut rng = Rng::new(0xD1A6);
    let mut in_flight: BTreeMap<u64, Vec<(usize, ReservationId, u64)>> = BTreeMap::new();
    for t in &tenants {
        driver.open_partition(&key(t.name, "summarize"), contract(t.name, "summarize"), 0);
    }
    let mut n = 0u64;
    for second in 0..MINUTES * 60 {
        let now = second * SECOND_MS;
        for (i, id, actual) in in_flight.remove(&now).unwrap_or_default() {
            let settle = Command::Settle {
                further_actual_units: Vec::new(),
                id,
                operation_id: None,
                actual_units: actual,
                usage: None,
            };
            driver
                .submit(&key(tenants[i].name, "summarize"), settle, now)
                .unwrap();
        }
        for (i, tenant) in tenants.iter().enumerate() {
            let key = key(tenant.name, "summarize");
            let _ = driver.submit(&key, Command::Refill, now);
            for _ in 0..(tenant.arrivals)(second) {
                n += 1;
                let id = ReservationId::new(format!("c{n}")).unwrap();
                let reserve = Command::Reserve {
                    further_units: Vec::new(),
                    id: id.clone(),
                    digest: RequestDigest([0; 32]),
                    units: tenant.reserve_units,
                    sizing: None,
                };
                if driver.submit(&key, reserve, now).is_err() {
                    continue;
                }
                let start = Command::Start {
                    id: id.clone(),
                    operation_id: OperationId::new(format!("op{n}")).unwrap(),
                };
                driver.submit(&key, start, now).unwrap();
                let actual = INPUT_UNITS + output_units(&mut rng);
                in_flight
                    .entry(now + CALL_MS)
                    .or_default()
                    .push((i, id, actual));
            }
        }
        if second % 30 == 0 {
            driver.flush().await;
        }
    }
    driver.flush().await;

    let db = store::open(dir.path().join("projection")).unwrap();
    let mut projector = Projector::open(driver.log.clone(), db, config(1_024)).unwrap();
    projector.catch_up().await.unwrap();
    let projections = projector.projections();
    let expected = [
        ("over", Verdict::OverReservation),
        ("bursty", Verdict::BurstCapacity),
        ("low-limit", Verdict::LimitTooLow),
        ("healthy", Verdict::Healthy),
    ];
    let mut failures = Vec::new();
    for (tenant, verdict) in expected {
        let d = projections.at().diagnosis(tenant).unwrap();
        println!("{d:?}");
        if d.verdict != verdict {
            failures.push(format!("{tenant}: expected {verdict:?}, got {d:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    drop(Arc::clone(&driver.log));
}
