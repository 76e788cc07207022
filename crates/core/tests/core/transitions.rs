//! The state machine: the table itself, then every stored state reached through
//! real commands and every command tried from it, then every event-level move
//! tried against every state.

use reservoir_core::ReservationState::{self, *};
use reservoir_core::*;

use crate::harness::*;

/// The contract's edges, restated independently of `can_move_to`.
const ALLOWED: &[(ReservationState, ReservationState)] = &[
    (Requested, Reserved),
    (Reserved, Started),
    (Reserved, Released),
    (Reserved, Expiring),
    (Expiring, Expired),
    (Started, Settled),
    (Started, SettledWithDebt),
    (Started, UsageUnknown),
    (UsageUnknown, Settled),
    (UsageUnknown, SettledWithDebt),
];

#[test]
fn every_pair_of_states_is_allowed_exactly_when_the_contract_says() {
    let mut allowed = 0;
    for from in ReservationState::ALL {
        for to in ReservationState::ALL {
            let expected = ALLOWED.contains(&(from, to));
            assert_eq!(from.can_move_to(to), expected, "{from:?} -> {to:?}");
            allowed += usize::from(expected);
        }
    }
    assert_eq!(
        (allowed, ReservationState::ALL.len().pow(2) - allowed),
        (10, 71)
    );
    // Terminal states have no way out; open states hold capacity.
    for s in ReservationState::ALL {
        if s.is_terminal() {
            assert!(
                ReservationState::ALL.iter().all(|&t| !s.can_move_to(t)),
                "{s:?}"
            );
        }
        assert_eq!(
            s.holds_capacity(),
            matches!(s, Reserved | Started | Expiring | UsageUnknown),
            "{s:?}"
        );
    }
}

/// Times used by the table: the setup finishes by t = 700,000 at the latest.
const EARLY: u64 = 0; // relative: right after the setup
const LATE: u64 = 10_000_000; // absolute: past every lease and execution deadline

/// Drives reservation `r` (1,000 units, op-1) into `state` with real commands.
fn reach(state: ReservationState) -> Harness {
    let mut h = Harness::new();
    h.ok(reserve("r", 1, 1_000));
    match state {
        Reserved => {}
        Started => {
            h.at(1).ok(start("r", "op-1"));
        }
        Settled => {
            h.at(1).ok(start("r", "op-1"));
            h.at(2).ok(settle("r", None, 100));
        }
        SettledWithDebt => {
            h.at(1).ok(start("r", "op-1"));
            // 11,000 above the hold: 9,000 from available, 2,000 overdraft.
            h.at(2).ok(settle("r", None, 12_000));
        }
        Released => {
            h.at(1).ok(release("r"));
        }
        Expired => {
            h.at(180_000).ok(expire("r"));
        }
        UsageUnknown => {
            h.at(1).ok(start("r", "op-1"));
            h.at(600_001).ok(mark_unknown("r"));
        }
        Expiring => {
            // Never at rest after a command (ExpiryBegan and Expired are one
            // decision), but a log cut between them must still be recoverable.
            let mut g = Harness::new();
            g.ok(reserve("r", 1, 1_000));
            g.at(180_000);
            let began = g.next_event(EventBody::ExpiryBegan { id: rid("r") });
            let mut events = g.into_events();
            events.push(began);
            return Harness::given(events);
        }
        Requested => unreachable!("never stored"),
    }
    h
}

#[derive(Debug)]
enum Then {
    /// These events, and the reservation ends in this state.
    Events(&'static [&'static str], ReservationState),
    /// Idempotent retry: no events, nothing changes.
    Noop,
    /// Rejected with this code.
    Rejected(&'static str),
}
use Then::*;

