//! Malformed input, whatever the state; and arithmetic that would overflow is a
//! rejection, never a wrap or a panic.

use reservoir_core::policy::{MAX_SPAN_MS, MAX_UNITS};
use reservoir_core::types::MAX_ID_BYTES;
use reservoir_core::*;

use crate::harness::*;

#[test]
fn identifiers_are_checked() {
    let long = "x".repeat(MAX_ID_BYTES);
    let too_long = "x".repeat(MAX_ID_BYTES + 1);
    #[rustfmt::skip]
    let table: Vec<(&str, Result<(), InvalidInput>)> = vec![
        ("r",                 Ok(())),
        ("a/b:c@d-e_f.G9",    Ok(())),
        (&long,               Ok(())),
        ("",                  Err(InvalidInput::IdLength { kind: "reservation id" })),
        (&too_long,           Err(InvalidInput::IdLength { kind: "reservation id" })),
        ("a b",               Err(InvalidInput::IdCharacters { kind: "reservation id" })),
        ("caf\u{e9}",         Err(InvalidInput::IdCharacters { kind: "reservation id" })),
        ("a\nb",              Err(InvalidInput::IdCharacters { kind: "reservation id" })),
        ("a%20b",             Err(InvalidInput::IdCharacters { kind: "reservation id" })),
    ];
    for (value, expected) in table {
        assert_eq!(ReservationId::new(value).map(|_| ()), expected, "{value:?}");
        // Every id type applies the same rule, naming itself; so does serde.
        assert_eq!(OperationId::new(value).is_ok(), expected.is_ok());
        assert_eq!(ShardId::new(value).is_ok(), expected.is_ok());
        assert_eq!(MoveId::new(value).is_ok(), expected.is_ok());
        let json = serde_json::to_string(value).unwrap();
        assert_eq!(
            serde_json::from_str::<ReservationId>(&json).is_ok(),
            expected.is_ok(),
            "{value:?}"
        );
    }
    assert_eq!(
        OperationId::new(""),
        Err(InvalidInput::IdLength {
            kind: "operation id"
        })
    );
    assert_eq!(
        PartitionKey::new("tenant 7", "chat", "e", 1),
        Err(InvalidInput::IdCharacters { kind: "subject" })
    );
    assert_eq!(
        PartitionKey::new("t", "", "e", 1),
        Err(InvalidInput::IdLength { kind: "route" })
    );
    assert_eq!(
        PartitionKey::new("t", "r", "", 1),
        Err(InvalidInput::IdLength {
            kind: "accounting epoch"
        })
    );
}

