//! Several dimensions in one reservation (issue 15): requests, input tokens
//! and output tokens held at once, refused naming the limiting dimension,
//! settled and owed per dimension. The harness checks conservation in every
//! dimension after every event, and that the history replays.

use reservoir_core::*;

use crate::harness::*;

/// `Policy::example_three_dimensions`: 60 requests a minute (primary, largest
/// reservation 1), 100,000 input tokens and 20,000 output tokens a minute,
/// every bucket full at t = 0; overdraft up to 50,000 input / 10,000 output.
fn three() -> Policy {
    Policy::example_three_dimensions("tenant-7", "chat.generate", 31)
}

fn reserve3(id: &str, requests: Units, input: Units, output: Units) -> Command {
    Command::Reserve {
        id: rid(id),
        digest: digest(1),
        units: requests,
        sizing: None,
        further_units: vec![input, output],
    }
}

fn settle3(id: &str, input: Units, output: Units) -> Command {
    Command::Settle {
        id: rid(id),
        operation_id: None,
        actual_units: 1,
        usage: None,
        further_actual_units: vec![input, output],
    }
}

/// `(available, reserved, debt)` in every dimension, primary first.
fn books(h: &Harness) -> Vec<(Units, Units, Units)> {
    h.p.ledgers()
        .map(|l| (l.available_units, l.reserved_units, l.debt_units().unwrap()))
        .collect()
}

type Setup = fn(&mut Harness);

/// Reserves, starts and settles `a`, spending exactly what it held.
fn spend(h: &mut Harness, input: Units, output: Units) {
    h.ok(reserve3("a", 1, input, output));
    h.ok(start("a", "op-1"));
    h.ok(settle3("a", input, output));
}

#[test]
fn each_dimension_refusing_alone_is_named_with_its_own_retry_after() {
    use Dimension::*;
    let one_request_burst = || Policy {
        burst_units: 1,
        opening_units: 1,
        ..three()
    };
    // Each setup spends (settles) what it takes, so only refill stands between
    // the refused reserve and its admission.
    #[rustfmt::skip]
    let table: Vec<(&str, Policy, Setup, Command, Rejection)> = vec![
        ("requests empty", one_request_burst(), |h| spend(h, 10, 10), reserve3("b", 1, 10, 10),
            // 60 a minute: one request per second.
            Rejection::InsufficientCapacity { dimension: Requests, requested_units: 1, available_units: 0, retry_after_ms: Some(1_000) }),
        ("input short", three(), |h| spend(h, 90_000, 10), reserve3("b", 1, 20_000, 10),
            // 10,000 short at 100,000 a minute: 6 s.
            Rejection::InsufficientCapacity { dimension: InputTokens, requested_units: 20_000, available_units: 10_000, retry_after_ms: Some(6_000) }),
        ("output short", three(), |h| spend(h, 10, 15_000), reserve3("b", 1, 10, 10_000),
            // 5,000 short at 20,000 a minute: 15 s.
            Rejection::InsufficientCapacity { dimension: OutputTokens, requested_units: 10_000, available_units: 5_000, retry_after_ms: Some(15_000) }),
        ("input and output short: the later one", three(), |h| spend(h, 90_000, 15_000), reserve3("b", 1, 20_000, 10_000),
            Rejection::InsufficientCapacity { dimension: OutputTokens, requested_units: 10_000, available_units: 5_000, retry_after_ms: Some(15_000) }),
        ("two requests at once", three(), |_| {}, reserve3("b", 2, 10, 10),
            Rejection::RequestTooLarge { dimension: Requests, requested_units: 2, max_units: 1 }),
        ("output above its largest", three(), |_| {}, reserve3("b", 1, 10, 20_001),
            Rejection::RequestTooLarge { dimension: OutputTokens, requested_units: 20_001, max_units: 20_000 }),
        ("input above its largest", three(), |_| {}, reserve3("b", 1, 100_001, 10),
            Rejection::RequestTooLarge { dimension: InputTokens, requested_units: 100_001, max_units: 100_000 }),
    ];
    for (name, policy, given, when, then) in table {
        let mut h = Harness::open(policy);
        given(&mut h);
        let before = books(&h);
        let rejection = h.rejected(when.clone());
        assert_eq!(rejection, then, "{name}");
        assert_eq!(books(&h), before, "{name}: a refusal holds nothing");
        // The refusal is logged with the limiting dimension and its own units.
        let logged = refusal_event(&h.p, &when, &rejection, h.now).expect("logged");
        let EventBody::AdmissionRefused {
            requested_units,
            dimension,
            ..
        } = logged.body
        else {
            panic!("{name}: {logged:?}");
        };
        assert_eq!(dimension, rejection.dimension(), "{name}");
        match rejection {
            Rejection::InsufficientCapacity {
                requested_units: r, ..
            }
            | Rejection::RequestTooLarge {
                requested_units: r, ..
            } => assert_eq!(requested_units, r, "{name}"),
            _ => unreachable!(),
        }
        // Retrying at exactly the hinted time admits it when nothing else changed.
        if let Some(ms) = rejection.retry_after_ms() {
            h.advance(ms);
            h.ok(when);
        }
    }
}