#[test]
fn every_command_from_every_stored_state() {
    let o1 = Some("op-1");
    #[rustfmt::skip]
    let table: Vec<(ReservationState, Command, u64, Then)> = vec![
        // given        when                              at     then
        (Reserved,      start("r", "op-1"),               EARLY, Events(&["Started"], Started)),
        (Reserved,      start("r", "op-1"),               LATE,  Rejected("lease_expired")),
        (Reserved,      settle("r", None, 100),           EARLY, Rejected("wrong_state")),
        (Reserved,      settle("r", o1, 100),             EARLY, Rejected("wrong_state")),
        (Reserved,      release("r"),                     EARLY, Events(&["Released"], Released)),
        (Reserved,      release("r"),                     LATE,  Events(&["Released"], Released)),
        (Reserved,      expire("r"),                      EARLY, Rejected("not_yet_due")),
        (Reserved,      expire("r"),                      LATE,  Events(&["ExpiryBegan", "Expired"], Expired)),
        (Reserved,      mark_unknown("r"),                LATE,  Rejected("wrong_state")),
        (Reserved,      reserve("r", 1, 1_000),           EARLY, Noop),
        (Reserved,      reserve("r", 2, 1_000),           EARLY, Rejected("exists_with_different_digest")),

        (Started,       start("r", "op-1"),               EARLY, Noop),
        (Started,       start("r", "op-2"),               EARLY, Rejected("exists_with_different_operation_id")),
        (Started,       settle("r", None, 100),           EARLY, Events(&["Settled"], Settled)),
        (Started,       settle("r", o1, 1_000),           EARLY, Events(&["Settled"], Settled)),
        (Started,       settle("r", o1, 12_000),          EARLY, Events(&["Settled"], SettledWithDebt)),
        (Started,       settle("r", Some("op-2"), 100),   EARLY, Rejected("exists_with_different_operation_id")),
        (Started,       settle("r", None, 100),           LATE,  Events(&["Settled"], Settled)),
        (Started,       release("r"),                     EARLY, Rejected("wrong_state")),
        (Started,       expire("r"),                      LATE,  Rejected("wrong_state")),
        (Started,       mark_unknown("r"),                EARLY, Rejected("not_yet_due")),
        (Started,       mark_unknown("r"),                LATE,  Events(&["UsageUnknown"], UsageUnknown)),
        (Started,       reserve("r", 1, 1_000),           EARLY, Noop),

        (Settled,       settle("r", None, 100),           EARLY, Noop),
        (Settled,       settle("r", o1, 100),             EARLY, Noop),
        (Settled,       settle("r", None, 101),           EARLY, Rejected("exists_with_different_actual_units")),
        (Settled,       start("r", "op-1"),               EARLY, Noop),
        (Settled,       start("r", "op-2"),               EARLY, Rejected("exists_with_different_operation_id")),
        (Settled,       release("r"),                     EARLY, Rejected("wrong_state")),
        (Settled,       expire("r"),                      LATE,  Rejected("wrong_state")),
        (Settled,       mark_unknown("r"),                LATE,  Rejected("wrong_state")),
        (Settled,       reserve("r", 1, 1_000),           EARLY, Noop),

        (SettledWithDebt, settle("r", None, 12_000),      EARLY, Noop),
        (SettledWithDebt, settle("r", None, 100),         EARLY, Rejected("exists_with_different_actual_units")),
        (SettledWithDebt, release("r"),                   EARLY, Rejected("wrong_state")),
        (SettledWithDebt, expire("r"),                    LATE,  Rejected("wrong_state")),
        (SettledWithDebt, mark_unknown("r"),              LATE,  Rejected("wrong_state")),
        (SettledWithDebt, reserve("r", 1, 1_000),         EARLY, Noop),

        (Released,      release("r"),                     EARLY, Noop),
        (Released,      start("r", "op-1"),               EARLY, Rejected("wrong_state")),
        (Released,      settle("r", None, 100),           EARLY, Rejected("wrong_state")),
        (Released,      expire("r"),                      LATE,  Rejected("wrong_state")),
        (Released,      mark_unknown("r"),                LATE,  Rejected("wrong_state")),
        (Released,      reserve("r", 1, 1_000),           EARLY, Noop),
        (Released,      reserve("r", 2, 1_000),           EARLY, Rejected("exists_with_different_digest")),

        (Expired,       expire("r"),                      LATE,  Noop),
        (Expired,       start("r", "op-1"),               LATE,  Rejected("wrong_state")),
        (Expired,       settle("r", None, 100),           LATE,  Rejected("wrong_state")),
        (Expired,       release("r"),                     LATE,  Rejected("wrong_state")),
        (Expired,       mark_unknown("r"),                LATE,  Rejected("wrong_state")),
        (Expired,       reserve("r", 1, 1_000),           LATE,  Noop),

        (UsageUnknown,  settle("r", None, 100),           EARLY, Rejected("wrong_state")),
        (UsageUnknown,  settle("r", o1, 100),             EARLY, Events(&["Settled"], Settled)),
        (UsageUnknown,  settle("r", o1, 12_000),          EARLY, Events(&["Settled"], SettledWithDebt)),
        (UsageUnknown,  settle("r", Some("op-2"), 100),   EARLY, Rejected("exists_with_different_operation_id")),
        (UsageUnknown,  mark_unknown("r"),                LATE,  Noop),
        (UsageUnknown,  start("r", "op-1"),               EARLY, Noop),
        (UsageUnknown,  start("r", "op-2"),               EARLY, Rejected("exists_with_different_operation_id")),
        (UsageUnknown,  release("r"),                     EARLY, Rejected("wrong_state")),
        (UsageUnknown,  expire("r"),                      LATE,  Rejected("wrong_state")),

        (Expiring,      expire("r"),                      EARLY, Events(&["Expired"], Expired)),
        (Expiring,      start("r", "op-1"),               EARLY, Rejected("wrong_state")),
        (Expiring,      settle("r", None, 100),           EARLY, Rejected("wrong_state")),
        (Expiring,      release("r"),                     EARLY, Rejected("wrong_state")),
        (Expiring,      mark_unknown("r"),                LATE,  Rejected("wrong_state")),
    ];
    // Every stored state appears as a `given`.
    for s in ReservationState::ALL
        .into_iter()
        .filter(|&s| s != Requested)
    {
        assert!(
            table.iter().any(|row| row.0 == s),
            "no row starts from {s:?}"
        );
    }
    for (row, (given, when, at, then)) in table.into_iter().enumerate() {
        let mut h = reach(given);
        assert_eq!(h.state("r"), given, "row {row}: setup");
        let now = if at == LATE { LATE } else { h.now + at };
        h.at(now);
        let label = format!("row {row}: given {given:?} when {when:?} at {now}");
        match (h.run(when), then) {
            (Ok(events), Events(expected, state)) => {
                assert_eq!(names(&events), expected, "{label}");
                assert_eq!(h.state("r"), state, "{label}");
            }
            (Ok(events), Noop) => {
                assert!(events.is_empty(), "{label}: {events:?}");
                assert_eq!(h.state("r"), given, "{label}");
            }
            (Err(r), Rejected(code)) => {
                assert_eq!(r.code(), code, "{label}: {r}");
                assert_eq!(h.state("r"), given, "{label}");
            }
            (got, then) => panic!("{label}: expected {then:?}, got {got:?}"),
        }
    }
}