#[test]
fn every_invalid_policy_field_is_named() {
    type Edit = fn(&mut Policy);
    #[rustfmt::skip]
    let table: Vec<(Edit, &str)> = vec![
        (|p| p.subject.clear(),                          "subject/route"),
        (|p| p.route.clear(),                            "subject/route"),
        (|p| p.region.clear(),                           "region"),
        (|p| p.region = "r".repeat(MAX_ID_BYTES + 1),    "region"),
        (|p| p.estimator_digest = "d".repeat(257),       "estimator_digest"),
        (|p| p.burst_units = 0,                          "burst_units"),
        (|p| p.burst_units = MAX_UNITS + 1,              "burst_units"),
        (|p| p.opening_units = p.burst_units + 1,        "opening_units"),
        (|p| p.max_reservation_units = 0,                "max_reservation_units"),
        (|p| p.max_reservation_units = MAX_UNITS + 1,    "max_reservation_units"),
        (|p| p.max_overdraft_units = MAX_UNITS + 1,      "max_overdraft_units"),
        (|p| p.refill.units = MAX_UNITS + 1,             "refill.units"),
        (|p| p.refill.interval_ms = 0,                   "refill.interval_ms"),
        (|p| p.refill.interval_ms = MAX_SPAN_MS + 1,     "refill.interval_ms"),
        (|p| p.hold_ttl_ms = 0,                          "hold_ttl_ms"),
        (|p| p.hold_ttl_ms = MAX_SPAN_MS + 1,            "hold_ttl_ms"),
        (|p| p.hard_execution_limit_ms = 0,              "hard_execution_limit_ms"),
        (|p| p.hard_execution_limit_ms = MAX_SPAN_MS + 1, "hard_execution_limit_ms"),
    ];
    for (edit, field) in table {
        let mut bad = policy();
        edit(&mut bad);
        assert_eq!(
            bad.validate(),
            Err(InvalidInput::Policy { field }),
            "{field}"
        );
        let key = PartitionKey {
            subject: "s".into(),
            route: "r".into(),
            ..key_for(&policy())
        };
        let key = if bad.subject.is_empty() || bad.route.is_empty() {
            key
        } else {
            key_for(&bad)
        };
        let mut h = Harness::given(vec![]);
        assert_eq!(
            h.rejected(Command::OpenPartition { key, policy: bad }),
            Rejection::InvalidInput(InvalidInput::Policy { field })
        );
    }
    // The edges that are allowed.
    let edge = Policy {
        burst_units: MAX_UNITS,
        opening_units: MAX_UNITS,
        max_reservation_units: MAX_UNITS,
        max_overdraft_units: MAX_UNITS,
        refill: RefillRule {
            units: 0,
            interval_ms: MAX_SPAN_MS,
        },
        hold_ttl_ms: MAX_SPAN_MS,
        hard_execution_limit_ms: 1,
        ..policy()
    };
    assert_eq!(edge.validate(), Ok(()));
    Harness::open(edge);
    // A key that names another partition than the policy.
    let mut h = Harness::given(vec![]);
    let other = PartitionKey::new("tenant-8", "chat.generate", EPOCH, 31).unwrap();
    assert_eq!(
        h.rejected(Command::OpenPartition {
            key: other,
            policy: policy()
        })
        .code(),
        "invalid_input"
    );
}

#[test]
fn zero_and_absurd_amounts_are_refused() {
    let mut h = Harness::new();
    let key = key_for(&policy());
    let absurd = |units| {
        Rejection::InvalidInput(InvalidInput::AbsurdUnits {
            units,
            limit: MAX_UNITS,
        })
    };
    #[rustfmt::skip]
    let table: Vec<(Command, Rejection)> = vec![
        (reserve("r", 1, 0),                 Rejection::InvalidInput(InvalidInput::ZeroUnits)),
        (reserve("r", 1, MAX_UNITS + 1),     absurd(MAX_UNITS + 1)),
        (reserve("r", 1, u64::MAX),          absurd(u64::MAX)),
        (settle("r", None, MAX_UNITS + 1),   absurd(MAX_UNITS + 1)),
        (Command::MoveOut { further_units: Vec::new(), move_id: mid("m"), to: key.clone(), units: u64::MAX }, absurd(u64::MAX)),
        (Command::MoveIn { further: Vec::new(), move_id: mid("m"), from: key.clone(), units: MAX_UNITS + 1, debt_units: 0 }, absurd(MAX_UNITS + 1)),
        (Command::MoveIn { further: Vec::new(), move_id: mid("m"), from: key.clone(), units: 0, debt_units: u64::MAX }, absurd(u64::MAX)),
        (Command::MoveIn { further: Vec::new(), move_id: mid("m"), from: PartitionKey { subject: "a b".into(), ..key.clone() }, units: 1, debt_units: 0 },
                                             Rejection::InvalidInput(InvalidInput::IdCharacters { kind: "subject" })),
    ];
    for (when, then) in table {
        assert_eq!(h.rejected(when), then);
    }
    // The largest legal reserve is judged against the policy, not refused as input.
    assert_eq!(
        h.rejected(reserve("r", 1, MAX_UNITS)).code(),
        "request_too_large"
    );
}