#[test]
fn a_reserve_that_fits_every_dimension_holds_in_all_and_refunds_in_all() {
    let mut h = Harness::open(three());
    let events = h.ok(reserve3("a", 1, 1_000, 2_000));
    assert_eq!(
        events[0].further,
        vec![
            DimensionAmounts::Reserved {
                reserved_units: 1_000,
                held_units: 1_000
            },
            DimensionAmounts::Reserved {
                reserved_units: 2_000,
                held_units: 2_000
            },
        ]
    );
    assert_eq!(
        books(&h),
        vec![(59, 1, 0), (99_000, 1_000, 0), (18_000, 2_000, 0)]
    );
    h.ok(release("a"));
    assert_eq!(books(&h), vec![(60, 0, 0), (100_000, 0, 0), (20_000, 0, 0)]);
    // An expiry gives back every dimension too.
    h.ok(reserve3("b", 1, 500, 700));
    h.advance(180_000);
    h.ok(expire("b"));
    assert_eq!(h.state("b"), ReservationState::Expired);
    for l in h.p.ledgers() {
        assert_eq!(l.reserved_units, 0);
    }
}

#[test]
fn usage_above_the_hold_in_one_dimension_puts_debt_there_only_and_freezes_admission() {
    let mut h = Harness::open(three());
    h.ok(reserve3("a", 1, 1_000, 2_000));
    h.ok(start("a", "op-1"));
    // Output: 2,000 held, 18,000 available, 23,000 used: 3,000 of debt.
    let settled = h.ok(settle3("a", 800, 23_000));
    assert_eq!(
        settled[0].further,
        vec![
            DimensionAmounts::Settled {
                actual_units: 800,
                refunded_units: 200,
                from_available_units: 0,
                overdraft_units: 0,
                overdraft_limit_breached: false
            },
            DimensionAmounts::Settled {
                actual_units: 23_000,
                refunded_units: 0,
                from_available_units: 18_000,
                overdraft_units: 3_000,
                overdraft_limit_breached: false
            },
        ]
    );
    assert_eq!(h.state("a"), ReservationState::SettledWithDebt);
    assert_eq!(books(&h), vec![(59, 0, 0), (99_200, 0, 0), (0, 0, 3_000)]);
    // Frozen while output owes, whatever the other dimensions hold.
    let frozen = h.rejected(reserve3("b", 1, 10, 10));
    assert_eq!(
        frozen,
        Rejection::DebtOutstanding {
            dimension: Dimension::OutputTokens,
            debt_units: 3_000,
            // 3,000 to repay and 10 to refill, at 20,000 a minute.
            retry_after_ms: Some(9_030),
        }
    );
    // Refill repays it first; then admission resumes.
    h.advance(9_030);
    h.ok(reserve3("b", 1, 10, 10));
    let output = h.p.ledger_of(2);
    assert_eq!(output.overdraft_repaid_units, 3_000);
    assert_eq!(output.debt_units(), Some(0));
    // The same settle again is a retry; other units are another request.
    h.noop(settle3("a", 800, 23_000));
    assert!(matches!(
        h.rejected(settle3("a", 800, 22_000)),
        Rejection::ExistsWithDifferentActualUnits { .. }
    ));
}

