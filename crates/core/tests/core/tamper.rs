//! `try_apply` on events a writer would never produce (a corrupt or tampered log):
//! the exact finding, and the state left exactly as it was.

use reservoir_core::*;

use crate::harness::*;

/// a: STARTED holding 1,000; b: RESERVED holding 500; available 8,500; at t = 100;
/// five events so far (the reserve at t = 100 carried an empty refill).
fn setup() -> Harness {
    let mut h = Harness::open(Policy {
        emergency_mode: EmergencyMode::Enabled,
        ..policy()
    });
    h.ok(reserve("a", 1, 1_000));
    h.ok(start("a", "op-a"));
    h.at(100).ok(reserve("b", 2, 500));
    h
}

fn settled(
    actual: Units,
    refunded: Units,
    from_available: Units,
    overdraft: Units,
    from_unknown: bool,
) -> EventBody {
    EventBody::Settled {
        id: rid("a"),
        actual_units: actual,
        refunded_units: refunded,
        from_available_units: from_available,
        overdraft_units: overdraft,
        overdraft_limit_breached: false,
        from_usage_unknown: from_unknown,
        usage: None,
    }
}

fn reserved(id: &str, reserved_units: Units, held_units: Units) -> EventBody {
    EventBody::Reserved {
        id: rid(id),
        digest: digest(9),
        reserved_units,
        held_units,
        expires_at_ms: 1_000_000,
        shadow: None,
        sizing: None,
        shadow_dimension: None,
    }
}

#[test]
fn tampered_events_are_refused_without_touching_state() {
    let key = key_for(&policy());
    let shard = |units| EventBody::ShardIssued {
        shard_id: sid("s"),
        units,
        gateway_id: "gw".into(),
        boot_epoch: 1,
        expires_at_ms: 5,
        fence_epoch: 1,
        signature: String::new(),
    };
    let moved_in = EventBody::MovedIn {
        move_id: mid("m"),
        from: key.clone(),
        units: 0,
        debt_units: 0,
    };
    // Inconsistent carries prose; rows name the check, and match on the variant only.
    let inconsistent = |_check: &str| ApplyError::Inconsistent("");
    type Tamper = Box<dyn Fn(&Harness) -> Event>;
    let at =
        |body: EventBody| -> Tamper { Box::new(move |h: &Harness| h.next_event(body.clone())) };
    #[rustfmt::skip]
    let table: Vec<(&str, Tamper, ApplyError)> = vec![
        ("sequence gap",              Box::new(|h: &Harness| Event { sequence: h.next_sequence() + 1, ..h.next_event(EventBody::Closed) }),
                                      ApplyError::SequenceGap { expected: 6, found: 7 }),
        ("sequence replayed",         Box::new(|h: &Harness| Event { sequence: h.next_sequence() - 1, ..h.next_event(EventBody::Closed) }),
                                      ApplyError::SequenceGap { expected: 6, found: 5 }),
        ("time went backwards",       Box::new(|h: &Harness| Event { at_ms: 99, ..h.next_event(EventBody::Closed) }),
                                      ApplyError::TimeWentBackwards { at_ms: 99, last_ms: 100 }),
        ("opened twice",              at(EventBody::PartitionOpened { key: key.clone(), policy: policy(), opening_units: 10_000 }),
                                      ApplyError::AlreadyOpen),
        ("reservation created twice", at(reserved("a", 1_000, 1_000)),  ApplyError::DuplicateReservation(rid("a"))),
        ("held below reserved",       at(reserved("x", 1_000, 900)),    inconsistent("held")),
        ("held above available",      at(reserved("x", 9_000, 9_000)),  ApplyError::Arithmetic),
        ("start unknown reservation", at(EventBody::Started { id: rid("z"), operation_id: op("o"), execution_deadline_ms: 1 }),
                                      ApplyError::UnknownReservation(rid("z"))),
        ("release refund changed",    at(EventBody::Released { id: rid("b"), refunded_units: 499 }), inconsistent("refund")),
        ("expire skipping EXPIRING",  at(EventBody::Expired { id: rid("b"), refunded_units: 500 }),
                                      ApplyError::IllegalTransition { id: rid("b"), from: ReservationState::Reserved, to: ReservationState::Expired }),
        ("release a started call",    at(EventBody::Released { id: rid("a"), refunded_units: 1_000 }),
                                      ApplyError::IllegalTransition { id: rid("a"), from: ReservationState::Started, to: ReservationState::Released }),
        ("settle amount changed",     at(settled(1_001, 0, 0, 0, false)), inconsistent("actual")),
        ("settle refund changed",     at(settled(100, 800, 0, 0, false)), inconsistent("refund")),
        ("refund and excess at once", at(settled(1_000, 1, 1, 0, false)), inconsistent("both")),
        ("settle claims UNKNOWN",     at(settled(100, 900, 0, 0, true)),  inconsistent("unknown")),
        ("overdraft hidden",          at(settled(9_600, 0, 8_600, 0, false)), ApplyError::Arithmetic),
        ("repay debt never issued",   at(EventBody::Refilled { minted_units: 1, repaid_units: 1, remainder: 0 }),
                                      ApplyError::Conservation(ConservationError::NegativeDebt { issued: 0, moved_in: 0, repaid: 1, moved_out: 0 })),
        ("repay more than minted",    at(EventBody::Refilled { minted_units: 0, repaid_units: 1, remainder: 0 }), ApplyError::Arithmetic),
        ("refill above the burst",    at(EventBody::Refilled { minted_units: 1, repaid_units: 0, remainder: 0 }), inconsistent("burst")),
        ("shard above available",     at(shard(8_501)), ApplyError::Arithmetic),
    ];
    for (name, tamper, expected) in table {
        let h = setup();
        let event = tamper(&h);
        let mut p = h.p.clone();
        let got = try_apply(&mut p, &event);
        match (&got, &expected) {
            (Err(ApplyError::Inconsistent(_)), ApplyError::Inconsistent(_)) => {}
            _ => assert_eq!(got, Err(expected), "{name}"),
        }
        assert_eq!(p, h.p, "{name}: a refused event changed state");
    }

    // Recorded twice: shards, moves.
    for body in [shard(1), moved_in] {
        let mut h = setup();
        let first = h.next_event(body.clone());
        try_apply(&mut h.p, &first).unwrap();
        h.events.push(first);
        let again = h.next_event(body);
        let before = h.p.clone();
        assert!(matches!(
            try_apply(&mut h.p, &again),
            Err(ApplyError::Inconsistent(_))
        ));
        assert_eq!(h.p, before);
    }
}

