//! Bounded state: which reservation records a partition keeps in memory.
//!
//! A partition holds every *open* reservation (one that holds capacity) and the
//! *finished* ones (SETTLED, SETTLED_WITH_DEBT, RELEASED, EXPIRED) for the
//! policy's idempotency window. After every event, [`evict_due`] takes out of
//! memory each finished record whose window has passed at the event's time, or
//! the oldest ones once more than [`MAX_FINISHED_IN_MEMORY_PER_PARTITION`] are
//! kept. A partition that is closed and holds no open reservation keeps only
//! the records that finished at its last event (its window is 1 ms): it
//! gets no further event (an epoch roll or a new generation closed it, and
//! its last call has finished), so no later event's time would ever take
//! its records out, and it would keep them in memory, and in every
//! snapshot, for good. The rule reads nothing but the log (event times, the policy in
//! `PartitionOpened`), so the live writer, recovery, the projector and replay
//! all hold the same records at the same sequence.
//!
//! An evicted record is not forgotten: `try_apply_evicting` hands it to the
//! caller, and the writer keeps it in an on-disk index, so a retry of any id
//! ever used is still answered from its original record (never a second
//! reservation). The window is a memory/latency trade-off, not a limit on
//! idempotency.

use crate::partition::Partition;
use crate::reservation::Reservation;
use crate::types::{ReservationId, TimestampMs};

/// Default idempotency window: 10 minutes, far longer than any client's retry
/// deadline (a retry after it is still answered, from the on-disk index).
pub const DEFAULT_IDEMPOTENCY_WINDOW_MS: u64 = 600_000;

/// Finished records a partition keeps in memory at most, whatever the window:
/// a burst of traffic cannot grow memory past this (unit: records).
pub const MAX_FINISHED_IN_MEMORY_PER_PARTITION: usize = 100_000;

/// Open reservations (holding capacity) one partition admits at most (unit:
/// records). Reaching it is answered 429 with a Retry-After: open ones settle,
/// release or expire, and then the partition admits again.
pub const MAX_OPEN_RESERVATIONS_PER_PARTITION: usize = 1_000_000;

/// The partition's idempotency window (the default before it is opened),
/// 1 ms once it is closed and drained (see the module docs): what finished
/// at the event just applied stays, for the callers that read it back.
fn window_ms(p: &Partition) -> u64 {
    if p.closed && p.open_reservations == 0 {
        return 1;
    }
    p.policy
        .as_ref()
        .map_or(DEFAULT_IDEMPOTENCY_WINDOW_MS, |policy| {
            policy.idempotency_window_ms
        })
}

/// Whether the window rule still keeps a record that finished at
/// `finished_at_ms` in memory at the partition's last event (the cap aside).
pub fn within_window(p: &Partition, finished_at_ms: TimestampMs) -> bool {
    finished_at_ms.saturating_add(window_ms(p)) > p.last_at_ms
}

/// Takes a finished record out of memory before its window passed, counted
/// as evicted: the projection's retention rule deleted it from the store, so
/// a partition restored from the store ([`restore_in_memory`]) cannot hold
/// it, and one that was never restored must not hold it either. False if the
/// record is not in memory, or not finished.
pub fn forget_finished(p: &mut Partition, id: &ReservationId) -> bool {
    if !p
        .reservations
        .get(id)
        .is_some_and(|r| r.state.is_terminal())
    {
        return false;
    }
    p.reservations.remove(id);
    p.finished.retain(|(_, queued)| queued != id);
    p.evicted_reservations = p
        .evicted_reservations
        .checked_add(1)
        .expect("evicted count fits u64");
    true
}

/// Moves finished records out of memory (into `evicted`, oldest first) once
/// their window has passed at `now_ms`, or while more than the cap are kept.
pub(crate) fn evict_due(p: &mut Partition, now_ms: TimestampMs, evicted: &mut Vec<Reservation>) {
    let window = window_ms(p);
    while let Some(&(finished_at_ms, _)) = p.finished.front() {
        let over_cap = p.finished.len() > MAX_FINISHED_IN_MEMORY_PER_PARTITION;
        if !over_cap && finished_at_ms.saturating_add(window) > now_ms {
            break;
        }
        let (_, id) = p.finished.pop_front().expect("front exists");
        let record = p
            .reservations
            .remove(&id)
            .expect("every finished id names a record in memory");
        assert!(
            record.state.is_terminal(),
            "only finished records leave memory"
        );
        p.evicted_reservations = p
            .evicted_reservations
            .checked_add(1)
            .expect("evicted count fits u64");
        evicted.push(record);
    }
}

/// Puts a partition's records back into memory as the rule keeps them, from
/// a store that holds every record (the projections): the open ones, and the
/// finished ones inside the window at the partition's last event, at most the
/// cap, newest kept. `p` is a partition head (no records in memory); its
/// eviction count already says how many left. Records that finished at the
/// same millisecond queue in id order (the live order is the order they
/// finished; it differs only in which of them the cap takes out first).
pub fn restore_in_memory(p: &mut Partition, records: impl IntoIterator<Item = Reservation>) {
    assert!(
        p.reservations.is_empty() && p.finished.is_empty(),
        "restored into a head"
    );
    let mut finished = Vec::new();
    for r in records {
        match (r.state.is_terminal(), r.finished_at_ms) {
            (true, Some(at)) => {
                if within_window(p, at) {
                    finished.push((at, r));
                }
            }
            _ => {
                p.reservations.insert(r.id.clone(), r);
            }
        }
    }
    finished.sort_by(|a, b| (a.0, &a.1.id).cmp(&(b.0, &b.1.id)));
    let skip = finished
        .len()
        .saturating_sub(MAX_FINISHED_IN_MEMORY_PER_PARTITION);
    for (at, r) in finished.into_iter().skip(skip) {
        p.finished.push_back((at, r.id.clone()));
        p.reservations.insert(r.id.clone(), r);
    }
}
