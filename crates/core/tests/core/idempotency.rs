//! Retries: the same request answered from the record, never a second debit or refund.

use reservoir_core::*;

use crate::harness::*;

#[test]
fn reserve_retry_with_same_digest_returns_the_original_receipt() {
    let mut h = Harness::new();
    let events = h.ok(reserve("r", 1, 1_000));
    assert_eq!(names(&events), ["Reserved"]);
    let receipt = h.rec("r").clone();
    let ledger = h.ledger();
    // Retries later (the answer was lost): same record, nothing debited again.
    for now in [0, 5, 179_999, 10_000_000] {
        h.at(now);
        h.noop(reserve("r", 1, 1_000));
        assert_eq!(h.rec("r"), &receipt);
        assert_eq!(h.ledger(), ledger);
    }
}

#[test]
fn same_id_different_request_is_rejected_in_every_state() {
    let mut h = Harness::new();
    h.ok(reserve("r", 1, 1_000));
    let receipt = h.rec("r").clone();
    #[rustfmt::skip]
    let table: Vec<(Command, Rejection)> = vec![
        (reserve("r", 2, 1_000), Rejection::ExistsWithDifferentDigest { id: rid("r") }),
        // Even with different units and a different digest: the id is taken.
        (reserve("r", 3, 7), Rejection::ExistsWithDifferentDigest { id: rid("r") }),
    ];
    for (when, then) in table {
        assert_eq!(h.rejected(when), then);
        assert_eq!(h.rec("r"), &receipt);
    }
    // After the reservation ended, the id still belongs to its first request.
    h.ok(release("r"));
    assert_eq!(
        h.rejected(reserve("r", 2, 1_000)),
        Rejection::ExistsWithDifferentDigest { id: rid("r") }
    );
    h.noop(reserve("r", 1, 1_000));
}

#[test]
fn repeated_settle_release_and_expire_are_answered_from_the_record() {
    let mut h = Harness::new();
    for (id, d) in [("s", 1), ("l", 2), ("e", 3)] {
        h.ok(reserve(id, d, 1_000));
    }
    h.at(1).ok(start("s", "op-1"));
    h.ok(settle("s", Some("op-1"), 400));
    h.ok(release("l"));
    h.at(180_000).ok(expire("e"));
    let ledger = h.ledger();
    assert_eq!((ledger.available_units, ledger.spent_units), (9_600, 400));

    #[rustfmt::skip]
    let table: Vec<(Command, Option<Rejection>)> = vec![
        // when                            then (None = no events, same record)
        (settle("s", Some("op-1"), 400),   None),
        (settle("s", None, 400),           None),
        (settle("s", None, 401),           Some(Rejection::ExistsWithDifferentActualUnits { id: rid("s"), settled_units: 400 })),
        (settle("s", None, 0),             Some(Rejection::ExistsWithDifferentActualUnits { id: rid("s"), settled_units: 400 })),
        (settle("s", Some("op-2"), 400),   Some(Rejection::ExistsWithDifferentOperationId { id: rid("s") })),
        (start("s", "op-1"),               None),
        (release("l"),                     None),
        (expire("e"),                      None),
    ];
    for (when, then) in table {
        let label = format!("{when:?}");
        let records = h.p.reservations.clone();
        match then {
            None => h.noop(when),
            Some(rejection) => assert_eq!(h.rejected(when), rejection, "{label}"),
        }
        assert_eq!(h.p.reservations, records, "{label}");
        assert_eq!(h.ledger(), ledger, "{label}: a retry moved capacity");
    }
}

#[test]
fn reopening_with_the_same_policy_is_a_no_op() {
    let mut h = Harness::new();
    h.noop(Command::OpenPartition {
        key: key_for(&policy()),
        policy: policy(),
    });
    assert_eq!(names(&h.ok(Command::Close)), ["Closed"]);
    h.noop(Command::Close);
}
