//! Every `Rejection` variant, each with the exact value a client receives.

use std::collections::BTreeSet;

use reservoir_core::partition::{MAX_MOVES_PER_PARTITION, MAX_SHARDS_PER_PARTITION};
use reservoir_core::retention::MAX_OPEN_RESERVATIONS_PER_PARTITION;
use reservoir_core::*;

use crate::harness::*;

/// Exhaustive on purpose: a new variant does not compile until it has a row below.
fn variant_code(r: &Rejection) -> &'static str {
    match r {
        Rejection::InsufficientCapacity { .. } => "insufficient_capacity",
        Rejection::RequestTooLarge { .. } => "request_too_large",
        Rejection::DebtOutstanding { .. } => "debt_outstanding",
        Rejection::WrongState { .. } => "wrong_state",
        Rejection::UnknownReservation { .. } => "unknown_reservation",
        Rejection::ExistsWithDifferentDigest { .. } => "exists_with_different_digest",
        Rejection::ExistsWithDifferentOperationId { .. } => "exists_with_different_operation_id",
        Rejection::ExistsWithDifferentActualUnits { .. } => "exists_with_different_actual_units",
        Rejection::LeaseExpired { .. } => "lease_expired",
        Rejection::NotYetDue { .. } => "not_yet_due",
        Rejection::GenerationClosed { .. } => "generation_closed",
        Rejection::PartitionNotOpen => "partition_not_open",
        Rejection::PartitionExistsWithDifferentPolicy => "partition_exists_with_different_policy",
        Rejection::LimitReached { .. } => "limit_reached",
        Rejection::OpenReservationsLimit { .. } => "open_reservations_limit",
        Rejection::EmergencyDisabled => "emergency_disabled",
        Rejection::ExistsWithDifferentFields => "exists_with_different_fields",
        Rejection::InvalidInput(_) => "invalid_input",
    }
}
const VARIANTS: usize = 18;

pub fn emergency_policy() -> Policy {
    Policy {
        emergency_mode: EmergencyMode::Enabled,
        ..policy()
    }
}

type Setup = fn(&mut Harness);

fn nothing(_: &mut Harness) {}
fn reserved_a(h: &mut Harness) {
    h.ok(reserve("a", 1, 1_000));
}
fn started_a(h: &mut Harness) {
    reserved_a(h);
    h.ok(start("a", "op-1"));
}
fn in_debt(h: &mut Harness) {
    started_a(h);
    h.ok(settle("a", None, 12_000)); // 9,000 from available, 2,000 overdraft
}

#[test]
fn every_rejection_code_with_its_exact_value() {
    let a = || rid("a");
    #[rustfmt::skip]
    let table: Vec<(&str, Policy, Setup, Command, u64, Rejection)> = vec![
        // name                  policy        given        when                               at       then
        // `a` holds 8,000 of the 10,000 burst: refill cannot add the 6,000
        // missing until it is gone, which for an unstarted hold is by its lease.
        ("too little left",      policy(),     |h| { h.ok(reserve("a", 1, 8_000)); }, reserve("b", 1, 8_000), 0,
            Rejection::InsufficientCapacity { dimension: reservoir_core::Dimension::Tokens, requested_units: 8_000, available_units: 2_000, retry_after_ms: Some(180_000) }),
        ("above max reservation", policy(),    nothing,     reserve("a", 1, 8_001),            0,
            Rejection::RequestTooLarge { dimension: reservoir_core::Dimension::Tokens, requested_units: 8_001, max_units: 8_000 }),
        ("debt freezes admission", policy(),   in_debt,     reserve("b", 1, 1),                0,
            Rejection::DebtOutstanding { dimension: reservoir_core::Dimension::Tokens, debt_units: 2_000, retry_after_ms: Some(12_006) }),
        ("release after start",  policy(),     started_a,   release("a"),                      0,
            Rejection::WrongState { id: a(), state: ReservationState::Started, transition: Transition::Release }),
        ("start unknown id",     policy(),     nothing,     start("x", "op-1"),                0,
            Rejection::UnknownReservation { id: rid("x") }),
        ("same id, new digest",  policy(),     reserved_a,  reserve("a", 2, 1_000),            0,
            Rejection::ExistsWithDifferentDigest { id: a() }),
        ("second operation id",  policy(),     started_a,   start("a", "op-2"),                0,
            Rejection::ExistsWithDifferentOperationId { id: a() }),
        ("settle twice, new units", policy(),  |h| { started_a(h); h.ok(settle("a", None, 100)); }, settle("a", None, 200), 0,
            Rejection::ExistsWithDifferentActualUnits { id: a(), settled_units: 100 }),
        ("start after the lease", policy(),    reserved_a,  start("a", "op-1"),                180_000,
            Rejection::LeaseExpired { id: a(), expires_at_ms: 180_000 }),
        ("expire before the lease", policy(),  reserved_a,  expire("a"),                       179_999,
            Rejection::NotYetDue { id: a(), due_at_ms: 180_000 }),
        ("reserve after close",  policy(),     |h| { h.ok(Command::Close); }, reserve("a", 1, 1), 0,
            Rejection::GenerationClosed { generation: 31 }),
        ("reopen, other policy", policy(),     nothing,     Command::OpenPartition { key: key_for(&policy()), policy: Policy { priority: 9, ..policy() } }, 0,
            Rejection::PartitionExistsWithDifferentPolicy),
        ("shards disabled",      policy(),     nothing,     issue("s", 1),                     0,
            Rejection::EmergencyDisabled),
        ("shard id reused",      emergency_policy(), |h| { h.ok(issue("s", 1)); }, issue("s", 2), 0,
            Rejection::ExistsWithDifferentFields),
        ("zero units",           policy(),     nothing,     reserve("a", 1, 0),                0,
            Rejection::InvalidInput(InvalidInput::ZeroUnits)),
        ("too many shards",      emergency_policy(), |h| { for i in 0..MAX_SHARDS_PER_PARTITION { h.ok(issue(&format!("s{i}"), 1)); } }, issue("s-last", 1), 0,
            Rejection::LimitReached { what: "shards", limit: MAX_SHARDS_PER_PARTITION }),
    ];
    let mut covered = BTreeSet::new();
    for (name, policy, given, when, at, then) in table {
        let mut h = Harness::open(policy);
        given(&mut h);
        h.at(h.now.max(at));
        let got = h.rejected(when);
        assert_eq!(got, then, "{name}");
        assert_eq!(
            got.code(),
            variant_code(&got),
            "{name}: code() drifted from the variant"
        );
        covered.insert(got.code());
    }
    // The one variant that needs a partition that was never opened.
    let mut h = Harness::given(vec![]);
    let got = h.rejected(reserve("a", 1, 1));
    assert_eq!(got, Rejection::PartitionNotOpen);
    covered.insert(got.code());
    // Hit in `reservation_and_move_limits_are_hit` (a million open records).
    covered.insert("open_reservations_limit");
    assert_eq!(covered.len(), VARIANTS, "covered: {covered:?}");
}

