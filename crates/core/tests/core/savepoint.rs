//! Savepoints: a batch applied speculatively and then taken back leaves the
//! partition exactly as it was, whatever the batch did (the writer's undo
//! after a failed append).

use reservoir_core::*;

use crate::harness::*;

/// Decides and applies `commands` on `p` through `savepoint`, as the writer does
/// with a batch, skipping the ones core rejects. Returns how many were applied.
fn speculate(
    p: &mut Partition,
    savepoint: &mut Savepoint,
    commands: &[Command],
    now: u64,
) -> usize {
    let mut applied = 0;
    for command in commands {
        if let Ok(events) = decide(p, command, now) {
            for event in &events {
                savepoint.apply(p, event);
                p.check_invariants()
                    .expect("books balance inside the batch");
            }
            applied += 1;
        }
    }
    applied
}

#[test]
fn rollback_restores_the_partition_exactly() {
    // Given: a partition with one reservation in each open state and one settled.
    let mut h = Harness::new();
    h.ok(reserve("held", 1, 1_000));
    h.ok(reserve("running", 2, 2_000));
    h.ok(start("running", "op-1"));
    h.ok(reserve("done", 3, 500));
    h.ok(start("done", "op-2"));
    h.ok(settle("done", Some("op-2"), 400));
    h.advance(60_000);
    let before = h.p.clone();

    // When: a batch that creates, starts, settles with debt, releases, refills,
    // refuses and closes, then rolls back.
    let rows: Vec<Command> = vec![
        reserve("new", 4, 700),
        start("held", "op-3"),
        settle("running", Some("op-1"), 9_000),
        release("new"),
        Command::Refill,
        reserve("too-big", 5, 1_000_000),
        reserve("new-2", 6, 300),
        Command::Close,
    ];
    let mut p = before.clone();
    let mut savepoint = Savepoint::new(&p);
    let applied = speculate(&mut p, &mut savepoint, &rows, h.now);
    assert!(
        applied >= 6,
        "the batch must do something to take back ({applied})"
    );
    assert_ne!(p, before);
    savepoint.rollback(&mut p);

    // Then: nothing of the batch is left, and the books balance.
    assert_eq!(p, before);
    p.check_invariants()
        .expect("books balance after the rollback");
}

#[test]
fn a_rollback_then_the_same_batch_gives_the_same_state() {
    let mut h = Harness::new();
    h.ok(reserve("a", 1, 1_000));
    let commands = vec![
        start("a", "op-a"),
        reserve("b", 2, 2_000),
        settle("a", Some("op-a"), 10),
    ];
    let base = h.p.clone();

    let mut once = base.clone();
    let mut sp = Savepoint::new(&once);
    speculate(&mut once, &mut sp, &commands, 5);
    let applied_once = once.clone();
    sp.rollback(&mut once);
    assert_eq!(once, base);

    // The retry after a failed append decides the same commands again.
    let mut sp = Savepoint::new(&once);
    speculate(&mut once, &mut sp, &commands, 5);
    assert_eq!(once, applied_once);
    once.check_invariants().expect("books balance");
}