#[test]
fn overdraft_past_one_dimensions_maximum_is_flagged_in_that_dimension() {
    let mut h = Harness::open(three());
    h.ok(reserve3("a", 1, 1_000, 2_000));
    h.ok(start("a", "op-1"));
    // Output: 11,000 past everything held and available; its maximum is 10,000.
    let settled = h.ok(settle3("a", 1_000, 31_000));
    let breached: Vec<bool> = settled[0]
        .further
        .iter()
        .map(|a| {
            matches!(
                a,
                DimensionAmounts::Settled {
                    overdraft_limit_breached: true,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(breached, vec![false, true]);
    assert_eq!(h.p.ledger_of(2).debt_units(), Some(11_000));
}

#[test]
fn commands_must_name_every_dimension() {
    let mut h = Harness::open(three());
    let short = Command::Reserve {
        id: rid("a"),
        digest: digest(1),
        units: 1,
        sizing: None,
        further_units: vec![10],
    };
    assert_eq!(
        h.rejected(short),
        Rejection::InvalidInput(InvalidInput::DimensionCount {
            given: 2,
            expected: 3
        })
    );
    h.ok(reserve3("a", 1, 10, 10));
    h.ok(start("a", "op-1"));
    assert!(matches!(
        h.rejected(settle("a", None, 1)),
        Rejection::InvalidInput(InvalidInput::DimensionCount { .. })
    ));
    // A one-dimension policy takes no further amounts.
    let mut one = Harness::new();
    assert!(matches!(
        one.rejected(reserve3("a", 1, 10, 10)),
        Rejection::InvalidInput(InvalidInput::DimensionCount { .. })
    ));
}

#[test]
fn shadow_refusals_hold_nothing_in_any_dimension() {
    let mut h = Harness::open(Policy {
        shadow_mode: true,
        ..three()
    });
    h.ok(reserve3("a", 1, 90_000, 10));
    let events = h.ok(reserve3("b", 1, 20_000, 10));
    let EventBody::Reserved {
        shadow, held_units, ..
    } = &events[0].body
    else {
        panic!("{events:?}");
    };
    assert_eq!(
        (*shadow, *held_units),
        (Some(ShadowVerdict::WouldRefuseInsufficientCapacity), 0)
    );
    assert_eq!(
        books(&h),
        vec![(59, 1, 0), (10_000, 90_000, 0), (19_990, 10, 0)]
    );
}

#[test]
fn apply_refuses_amounts_that_do_not_match_the_policys_dimensions() {
    let h = Harness::open(three());
    let mut event = h.next_event(EventBody::Refilled {
        minted_units: 0,
        repaid_units: 0,
        remainder: 0,
    });
    // A refill without its further amounts, and one with a reserve's.
    assert!(matches!(
        try_apply(&mut h.p.clone(), &event),
        Err(ApplyError::Inconsistent(_))
    ));
    event.further = vec![
        DimensionAmounts::Reserved {
            reserved_units: 0,
            held_units: 0,
        };
        2
    ];
    assert!(matches!(
        try_apply(&mut h.p.clone(), &event),
        Err(ApplyError::Inconsistent(_))
    ));
    // An event that moves nothing carries nothing.
    let mut started = h.next_event(EventBody::Closed);
    started.further = vec![DimensionAmounts::Refunded { refunded_units: 0 }; 2];
    assert!(matches!(
        try_apply(&mut h.p.clone(), &started),
        Err(ApplyError::Inconsistent(_))
    ));
}

#[test]
fn refill_credits_every_dimension_at_its_own_rate() {
    let mut h = Harness::open(three());
    h.ok(reserve3("a", 1, 50_000, 10_000));
    h.ok(start("a", "op-1"));
    h.ok(settle3("a", 50_000, 10_000));
    h.advance(3_000);
    h.ok(Command::Refill);
    // 3 s: requests +3 (capped at the burst of 60), input +5,000, output +1,000.
    assert_eq!(books(&h), vec![(60, 0, 0), (55_000, 0, 0), (11_000, 0, 0)]);
}

#[test]
fn a_move_takes_and_gives_every_dimension_and_the_sums_stay() {
    let mut from = Harness::open(three());
    let mut to = Harness::open(Policy {
        opening_units: 0,
        dimensions: three()
            .dimensions
            .into_iter()
            .map(|l| DimensionLimit {
                opening_units: 0,
                ..l
            })
            .collect(),
        ..Policy::example_three_dimensions("tenant-7", "chat.generate", 32)
    });
    let total = |a: &Harness, b: &Harness| -> Vec<Units> {
        a.p.ledgers()
            .zip(b.p.ledgers())
            .map(|(x, y)| x.available_units + y.available_units)
            .collect()
    };
    let before = total(&from, &to);
    let out = from.ok(Command::MoveOut {
        move_id: mid("m-1"),
        to: key_for(&to.p.policy.clone().unwrap()),
        units: 10,
        further_units: vec![20_000, 5_000],
    });
    let EventBody::MovedOut {
        units, debt_units, ..
    } = out[0].body
    else {
        panic!("{out:?}");
    };
    to.ok(Command::MoveIn {
        move_id: mid("m-1"),
        from: key_for(&three()),
        units,
        debt_units,
        further: out[0].further.clone(),
    });
    assert_eq!(total(&from, &to), before);
    assert_eq!(books(&to), vec![(10, 0, 0), (20_000, 0, 0), (5_000, 0, 0)]);
    // More than is available in one dimension is refused, naming it.
    assert!(matches!(
        from.rejected(Command::MoveOut {
            move_id: mid("m-2"),
            to: key_for(&to.p.policy.clone().unwrap()),
            units: 1,
            further_units: vec![1, 15_001],
        }),
        Rejection::InsufficientCapacity {
            dimension: Dimension::OutputTokens,
            ..
        }
    ));
}