pub fn issue(shard: &str, units: Units) -> Command {
    Command::IssueShard {
        shard_id: sid(shard),
        units,
        gateway_id: "gw-1".into(),
        boot_epoch: 1,
        expires_at_ms: 1_000_000,
        fence_epoch: 1,
        signature: String::new(),
    }
}

#[test]
fn only_limit_refusals_are_logged_as_admission_refused() {
    let mut h = Harness::new();
    h.ok(reserve("a", 1, 8_000));
    let when = reserve("b", 1, 8_000);
    let rejection = h.rejected(when.clone());
    assert!(rejection.is_admission_refusal());
    assert_eq!(rejection.retry_after_ms(), Some(180_000));
    let event = refusal_event(&h.p, &when, &rejection, h.now).expect("limit refusals are logged");
    assert_eq!(
        event.body,
        EventBody::AdmissionRefused {
            dimension: Some(reservoir_core::Dimension::Tokens),
            id: rid("b"),
            requested_units: 8_000,
            reason: RefusalReason::InsufficientCapacity,
            retry_after_ms: Some(180_000),
        }
    );
    let ledger = h.ledger();
    try_apply(&mut h.p, &event).unwrap();
    h.events.push(event);
    h.p.check_invariants().unwrap();
    assert_eq!(
        (h.p.refusals, h.ledger()),
        (1, ledger),
        "a refusal moves no capacity"
    );
    assert!(
        h.p.reservation(&rid("b")).is_none(),
        "a refused reserve leaves no record"
    );

    let not_a_limit = h.rejected(reserve("a", 2, 1));
    assert!(!not_a_limit.is_admission_refusal());
    assert_eq!(not_a_limit.retry_after_ms(), None);
    assert_eq!(
        refusal_event(&h.p, &reserve("a", 2, 1), &not_a_limit, h.now),
        None
    );
}

/// Every named per-partition limit, hit.
#[test]
fn reservation_and_move_limits_are_hit() {
    // Open reservations count, finished ones do not (see tests/core/retention.rs).
    // Built with the bare decide/apply loop (the harness's O(n) check per event
    // would be quadratic).
    let policy = Policy {
        burst_units: 2_000_000,
        opening_units: 2_000_000,
        ..policy()
    };
    let mut p = Partition::default();
    let open = Command::OpenPartition {
        key: key_for(&policy),
        policy,
    };
    for e in decide(&p, &open, 0).unwrap() {
        apply(&mut p, &e);
    }
    for i in 0..MAX_OPEN_RESERVATIONS_PER_PARTITION {
        let cmd = reserve(&format!("r{i}"), 1, 1);
        for e in decide(&p, &cmd, 0).unwrap() {
            apply(&mut p, &e);
        }
    }
    p.check_invariants().unwrap();
    let limit = decide(&p, &reserve("one-more", 1, 1), 0).unwrap_err();
    assert_eq!(
        limit,
        Rejection::OpenReservationsLimit {
            limit: MAX_OPEN_RESERVATIONS_PER_PARTITION,
            retry_after_ms: crate::harness::policy().hold_ttl_ms,
        }
    );
    assert_eq!(
        limit.retry_after_ms(),
        Some(crate::harness::policy().hold_ttl_ms)
    );
    // A retry of an existing reservation is still answered.
    assert_eq!(decide(&p, &reserve("r0", 1, 1), 0), Ok(vec![]));
    // One finishes: the partition admits again.
    for e in decide(&p, &release("r0"), 0).unwrap() {
        apply(&mut p, &e);
    }
    for e in decide(&p, &reserve("one-more", 1, 1), 0).unwrap() {
        apply(&mut p, &e);
    }
    p.check_invariants().unwrap();

    let mut h = Harness::new();
    let to = PartitionKey::new("tenant-7", "chat.generate", "next", 31).unwrap();
    for i in 0..MAX_MOVES_PER_PARTITION {
        h.ok(Command::MoveOut {
            further_units: Vec::new(),
            move_id: mid(&format!("m{i}")),
            to: to.clone(),
            units: 1,
        });
    }
    assert_eq!(
        h.rejected(Command::MoveOut {
            further_units: Vec::new(),
            move_id: mid("m-last"),
            to,
            units: 1
        }),
        Rejection::LimitReached {
            what: "moves",
            limit: MAX_MOVES_PER_PARTITION
        }
    );
}