#[test]
fn time_never_goes_backwards() {
    let mut h = Harness::new();
    h.at(100).ok(reserve("r", 1, 1));
    assert_eq!(
        decide(&h.p, &reserve("s", 1, 1), 99),
        Err(Rejection::InvalidInput(InvalidInput::TimeWentBackwards {
            now_ms: 99,
            last_ms: 100
        }))
    );
    assert_eq!(
        decide(&h.p, &Command::Refill, 0).unwrap_err().code(),
        "invalid_input"
    );
    // The same instant is fine (a writer batches many commands in one millisecond).
    h.ok(reserve("s", 1, 1));
}

#[test]
fn deadlines_at_the_end_of_time_are_rejected_not_wrapped() {
    let mut h = Harness::new();
    let end = u64::MAX;
    assert_eq!(
        decide(&h.p, &reserve("late", 1, 1), end - 1),
        Err(Rejection::InvalidInput(InvalidInput::Overflow))
    );
    h.at(end - 200_000).ok(reserve("r", 1, 1));
    h.at(end - 100_000);
    assert_eq!(
        h.rejected(start("r", "op")),
        Rejection::InvalidInput(InvalidInput::Overflow)
    );
    // Refill over the whole span of u64 time: capped by the burst, no overflow.
    h.at(end).ok(Command::Refill);
}

#[test]
fn accumulated_spend_that_would_overflow_is_rejected() {
    // 2,100 one-unit calls each reporting MAX_UNITS: spent and overdraft pass 2^64
    // after 2,048 of them. Recording them must stop with a rejection, not a panic.
    let policy = Policy {
        max_overdraft_units: MAX_UNITS,
        ..policy()
    };
    let mut h = Harness::open(policy);
    let n = 2_100;
    for i in 0..n {
        h.ok(reserve(&format!("r{i}"), 1, 1));
        h.ok(start(&format!("r{i}"), "op"));
    }
    let mut refused = 0;
    for i in 0..n {
        match h.run(settle(&format!("r{i}"), None, MAX_UNITS)) {
            Ok(_) => assert_eq!(refused, 0, "accepted after a refusal"),
            Err(r) => {
                assert_eq!(r, Rejection::InvalidInput(InvalidInput::Overflow));
                refused += 1;
            }
        }
    }
    assert!((1..n - 2_000).contains(&refused), "refused {refused}");
    // Calls that still fit are recorded.
    h.ok(settle(&format!("r{}", n - 1), None, 0));
}

#[test]
fn accumulated_moves_that_would_overflow_are_rejected() {
    let mut h = Harness::new();
    let from = PartitionKey::new("tenant-7", "chat.generate", "previous", 31).unwrap();
    let mut refused = 0;
    for i in 0..2_100 {
        let cmd = Command::MoveIn {
            further: Vec::new(),
            move_id: mid(&format!("m{i}")),
            from: from.clone(),
            units: MAX_UNITS,
            debt_units: MAX_UNITS,
        };
        match h.run(cmd) {
            Ok(_) => assert_eq!(refused, 0),
            Err(r) => {
                assert_eq!(r, Rejection::InvalidInput(InvalidInput::Overflow));
                refused += 1;
            }
        }
    }
    assert!(refused > 0);
}

#[test]
fn a_refill_that_would_overflow_minted_is_rejected() {
    // A ledger at the end of its range, built directly (through commands it takes
    // 2^11 full buckets of 2^53 units): everything ever minted was spent.
    let h = Harness::open(Policy {
        opening_units: 0,
        ..policy()
    });
    let mut p = h.p.clone();
    let big = u64::MAX - 5_000;
    p.ledger.minted_units = big;
    p.ledger.spent_units = big;
    p.check_invariants().unwrap();
    let overflow = Err(Rejection::InvalidInput(InvalidInput::Overflow));
    assert_eq!(decide(&p, &Command::Refill, 1_000_000), overflow);
    assert_eq!(decide(&p, &reserve("x", 1, 1), 1_000_000), overflow);
    // What still fits is credited.
    assert_eq!(
        decide(&p, &Command::Refill, 30_000).unwrap()[0].body,
        EventBody::Refilled {
            minted_units: 5_000,
            repaid_units: 0,
            remainder: 0
        }
    );
}
