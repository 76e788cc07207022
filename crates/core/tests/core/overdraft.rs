//! Usage above the reservation, debt, its repayment by refills, and the burst cap.

use reservoir_core::policy::MAX_UNITS;
use reservoir_core::*;

use crate::harness::*;

/// Reserve `reserved` units as "r" at t = 0 (available 10,000 before), start it,
/// and return the harness ready to settle.
fn started(reserved: Units) -> Harness {
    let mut h = Harness::new();
    h.ok(reserve("r", 1, reserved));
    h.ok(start("r", "op-1"));
    h
}

#[test]
fn settle_takes_from_available_first_and_the_rest_is_overdraft() {
    use ReservationState::{Settled, SettledWithDebt};
    #[rustfmt::skip]
    let table: Vec<(Units, Units, (Units, Units, Units, bool), ReservationState, Units)> = vec![
        // reserved actual       (refunded, from available, overdraft, breach)   state            available after
        (1_000,  400,            (600, 0, 0, false),                            Settled,         9_600),
        (1_000,  0,              (1_000, 0, 0, false),                          Settled,         10_000),
        (1_000,  1_000,          (0, 0, 0, false),                              Settled,         9_000),
        (1_000,  5_000,          (0, 4_000, 0, false),                          Settled,         5_000),
        (1_000,  10_000,         (0, 9_000, 0, false),                          Settled,         0),
        (1_000,  12_000,         (0, 9_000, 2_000, false),                      SettledWithDebt, 0),
        (1_000,  15_000,         (0, 9_000, 5_000, false),                      SettledWithDebt, 0), // at the limit
        (1_000,  15_001,         (0, 9_000, 5_001, true),                       SettledWithDebt, 0), // one past it
        (8_000,  MAX_UNITS,      (0, 2_000, MAX_UNITS - 10_000, true),          SettledWithDebt, 0),
    ];
    for (reserved, actual, (refunded, from_available, overdraft, breach), state, available) in table
    {
        let mut h = started(reserved);
        let events = h.ok(settle("r", None, actual));
        let expected = EventBody::Settled {
            id: rid("r"),
            actual_units: actual,
            refunded_units: refunded,
            from_available_units: from_available,
            overdraft_units: overdraft,
            overdraft_limit_breached: breach,
            from_usage_unknown: false,
            usage: None,
        };
        assert_eq!(
            events.iter().map(|e| &e.body).collect::<Vec<_>>(),
            [&expected],
            "{reserved}/{actual}"
        );
        assert_eq!(h.state("r"), state);
        let l = h.ledger();
        assert_eq!(
            (
                l.available_units,
                l.reserved_units,
                l.spent_units,
                l.overdraft_issued_units,
                h.p.debt_units()
            ),
            (available, 0, actual, overdraft, overdraft),
            "{reserved}/{actual}"
        );
        assert_eq!(h.rec("r").overdraft_units, overdraft);
    }
}

#[test]
fn breach_counts_debt_already_outstanding() {
    let mut h = Harness::new();
    h.ok(reserve("a", 1, 1_000));
    h.ok(reserve("b", 2, 1_000));
    h.ok(start("a", "op-a"));
    h.ok(start("b", "op-b"));
    // a: 12,000 above its hold, 8,000 available → 4,000 overdraft (within 5,000).
    let a = h.ok(settle("a", None, 13_000));
    assert!(matches!(
        a[0].body,
        EventBody::Settled {
            overdraft_units: 4_000,
            overdraft_limit_breached: false,
            ..
        }
    ));
    // b: 1,001 above its hold, nothing available → debt 5,001: breach, recorded in full.
    let b = h.ok(settle("b", None, 2_001));
    assert!(matches!(
        b[0].body,
        EventBody::Settled {
            overdraft_units: 1_001,
            overdraft_limit_breached: true,
            ..
        }
    ));
    assert_eq!(h.p.debt_units(), 5_001);
    assert_eq!(h.ledger().spent_units, 15_001);
}

/// Debt 2,000 at t = 0 (available 0). Refill: one unit per 6 ms.
fn in_debt() -> Harness {
    let mut h = started(1_000);
    h.ok(settle("r", None, 12_000));
    assert_eq!((h.available(), h.p.debt_units()), (0, 2_000));
    h
}

