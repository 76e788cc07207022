//! Shadow mode, lease expiry and USAGE_UNKNOWN.

use reservoir_core::*;

use crate::harness::*;

fn reserved_body(events: &[Event]) -> (Units, Units, Option<ShadowVerdict>) {
    match events.last().map(|e| &e.body) {
        Some(EventBody::Reserved {
            reserved_units,
            held_units,
            shadow,
            ..
        }) => (*reserved_units, *held_units, *shadow),
        other => panic!("not a reserve: {other:?}"),
    }
}

#[test]
fn shadow_mode_records_the_verdict_and_admits() {
    let mut h = Harness::open(Policy {
        shadow_mode: true,
        ..policy()
    });
    #[rustfmt::skip]
    let table: Vec<(&str, Units, (Units, Option<ShadowVerdict>), Units)> = vec![
        // id    units    (held, verdict)                                                available after
        ("a",    5_000,   (5_000, Some(ShadowVerdict::WouldAdmit)),                       5_000),
        ("b",    8_001,   (0, Some(ShadowVerdict::WouldRefuseRequestTooLarge)),           5_000),
        ("c",    6_000,   (0, Some(ShadowVerdict::WouldRefuseInsufficientCapacity)),      5_000),
        ("d",    5_000,   (5_000, Some(ShadowVerdict::WouldAdmit)),                       0),
        ("e",    1,       (0, Some(ShadowVerdict::WouldRefuseInsufficientCapacity)),      0),
    ];
    for (id, units, (held, verdict), available) in table {
        let events = h.ok(reserve(id, 1, units));
        assert_eq!(reserved_body(&events), (units, held, verdict), "{id}");
        assert_eq!(h.rec(id).held_units, held);
        assert_eq!(h.available(), available, "{id}");
    }
    // A shadow admission that held nothing still settles its real usage: from
    // available first, then as debt, and the books balance (checked per event).
    h.ok(start("c", "op-c"));
    h.ok(settle("c", None, 700));
    assert_eq!(
        (h.state("c"), h.p.debt_units()),
        (ReservationState::SettledWithDebt, 700)
    );
    let events = h.ok(reserve("f", 1, 10));
    assert_eq!(
        reserved_body(&events),
        (10, 0, Some(ShadowVerdict::WouldRefuseDebtOutstanding))
    );
    // Releasing a zero-hold shadow reservation refunds nothing.
    let events = h.ok(release("e"));
    assert_eq!(
        events[0].body,
        EventBody::Released {
            id: rid("e"),
            refunded_units: 0
        }
    );
}

#[test]
fn lease_expiry_happens_only_after_the_lease() {
    let mut h = Harness::new();
    h.at(1_000).ok(reserve("r", 1, 1_000));
    assert_eq!(h.rec("r").expires_at_ms, 181_000);
    for now in [1_000, 100_000, 180_999] {
        h.at(now);
        assert_eq!(
            h.rejected(expire("r")),
            Rejection::NotYetDue {
                id: rid("r"),
                due_at_ms: 181_000
            }
        );
    }
    h.at(181_000);
    let events = h.ok(expire("r"));
    assert_eq!(
        events.iter().map(|e| &e.body).collect::<Vec<_>>(),
        [
            &EventBody::ExpiryBegan { id: rid("r") },
            &EventBody::Expired {
                id: rid("r"),
                refunded_units: 1_000
            }
        ]
    );
    assert_eq!((h.ledger().reserved_units, h.available()), (0, 10_000));
    assert_eq!(h.rec("r").finished_at_ms, Some(181_000));
    // Start after the lease passed, even before the sweeper ran.
    let mut h = Harness::new();
    h.ok(reserve("r", 1, 1_000));
    h.at(180_000);
    assert_eq!(
        h.rejected(start("r", "op-1")),
        Rejection::LeaseExpired {
            id: rid("r"),
            expires_at_ms: 180_000
        }
    );
    // A started reservation never expires, however late.
    let mut h = Harness::new();
    h.ok(reserve("r", 1, 1_000));
    h.at(179_999).ok(start("r", "op-1"));
    h.at(u64::MAX / 2);
    assert_eq!(h.rejected(expire("r")).code(), "wrong_state");
    assert_eq!(h.ledger().reserved_units, 1_000);
}

