//! Later partitions of a subject/route (a new generation, a rollback, the
//! next epoch) open empty, and the Retry-After of every refusal cause is a
//! time at which the same reserve is admitted when nothing else changed.

use reservoir_core::*;

use crate::harness::*;

/// The expiries the sweeper would send at the harness clock (due leases).
fn expire_due(h: &mut Harness) {
    let due: Vec<String> =
        h.p.reservations
            .values()
            .filter(|r| r.state == ReservationState::Reserved && r.expires_at_ms <= h.now)
            .map(|r| r.id.to_string())
            .collect();
    for id in due {
        h.ok(expire(&id));
    }
}

/// Debt 2,000 at the clock (available 0): 1,000 held, 12,000 used.
fn into_debt(h: &mut Harness) {
    h.ok(reserve("big", 9, 1_000));
    h.ok(start("big", "op-big"));
    h.ok(settle("big", Some("op-big"), 12_000));
    assert_eq!((h.available(), h.p.debt_units()), (0, 2_000));
}

/// `Policy::example` refills one unit per 6 ms into a 10,000 burst; a lease
/// is 180 s. Each row builds the refusal at `refused_at` and asks for `units`.
#[test]
fn retrying_at_exactly_the_hinted_time_admits_for_every_refusal_cause() {
    type Setup = fn(&mut Harness);
    #[rustfmt::skip]
    let rows: [(&str, Setup, TimestampMs, Units, &str, u64); 4] = [
        // cause                        setup                                                          refused_at units  code                    hint (ms)
        ("empty bucket",                |h| { h.ok(reserve("a", 1, 8_000)); h.ok(start("a", "op-a")); h.ok(settle("a", None, 8_000)); },
                                                                                                        0,     5_000, "insufficient_capacity", 3_000 * 6),
        // a holds 8,000 until its lease ends at 180 s; refill has no room below the burst until then.
        ("held by open reservations",   |h| { h.ok(reserve("a", 1, 8_000)); },                          1_000, 5_000, "insufficient_capacity", 180_000 - 1_000),
        ("debt",                        into_debt,                                                      0,     100,   "debt_outstanding",      (2_000 + 100) * 6),
        ("debt then refill",            |h| { into_debt(h); h.at(6_000); h.ok(Command::Refill); },     6_000, 100,   "debt_outstanding",      (1_000 + 100) * 6),
    ];
    for (cause, setup, refused_at, units, code, hint_ms) in rows {
        let mut h = Harness::new();
        setup(&mut h);
        h.at(refused_at);
        let rejection = h.rejected(reserve("n", 2, units));
        assert_eq!(
            (rejection.code(), rejection.retry_after_ms()),
            (code, Some(hint_ms)),
            "{cause}"
        );
        // One millisecond early is still refused: the hint is not padded...
        h.at(refused_at + hint_ms - 1);
        expire_due(&mut h);
        assert!(
            h.run(reserve("n", 2, units)).is_err(),
            "{cause}: admitted early"
        );
        // ...and at exactly the hint, with only the due expiries run, it is admitted.
        h.at(refused_at + hint_ms);
        expire_due(&mut h);
        let events = h.ok(reserve("n", 2, units));
        assert_eq!(names(&events).last(), Some(&"Reserved"), "{cause}");
        h.p.check_invariants().unwrap();
    }
}

/// Started calls free nothing with no other traffic: the hint falls back to
/// the hold TTL rather than promising a time nothing happens at.
#[test]
fn capacity_held_by_started_calls_hints_the_hold_ttl() {
    let mut h = Harness::new();
    h.ok(reserve("a", 1, 8_000));
    h.ok(start("a", "op-a"));
    h.at(1_000);
    let rejection = h.rejected(reserve("n", 2, 5_000));
    assert_eq!(rejection.retry_after_ms(), Some(180_000));
}

#[test]
fn a_successor_opens_empty_in_every_dimension_and_a_move_fills_it() {
    let first = policy();
    let mut old = Harness::open(first.clone());
    old.ok(reserve("in-flight", 1, 3_000));
    let next = Policy {
        generation: first.generation + 1,
        ..first.clone()
    };
    let next_key = key_for(&next);
    let mut new = Harness {
        p: Partition::default(),
        events: Vec::new(),
        now: 0,
    };
    new.ok(Command::OpenSuccessor {
        key: next_key.clone(),
        policy: next.clone(),
    });
    assert_eq!(new.ledger(), Ledger::default(), "a successor mints nothing");
    // The same successor again is a no-op; as a first partition it is another policy.
    new.noop(Command::OpenSuccessor {
        key: next_key.clone(),
        policy: next.clone(),
    });
    assert_eq!(
        new.rejected(Command::OpenPartition {
            key: next_key.clone(),
            policy: next.clone()
        }),
        Rejection::PartitionExistsWithDifferentPolicy
    );
    let total = |a: &Partition, b: &Partition| -> u128 {
        [a, b]
            .iter()
            .map(|p| u128::from(p.ledger.available_units) + u128::from(p.ledger.reserved_units))
            .sum()
    };
    let before = total(&old.p, &new.p);
    old.ok(Command::Close);
    let out = old.ok(Command::MoveOut {
        move_id: mid("m1"),
        to: next_key.clone(),
        units: 7_000,
        further_units: vec![],
    });
    let EventBody::MovedOut {
        units, debt_units, ..
    } = out[0].body.clone()
    else {
        panic!("a move out");
    };
    new.ok(Command::MoveIn {
        move_id: mid("m1"),
        from: key_for(&first),
        units,
        debt_units,
        further: vec![],
    });
    assert_eq!(
        total(&old.p, &new.p),
        before,
        "a generation switch moves, never mints"
    );
    assert!(
        !old.p.drained(),
        "3,000 still reserved in the closed generation"
    );
    old.ok(release("in-flight"));
    assert!(old.p.drained());
    let half = |p: &Partition, outs: bool| -> Vec<MoveHalf> {
        let moves = if outs { &p.moves_out } else { &p.moves_in };
        moves
            .iter()
            .map(|(id, m)| MoveHalf {
                move_id: id.clone(),
                units: m.units,
                debt_units: m.debt_units,
            })
            .collect()
    };
    assert_eq!(
        check_moves(&half(&old.p, true), &half(&new.p, false)),
        Ok(())
    );
}