/// Event-level: for every stored state and every event that moves a reservation,
/// `try_apply` accepts it exactly when the edge is allowed, and otherwise refuses
/// with `IllegalTransition` and leaves the state untouched.
#[test]
fn every_event_move_from_every_state() {
    for from in ReservationState::ALL
        .into_iter()
        .filter(|&s| s != Requested)
    {
        for to in [
            Started,
            Settled,
            SettledWithDebt,
            Released,
            Expiring,
            Expired,
            UsageUnknown,
        ] {
            let h = reach(from);
            let r = h.rec("r").clone();
            let available = h.available();
            let id = rid("r");
            let body = match to {
                Started => EventBody::Started {
                    id,
                    operation_id: op("op-9"),
                    execution_deadline_ms: LATE * 2,
                },
                Settled | SettledWithDebt => {
                    let debt = to == SettledWithDebt;
                    EventBody::Settled {
                        id,
                        actual_units: r.held_units + if debt { available + 1 } else { 0 },
                        refunded_units: 0,
                        from_available_units: if debt { available } else { 0 },
                        overdraft_units: u64::from(debt),
                        overdraft_limit_breached: false,
                        from_usage_unknown: from == UsageUnknown,
                        usage: None,
                    }
                }
                Released => EventBody::Released {
                    id,
                    refunded_units: r.held_units,
                },
                Expiring => EventBody::ExpiryBegan { id },
                Expired => EventBody::Expired {
                    id,
                    refunded_units: r.held_units,
                },
                UsageUnknown => EventBody::UsageUnknown { id },
                _ => unreachable!(),
            };
            let event = h.next_event(body);
            let mut p = h.p.clone();
            let result = try_apply(&mut p, &event);
            if from.can_move_to(to) {
                assert_eq!(result, Ok(()), "{from:?} -> {to:?}");
                assert_eq!(p.reservation(&rid("r")).unwrap().state, to);
                p.check_invariants().unwrap();
            } else {
                assert_eq!(
                    result,
                    Err(ApplyError::IllegalTransition {
                        id: rid("r"),
                        from,
                        to
                    }),
                    "{from:?} -> {to:?}"
                );
                assert_eq!(p, h.p, "{from:?} -> {to:?}: refused event changed state");
            }
        }
    }
}

/// STARTED racing EXPIRED: whichever the single writer decides first wins, and the
/// loser is refused; capacity is never both refunded and spent.
#[test]
fn start_and_expiry_race_has_one_winner() {
    // Start first (just before the lease ends), then the sweeper's expire.
    let mut h = Harness::new();
    h.ok(reserve("r", 1, 1_000));
    h.at(179_999).ok(start("r", "op-1"));
    h.at(180_000);
    assert_eq!(h.rejected(expire("r")).code(), "wrong_state");
    h.at(10_000_000);
    assert_eq!(
        h.rejected(expire("r")).code(),
        "wrong_state",
        "STARTED never expires"
    );
    assert_eq!(h.ledger().reserved_units, 1_000);

    // Expire first, then a late start.
    let mut h = Harness::new();
    h.ok(reserve("r", 1, 1_000));
    h.at(180_000).ok(expire("r"));
    assert_eq!(h.rejected(start("r", "op-1")).code(), "wrong_state");
    assert_eq!(h.ledger().reserved_units, 0);
    assert_eq!(h.available(), 10_000);
}
