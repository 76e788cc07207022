//! Bounded state: finished records leave memory after the policy's window (or
//! past the cap), deterministically, so a partition admits for ever; a command
//! about a record that left is answered from it (`decide_retired`), and a
//! savepoint takes evictions back like any other change.

use reservoir_core::retention::MAX_FINISHED_IN_MEMORY_PER_PARTITION;
use reservoir_core::*;

use crate::harness::*;

fn windowed(window_ms: u64) -> Policy {
    Policy {
        idempotency_window_ms: window_ms,
        burst_units: 1 << 40,
        opening_units: 1 << 40,
        ..policy()
    }
}

/// Decides and applies with `try_apply_evicting`, returning what left memory.
fn run(p: &mut Partition, command: &Command, now: u64) -> Vec<Reservation> {
    let mut evicted = Vec::new();
    for e in decide(p, command, now).unwrap_or_else(|r| panic!("{command:?}: {r}")) {
        try_apply_evicting(p, &e, &mut evicted).unwrap();
    }
    evicted
}

fn opened(policy: Policy) -> Partition {
    let mut p = Partition::default();
    let key = key_for(&policy);
    run(&mut p, &Command::OpenPartition { key, policy }, 0);
    p
}

#[test]
fn a_finished_record_leaves_memory_once_its_window_has_passed() {
    let mut h = Harness::open(windowed(1_000));
    h.at(10).ok(reserve("a", 1, 100));
    h.ok(start("a", "op-a"));
    h.at(20).ok(settle("a", Some("op-a"), 60));
    h.at(30).ok(reserve("open", 2, 100));
    // Inside the window: still in memory, answered as always.
    h.at(1_019).ok(reserve("b", 3, 100));
    assert_eq!(h.state("a"), ReservationState::Settled);
    assert_eq!(h.p.evicted_reservations, 0);
    // The first event at or after 20 + 1,000 takes it out; the open one stays.
    h.at(1_020).ok(release("b"));
    assert!(h.p.reservation(&rid("a")).is_none());
    assert_eq!(h.state("open"), ReservationState::Reserved);
    assert_eq!(h.p.evicted_reservations, 1);
    assert_eq!(h.p.open_reservations, 1);
    // The ledger did not move: eviction is bookkeeping, never capacity.
    assert_eq!(h.ledger().spent_units, 60);
    // Dropping the harness replays the log: the same record leaves at the same event.
}

/// A closed partition gets no event once its last call finishes, so no
/// later event's time would take its finished records out: once it is
/// closed and drained, it keeps only what finished at its last event (its
/// window is 1 ms), window or not; and a partition restored from a store
/// keeps the same.
#[test]
fn a_closed_partition_keeps_only_its_last_finished_record_once_drained() {
    let mut p = opened(windowed(600_000));
    run(&mut p, &reserve("done", 1, 100), 10);
    run(&mut p, &release("done"), 20);
    run(&mut p, &reserve("open", 2, 100), 30);
    // Closed with a call open: the window rule still holds.
    assert!(run(&mut p, &Command::Close, 40).is_empty());
    assert_eq!(
        p.reservation(&rid("done")).unwrap().state,
        ReservationState::Released
    );
    // Its last call finishes, well inside the window: the older record
    // leaves; the one this event finished stays (callers read it back).
    run(&mut p, &start("open", "op-1"), 50);
    let evicted = run(&mut p, &settle("open", Some("op-1"), 60), 60);
    let ids: Vec<&str> = evicted.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["done"]);
    assert_eq!(
        p.reservation(&rid("open")).unwrap().state,
        ReservationState::Settled
    );
    assert_eq!((p.reservations.len(), p.finished.len()), (1, 1));
    assert_eq!((p.evicted_reservations, p.open_reservations), (1, 0));
    assert_eq!(p.ledger.spent_units, 60);
    p.check_invariants().unwrap();

    // Closed when already drained: the older records leave at the close.
    let mut q = opened(windowed(600_000));
    run(&mut q, &reserve("a", 1, 100), 10);
    run(&mut q, &release("a"), 20);
    let evicted = run(&mut q, &Command::Close, 30);
    assert_eq!(evicted.len(), 1);
    assert!(q.reservations.is_empty());

    // Restored from a store holding every record: the same one in memory.
    let mut head = p.clone();
    let mut records: Vec<Reservation> = std::mem::take(&mut head.reservations)
        .into_values()
        .collect();
    head.finished.clear();
    records.push(evicted_of(&mut opened(windowed(600_000))));
    retention::restore_in_memory(&mut head, records);
    assert_eq!(head, p);
}

/// A released record finished at 20 (for a store that holds more than memory).
fn evicted_of(p: &mut Partition) -> Reservation {
    run(p, &reserve("done", 1, 100), 10);
    run(p, &release("done"), 20);
    p.reservation(&rid("done")).unwrap().clone()
}

