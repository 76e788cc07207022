//! Emergency shards (issue, remint once) and capacity moves between partitions.

use reservoir_core::*;

use crate::harness::*;
use crate::rejections::{emergency_policy, issue};

fn next_generation(opening_units: Units) -> Policy {
    Policy {
        generation: 32,
        opening_units,
        ..emergency_policy()
    }
}

fn remint(shard: &str, source: &PartitionKey, issued_units: Units, unused_units: Units) -> Command {
    Command::RemintShard {
        shard_id: sid(shard),
        source: source.clone(),
        issued_units,
        unused_units,
        // Whatever is not unused was spent (`check_shard_outcome` wants it to add up).
        spent_units: issued_units.saturating_sub(unused_units),
        unknown_units: 0,
        excess_units: 0,
    }
}

fn reminted(
    shard: &str,
    source: &PartitionKey,
    issued: Units,
    unused: Units,
    units: Units,
) -> EventBody {
    EventBody::ShardReminted {
        shard_id: sid(shard),
        source: source.clone(),
        units,
        issued_units: issued,
        spent_units: issued - unused,
        unknown_units: 0,
        excess_units: 0,
    }
}

#[test]
fn shard_issue_moves_available_to_retired_once() {
    let mut h = Harness::open(emergency_policy());
    let events = h.ok(issue("s1", 3_000));
    assert_eq!(names(&events), ["ShardIssued"]);
    let l = h.ledger();
    assert_eq!(
        (l.available_units, l.retired_for_emergency_units),
        (7_000, 3_000)
    );
    h.noop(issue("s1", 3_000));
    let other_gateway = Command::IssueShard {
        shard_id: sid("s1"),
        units: 3_000,
        gateway_id: "gw-2".into(),
        boot_epoch: 1,
        expires_at_ms: 1_000_000,
        fence_epoch: 1,
        signature: String::new(),
    };
    #[rustfmt::skip]
    let table: Vec<(Command, Rejection)> = vec![
        (issue("s1", 2_999),  Rejection::ExistsWithDifferentFields),
        (other_gateway,       Rejection::ExistsWithDifferentFields),
        (issue("s2", 7_001),  Rejection::InsufficientCapacity { dimension: reservoir_core::Dimension::Tokens, requested_units: 7_001, available_units: 7_000, retry_after_ms: None }),
        (issue("s2", 0),      Rejection::InvalidInput(InvalidInput::ZeroUnits)),
        (Command::IssueShard { shard_id: sid("s2"), units: 1, gateway_id: "gw 1".into(), boot_epoch: 1, expires_at_ms: 1, fence_epoch: 1, signature: String::new() },
                              Rejection::InvalidInput(InvalidInput::IdCharacters { kind: "gateway id" })),
    ];
    for (when, then) in table {
        assert_eq!(h.rejected(when), then);
    }
    // Not while in debt, not after close.
    h.ok(reserve("r", 1, 1_000));
    h.ok(start("r", "op"));
    h.ok(settle("r", None, 8_000));
    assert_eq!(
        h.rejected(issue("s2", 1)),
        Rejection::DebtOutstanding {
            dimension: reservoir_core::Dimension::Tokens,
            debt_units: 1_000,
            retry_after_ms: None
        }
    );
    let mut h = Harness::open(emergency_policy());
    h.ok(Command::Close);
    assert_eq!(
        h.rejected(issue("s2", 1)),
        Rejection::GenerationClosed { generation: 31 }
    );
}

#[test]
fn remint_adds_confirmed_unused_units_once() {
    let source = key_for(&emergency_policy());
    let mut h = Harness::open(next_generation(0));
    let events = h.ok(remint("s1", &source, 3_000, 1_200));
    assert_eq!(events[0].body, reminted("s1", &source, 3_000, 1_200, 1_200));
    let l = h.ledger();
    assert_eq!((l.available_units, l.reminted_units), (1_200, 1_200));
    // Duplicate recovery of unused capacity is zero.
    h.noop(remint("s1", &source, 3_000, 1_200));
    h.noop(remint("s1", &source, 3_000, 3_000));
    assert_eq!(h.ledger(), l);
    let elsewhere = PartitionKey::new("tenant-7", "chat.generate", "other-epoch", 31).unwrap();
    assert_eq!(
        h.rejected(remint("s1", &elsewhere, 3_000, 1_200)),
        Rejection::ExistsWithDifferentFields
    );
    assert_eq!(
        h.rejected(remint("s2", &source, 100, 101)),
        Rejection::InvalidInput(InvalidInput::AbsurdUnits {
            units: 101,
            limit: 100
        })
    );
    // Never above the burst: a full bucket remints nothing (the rest stays retired).
    let mut full = Harness::open(next_generation(9_500));
    let events = full.ok(remint("s1", &source, 3_000, 1_200));
    assert_eq!(events[0].body, reminted("s1", &source, 3_000, 1_200, 500));
    assert_eq!(full.available(), 10_000);
}