#[test]
fn events_before_opening_are_refused() {
    let key = key_for(&policy());
    let mut p = Partition::default();
    let event = |body| Event {
        further: Vec::new(),
        sequence: 1,
        at_ms: 0,
        body,
    };
    assert_eq!(
        try_apply(&mut p, &event(EventBody::Closed)),
        Err(ApplyError::NotOpen)
    );
    let wrong_opening = EventBody::PartitionOpened {
        key: key.clone(),
        policy: policy(),
        opening_units: 9_999,
    };
    assert!(matches!(
        try_apply(&mut p, &event(wrong_opening)),
        Err(ApplyError::Inconsistent(_))
    ));
    let wrong_generation = EventBody::PartitionOpened {
        key,
        policy: Policy {
            generation: 1,
            ..policy()
        },
        opening_units: 10_000,
    };
    assert!(matches!(
        try_apply(&mut p, &event(wrong_generation)),
        Err(ApplyError::Inconsistent(_))
    ));
    assert_eq!(p, Partition::default());
    assert_eq!(
        Partition::replay(&[Event {
            further: Vec::new(),
            sequence: 2,
            at_ms: 0,
            body: EventBody::Closed
        }]),
        Err((
            2,
            ApplyError::SequenceGap {
                expected: 1,
                found: 2
            }
        ))
    );
}

/// Live, a broken invariant crashes (it is never logged and ignored).
#[test]
#[should_panic(expected = "apply failed on sequence 6")]
fn apply_crashes_on_an_invalid_event() {
    let h = setup();
    let mut p = h.p.clone();
    apply(
        &mut p,
        &h.next_event(EventBody::Released {
            id: rid("b"),
            refunded_units: 499,
        }),
    );
}