#[test]
fn commands_about_an_evicted_record_are_answered_from_it() {
    let mut p = opened(windowed(1_000));
    run(&mut p, &reserve("a", 1, 100), 1);
    run(&mut p, &start("a", "op-a"), 2);
    run(&mut p, &settle("a", Some("op-a"), 70), 3);
    let evicted = run(&mut p, &reserve("later", 2, 10), 5_000);
    assert_eq!(evicted.len(), 1);
    let a = &evicted[0];
    assert_eq!((a.id.as_str(), a.state), ("a", ReservationState::Settled));
    let before = p.clone();
    let rows: Vec<(Command, Result<Vec<Event>, Rejection>)> = vec![
        (reserve("a", 1, 100), Ok(vec![])),
        (
            reserve("a", 9, 100),
            Err(Rejection::ExistsWithDifferentDigest { id: rid("a") }),
        ),
        (start("a", "op-a"), Ok(vec![])),
        (
            start("a", "op-other"),
            Err(Rejection::ExistsWithDifferentOperationId { id: rid("a") }),
        ),
        (settle("a", Some("op-a"), 70), Ok(vec![])),
        (
            settle("a", None, 71),
            Err(Rejection::ExistsWithDifferentActualUnits {
                id: rid("a"),
                settled_units: 70,
            }),
        ),
        (
            release("a"),
            Err(Rejection::WrongState {
                id: rid("a"),
                state: ReservationState::Settled,
                transition: Transition::Release,
            }),
        ),
    ];
    for (command, expected) in rows {
        assert_eq!(
            decide_retired(&p, a, &command, 6_000),
            expected,
            "{command:?}"
        );
    }
    // Without the retired record, the id is unknown to memory (the writer
    // never decides that way: it looks the id up on disk first).
    assert_eq!(
        decide(&p, &start("a", "op-a"), 6_000),
        Err(Rejection::UnknownReservation { id: rid("a") })
    );
    assert_eq!(p, before);
    p.check_invariants().unwrap();
}

#[test]
fn a_partition_admits_past_a_million_finished_reservations() {
    // The old limit counted every record ever made (1,000,000) and locked the
    // tenant out; now memory holds what is open plus a 1 ms window.
    let mut p = opened(windowed(1));
    let total: u64 = 1_100_000;
    let mut evicted = 0u64;
    for i in 0..total {
        let id = format!("r{i}");
        evicted += run(&mut p, &reserve(&id, 1, 3), i + 1).len() as u64;
        evicted += run(&mut p, &release(&id), i + 1).len() as u64;
        assert!(
            p.reservations.len() <= 2,
            "at {i}: {}",
            p.reservations.len()
        );
        if i % 100_000 == 0 {
            p.check_invariants().unwrap();
        }
    }
    p.check_invariants().unwrap();
    assert_eq!(p.evicted_reservations, evicted);
    assert_eq!(evicted, total - 1, "all but the last have left memory");
    assert_eq!(p.open_reservations, 0);
    assert_eq!(p.ledger.reserved_units, 0);
}

#[test]
fn memory_holds_at_most_the_cap_of_finished_records_whatever_the_window() {
    let mut p = opened(windowed(policy::MAX_SPAN_MS));
    let extra = 10;
    for i in 0..MAX_FINISHED_IN_MEMORY_PER_PARTITION + extra {
        let id = format!("r{i}");
        run(&mut p, &reserve(&id, 1, 1), 1);
        run(&mut p, &release(&id), 1);
    }
    assert_eq!(p.reservations.len(), MAX_FINISHED_IN_MEMORY_PER_PARTITION);
    assert_eq!(p.evicted_reservations, extra as u64);
    // The oldest went first.
    assert!(p.reservation(&rid("r9")).is_none());
    assert!(p.reservation(&rid("r10")).is_some());
    p.check_invariants().unwrap();
}

#[test]
fn a_rollback_puts_evicted_records_and_the_finished_queue_back() {
    let mut p = opened(windowed(1_000));
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        run(&mut p, &reserve(id, 1, 10), i as u64 + 1);
        run(&mut p, &release(id), i as u64 + 1);
    }
    run(&mut p, &reserve("open", 2, 10), 4);
    let before = p.clone();
    // A batch at t = 1,002 evicts a and b, finishes `open` and makes `d`.
    let mut savepoint = Savepoint::new(&p);
    let mut evicted = Vec::new();
    for command in [reserve("d", 3, 10), release("open"), release("d")] {
        for e in decide(&p, &command, 1_002).unwrap() {
            evicted.extend(savepoint.apply(&mut p, &e));
        }
    }
    let ids: Vec<&str> = evicted.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_ne!(p, before);
    savepoint.rollback(&mut p);
    assert_eq!(p, before);
    p.check_invariants().unwrap();
}

#[test]
fn a_policy_without_a_window_reads_as_the_default_and_zero_is_refused() {
    let mut json = serde_json::to_value(policy()).unwrap();
    json.as_object_mut()
        .unwrap()
        .remove("idempotency_window_ms");
    let old: Policy = serde_json::from_value(json).unwrap();
    assert_eq!(
        old.idempotency_window_ms,
        retention::DEFAULT_IDEMPOTENCY_WINDOW_MS
    );
    let zero = Policy {
        idempotency_window_ms: 0,
        ..policy()
    };
    assert_eq!(
        zero.validate(),
        Err(InvalidInput::Policy {
            field: "idempotency_window_ms"
        })
    );
}

#[test]
fn a_finished_record_forgotten_before_its_window_counts_as_evicted_once() {
    let mut p = opened(windowed(60_000));
    run(&mut p, &reserve("done", 1, 100), 10);
    run(&mut p, &release("done"), 20);
    run(&mut p, &reserve("open", 2, 100), 30);
    let ledger = p.ledger;
    // Inside its window at the partition's last event: kept.
    assert!(retention::within_window(&p, 20));
    assert!(
        !retention::forget_finished(&mut p, &rid("open")),
        "open records stay"
    );
    assert!(retention::forget_finished(&mut p, &rid("done")));
    assert!(!retention::forget_finished(&mut p, &rid("done")), "once");
    assert!(p.reservation(&rid("done")).is_none());
    assert!(p.finished.is_empty());
    assert_eq!(p.evicted_reservations, 1);
    assert_eq!(p.ledger, ledger, "bookkeeping, never capacity");
    p.check_invariants().unwrap();
    // A later event past its window evicts nothing more.
    assert!(run(&mut p, &release("open"), 70_000).is_empty());
    assert_eq!(p.evicted_reservations, 1);
}