#[test]
fn remint_outcomes_must_add_up_and_excess_is_debt() {
    let source = key_for(&emergency_policy());
    let outcome = |issued, unused, spent, unknown, excess| Command::RemintShard {
        shard_id: sid("s9"),
        source: source.clone(),
        issued_units: issued,
        unused_units: unused,
        spent_units: spent,
        unknown_units: unknown,
        excess_units: excess,
    };
    let absurd = |units, limit| Rejection::InvalidInput(InvalidInput::AbsurdUnits { units, limit });
    let mut h = Harness::open(next_generation(1_000));
    #[rustfmt::skip]
    let table: Vec<(Command, Rejection)> = vec![
        // issued, unused, spent, unknown, excess
        (outcome(100, 60, 30, 11, 0), absurd(101, 100)),
        (outcome(100, 1, 90, 20, 10), absurd(111, 100)),
        (outcome(100, 0, 90, 20, 5),  absurd(110, 100)),
    ];
    for (when, then) in table {
        assert_eq!(h.rejected(when), then);
    }
    // A late reconcile remints nothing and leaves the rest retired.
    h.ok(outcome(100, 0, 30, 10, 0));
    let mut h = Harness::open(next_generation(1_000));
    h.ok(outcome(100, 0, 100, 20, 20));
    let l = h.ledger();
    assert_eq!(
        (
            l.available_units,
            l.reminted_units,
            l.overdraft_issued_units,
            l.spent_units
        ),
        (1_000, 0, 20, 20)
    );
    assert_eq!(l.debt_units(), Some(20));
}

fn halves(
    moves: &std::collections::BTreeMap<MoveId, reservoir_core::partition::Move>,
) -> Vec<MoveHalf> {
    moves
        .iter()
        .map(|(id, m)| MoveHalf {
            move_id: id.clone(),
            units: m.units,
            debt_units: m.debt_units,
        })
        .collect()
}

#[test]
fn close_then_move_capacity_and_debt_to_the_next_generation() {
    let a_key = key_for(&policy());
    let b_policy = Policy {
        generation: 32,
        opening_units: 0,
        ..policy()
    };
    let b_key = key_for(&b_policy);
    let mut a = Harness::new();
    // In A: a call in flight, and debt of 1,000 with 1,000 available.
    a.ok(reserve("inflight", 1, 500));
    a.ok(reserve("q", 2, 500));
    a.ok(reserve("r", 3, 1_000));
    a.ok(start("q", "op-q"));
    a.ok(settle("q", None, 10_000)); // 9,500 above: 8,000 from available, 1,500 overdraft
    a.ok(release("r"));
    a.ok(start("inflight", "op-i"));
    assert_eq!((a.available(), a.p.debt_units()), (1_000, 1_500));

    a.ok(Command::Close);
    a.noop(Command::Close);
    assert_eq!(
        a.rejected(reserve("new", 1, 1)),
        Rejection::GenerationClosed { generation: 31 }
    );
    // In-flight calls still finish in the closed partition.
    a.ok(settle("inflight", None, 200));
    assert_eq!(a.available(), 1_300);

    let out = Command::MoveOut {
        further_units: Vec::new(),
        move_id: mid("m1"),
        to: b_key.clone(),
        units: 1_300,
    };
    assert_eq!(
        a.rejected(Command::MoveOut {
            further_units: Vec::new(),
            move_id: mid("m1"),
            to: b_key.clone(),
            units: 1_301
        }),
        Rejection::InsufficientCapacity {
            dimension: reservoir_core::Dimension::Tokens,
            requested_units: 1_301,
            available_units: 1_300,
            retry_after_ms: None
        }
    );
    let events = a.ok(out.clone());
    assert_eq!(
        events[0].body,
        EventBody::MovedOut {
            move_id: mid("m1"),
            to: b_key.clone(),
            units: 1_300,
            debt_units: 1_500
        }
    );
    a.noop(out);
    assert_eq!(
        a.rejected(Command::MoveOut {
            further_units: Vec::new(),
            move_id: mid("m1"),
            to: b_key.clone(),
            units: 1
        }),
        Rejection::ExistsWithDifferentFields
    );
    assert_eq!((a.available(), a.p.debt_units()), (0, 0));

    let mut b = Harness::open(b_policy);
    let move_in = Command::MoveIn {
        further: Vec::new(),
        move_id: mid("m1"),
        from: a_key.clone(),
        units: 1_300,
        debt_units: 1_500,
    };
    b.ok(move_in.clone());
    b.noop(move_in);
    assert_eq!(
        b.rejected(Command::MoveIn {
            further: Vec::new(),
            move_id: mid("m1"),
            from: a_key.clone(),
            units: 1_300,
            debt_units: 0
        }),
        Rejection::ExistsWithDifferentFields
    );
    // The debt moved with the capacity: B is frozen until refills repay it.
    assert_eq!((b.available(), b.p.debt_units()), (1_300, 1_500));
    assert_eq!(b.rejected(reserve("new", 1, 1)).code(), "debt_outstanding");

    // Across the two partitions: every move paired, sums equal.
    assert_eq!(
        check_moves(&halves(&a.p.moves_out), &halves(&b.p.moves_in)),
        Ok(())
    );
    assert_eq!(a.ledger().moved_out_units, b.ledger().moved_in_units);
    assert_eq!(
        a.ledger().debt_moved_out_units,
        b.ledger().debt_moved_in_units
    );
    // A tampered arrival, or one that never left, is caught.
    let mut forged = halves(&b.p.moves_in);
    forged[0].units -= 1;
    assert!(check_moves(&halves(&a.p.moves_out), &forged).is_err());
    assert!(check_moves(&[], &halves(&b.p.moves_in)).is_err());
    assert!(check_moves(&halves(&a.p.moves_out), &[]).is_err());
}