#[test]
fn usage_unknown_keeps_capacity_until_an_operation_receipt() {
    let mut h = Harness::new();
    h.ok(reserve("r", 1, 1_000));
    h.at(10).ok(start("r", "op-1"));
    assert_eq!(h.rec("r").execution_deadline_ms, Some(600_010));
    h.at(600_009);
    assert_eq!(
        h.rejected(mark_unknown("r")),
        Rejection::NotYetDue {
            id: rid("r"),
            due_at_ms: 600_010
        }
    );
    h.at(600_010);
    assert_eq!(names(&h.ok(mark_unknown("r"))), ["UsageUnknown"]);
    h.noop(mark_unknown("r"));
    // UNKNOWN is never treated as unused: the hold stays, through refills and time.
    h.at(50_000_000).ok(Command::Refill);
    let l = h.ledger();
    assert_eq!(
        (l.reserved_units, l.available_units, l.spent_units),
        (1_000, 9_000, 0)
    );
    #[rustfmt::skip]
    let refused: Vec<(Command, Rejection)> = vec![
        (settle("r", None, 10),           Rejection::WrongState { id: rid("r"), state: ReservationState::UsageUnknown, transition: Transition::Settle }),
        (settle("r", Some("op-2"), 10),   Rejection::ExistsWithDifferentOperationId { id: rid("r") }),
        (release("r"),                    Rejection::WrongState { id: rid("r"), state: ReservationState::UsageUnknown, transition: Transition::Release }),
        (expire("r"),                     Rejection::WrongState { id: rid("r"), state: ReservationState::UsageUnknown, transition: Transition::Expire }),
    ];
    for (when, then) in refused {
        assert_eq!(h.rejected(when), then);
    }
    // Only the receipt naming the bound operation resolves it.
    let events = h.ok(settle("r", Some("op-1"), 300));
    assert_eq!(
        events[0].body,
        EventBody::Settled {
            id: rid("r"),
            actual_units: 300,
            refunded_units: 700,
            from_available_units: 0,
            overdraft_units: 0,
            overdraft_limit_breached: false,
            from_usage_unknown: true,
            usage: None,
        }
    );
    assert_eq!(
        (
            h.state("r"),
            h.ledger().reserved_units,
            h.ledger().spent_units
        ),
        (ReservationState::Settled, 0, 300)
    );
}

/// Usage and sizing are recorded, never moved: the ledger is what it would be
/// without them, and malformed ones are refused before any state is read.
#[test]
fn usage_and_sizing_are_recorded_beside_the_amounts() {
    let mut h = Harness::new();
    let sizing = Sizing {
        units: 1_500,
        input_units: 500,
        output_units: 1_000,
        rule: SizingRule::MaxTokens,
    };
    let with_sizing = |units| Command::Reserve {
        further_units: Vec::new(),
        id: rid("r"),
        digest: digest(1),
        units,
        sizing: Some(Sizing { units, ..sizing }),
    };
    // sizing.units must be the reserved units.
    let mismatched = Command::Reserve {
        further_units: Vec::new(),
        id: rid("r"),
        digest: digest(1),
        units: 1_500,
        sizing: Some(Sizing { units: 9, ..sizing }),
    };
    assert!(matches!(h.rejected(mismatched), Rejection::InvalidInput(_)));
    let events = h.ok(with_sizing(1_500));
    assert!(matches!(
        &events.last().unwrap().body,
        EventBody::Reserved { sizing: Some(s), reserved_units: 1_500, .. } if *s == sizing
    ));
    h.ok(start("r", "op-1"));
    let usage = Usage {
        cache_read_input_tokens: None,
        model: Some("model-a".into()),
        output_tokens: Some(700),
        counted_input_tokens: Some(500),
        reported_input_tokens: Some(517),
    };
    let settle_with = |usage: Usage| Command::Settle {
        further_actual_units: Vec::new(),
        id: rid("r"),
        operation_id: None,
        actual_units: 1_217,
        usage: Some(usage),
    };
    #[rustfmt::skip]
    let refused = [
        Usage { model: Some(String::new()), ..usage.clone() },
        Usage { model: Some("a|b".into()), ..usage.clone() },
        Usage { output_tokens: Some(u64::MAX), ..usage.clone() },
        Usage { reported_input_tokens: Some(u64::MAX), ..usage.clone() },
    ];
    for bad in refused {
        assert!(matches!(
            h.rejected(settle_with(bad)),
            Rejection::InvalidInput(_)
        ));
    }
    let events = h.ok(settle_with(usage.clone()));
    match &events[0].body {
        EventBody::Settled {
            actual_units,
            refunded_units,
            usage: recorded,
            ..
        } => assert_eq!(
            (*actual_units, *refunded_units, recorded),
            (1_217, 283, &Some(usage))
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.ledger().spent_units, 1_217);
    // A repeated settle is a no-op whatever usage it carries.
    h.noop(settle_with(Usage::default()));
}