#[test]
fn admission_is_zero_while_debt_is_outstanding() {
    let mut h = in_debt();
    // Every size is refused while debt > 0 (too large is still refused as such
    // first). The hint covers repaying the debt and then refilling the units
    // (one per 6 ms): retrying then, with no other traffic, admits.
    for units in [1, 2, 100, 7_999, 8_000] {
        assert_eq!(
            h.rejected(reserve("n", 1, units)),
            Rejection::DebtOutstanding {
                dimension: reservoir_core::Dimension::Tokens,
                debt_units: 2_000,
                retry_after_ms: Some((2_000 + units) * 6)
            }
        );
    }
    assert_eq!(
        h.rejected(reserve("n", 1, 8_001)).code(),
        "request_too_large"
    );
    // Half repaid: still frozen, and nothing reached `available`.
    h.at(6_000);
    let refill = h.ok(Command::Refill);
    assert_eq!(
        refill[0].body,
        EventBody::Refilled {
            minted_units: 1_000,
            repaid_units: 1_000,
            remainder: 0
        }
    );
    assert_eq!((h.available(), h.p.debt_units()), (0, 1_000));
    assert_eq!(
        h.rejected(reserve("n", 1, 1)),
        Rejection::DebtOutstanding {
            dimension: reservoir_core::Dimension::Tokens,
            debt_units: 1_000,
            retry_after_ms: Some(6_006)
        }
    );
    // A reserve one tick before full repayment is refused and records nothing.
    h.at(11_999);
    assert_eq!(h.rejected(reserve("n", 1, 1)).code(), "debt_outstanding");
    // Fully repaid at 12,000 ms: debt 0 but the bucket is still empty.
    h.at(12_000);
    assert_eq!(
        h.rejected(reserve("n", 1, 1)),
        Rejection::InsufficientCapacity {
            dimension: reservoir_core::Dimension::Tokens,
            requested_units: 1,
            available_units: 0,
            retry_after_ms: Some(6)
        }
    );
    h.ok(Command::Refill);
    assert_eq!((h.available(), h.p.debt_units()), (0, 0));
    // Admission resumes with the next unit refilled (the reserve carries the refill).
    h.at(12_006);
    let events = h.ok(reserve("n", 1, 1));
    assert_eq!(names(&events), ["Refilled", "Reserved"]);
    assert_eq!(
        events[0].body,
        EventBody::Refilled {
            minted_units: 1,
            repaid_units: 0,
            remainder: 0
        }
    );
}

#[test]
fn refill_repays_debt_before_available() {
    #[rustfmt::skip]
    let table: Vec<(u64, (Units, Units, u64), (Units, Units))> = vec![
        // refill at    Refilled (minted, repaid, remainder)    (available, debt) after
        (7,             (1, 1, 10_000),                         (0, 1_999)),
        (6_000,         (1_000, 1_000, 0),                      (0, 1_000)),
        (12_000,        (2_000, 2_000, 0),                      (0, 0)),
        (18_000,        (3_000, 2_000, 0),                      (1_000, 0)),
        (1_000_000,     (12_000, 2_000, 0),                     (10_000, 0)), // capped at the burst
    ];
    for (at, (minted, repaid, remainder), (available, debt)) in table {
        let mut h = in_debt();
        h.at(at);
        let events = h.ok(Command::Refill);
        assert_eq!(
            events[0].body,
            EventBody::Refilled {
                minted_units: minted,
                repaid_units: repaid,
                remainder
            },
            "at {at}"
        );
        assert_eq!(
            (h.available(), h.p.debt_units()),
            (available, debt),
            "at {at}"
        );
        assert_eq!(h.ledger().overdraft_repaid_units, repaid);
    }
}

#[test]
fn refill_never_lifts_available_plus_reserved_above_burst() {
    let burst = policy().burst_units;
    let mut h = Harness::new();
    // Full bucket: time passing credits nothing and drops the remainder.
    h.at(1_000_003);
    let events = h.ok(Command::Refill);
    assert_eq!(
        events[0].body,
        EventBody::Refilled {
            minted_units: 0,
            repaid_units: 0,
            remainder: 0
        }
    );
    h.ok(reserve("a", 1, 4_000));
    h.ok(start("a", "op-a"));
    h.ok(reserve("b", 2, 3_000));
    h.ok(settle("a", None, 2_500)); // spent 2,500: room for exactly 2,500
    let mut now = h.now;
    for step in [1, 5, 6, 600, 6_000, 60_000, 10_000_000] {
        now += step;
        h.at(now);
        h.run(Command::Refill).unwrap();
        let l = h.ledger();
        assert!(
            l.available_units + l.reserved_units <= burst,
            "after +{step}: {l:?}"
        );
    }
    let l = h.ledger();
    assert_eq!(
        (l.available_units, l.reserved_units, l.minted_units),
        (7_000, 3_000, 2_500)
    );
    // With nothing earned yet, a refill is a no-op.
    h.noop(Command::Refill);
}
