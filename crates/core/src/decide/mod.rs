//! `decide`: a command against the current state, at the writer-assigned `now`,
//! gives the events to append or a [`Rejection`]. It never mutates anything.
//!
//! An `Ok(vec![])` answer means "already done": an idempotent retry whose receipt
//! is the existing record, so the caller answers from state and appends nothing.
//!
//! This file holds the entry points, the checks every command shares and the
//! dispatch over command kinds. Each family of commands is decided in its own
//! file: `partitions` (open, moves), `reserve` (admission), `lease` (start,
//! release, expire), `settle` (settle, usage unknown) and `shards` (emergency
//! shards).

mod lease;
mod partitions;
mod reserve;
mod settle;
mod shards;

use self::partitions::Opening;
use crate::buckets;
use crate::command::Command;
use crate::dimension::DimensionAmounts;
use crate::event::{Event, EventBody, RefusalReason};
use crate::partition::{dimension_effect, ledger_effect, Partition};
use crate::policy::{Policy, MAX_UNITS};
use crate::rejection::{InvalidInput, Rejection, Transition};
use crate::reservation::Reservation;
use crate::types::{ReservationId, TimestampMs, Units};

/// An event before it is numbered: its body and its amounts in the policy's
/// further dimensions (see [`crate::dimension`]).
struct Fact {
    body: EventBody,
    further: Vec<DimensionAmounts>,
}

impl From<EventBody> for Fact {
    /// An event that moves nothing in further dimensions.
    fn from(body: EventBody) -> Fact {
        Fact {
            body,
            further: Vec::new(),
        }
    }
}

type Decision = Result<Vec<Fact>, Rejection>;

/// Decides `command` against `partition` at `now_ms`.
pub fn decide(
    partition: &Partition,
    command: &Command,
    now_ms: TimestampMs,
) -> Result<Vec<Event>, Rejection> {
    decide_with(partition, None, command, now_ms)
}

/// Decides a command about a reservation whose record has left the
/// partition's memory ([`crate::retention`]), against that record as the
/// writer kept it on disk. The record is finished, so the answer is always
/// "already done" (`Ok(vec![])`, answered from the record) or a rejection,
/// exactly as while it was in memory: never an event, never a second
/// reservation under the same id.
pub fn decide_retired(
    partition: &Partition,
    retired: &Reservation,
    command: &Command,
    now_ms: TimestampMs,
) -> Result<Vec<Event>, Rejection> {
    assert!(
        retired.state.is_terminal() && command.reservation_id() == Some(&retired.id),
        "a retired record is finished and named by the command"
    );
    let events = decide_with(partition, Some(retired), command, now_ms)?;
    assert!(events.is_empty(), "a finished record takes no more events");
    Ok(events)
}

fn decide_with(
    partition: &Partition,
    retired: Option<&Reservation>,
    command: &Command,
    now_ms: TimestampMs,
) -> Result<Vec<Event>, Rejection> {
    if now_ms < partition.last_at_ms {
        return Err(InvalidInput::TimeWentBackwards {
            now_ms,
            last_ms: partition.last_at_ms,
        }
        .into());
    }
    let facts = match command {
        Command::OpenPartition { key, policy } => {
            partitions::open(partition, key, policy, Opening::First)
        }
        Command::OpenSuccessor { key, policy } => {
            partitions::open(partition, key, policy, Opening::Successor)
        }
        _ => {
            let policy = partition
                .policy
                .as_ref()
                .ok_or(Rejection::PartitionNotOpen)?;
            let records = Records { partition, retired };
            decide_open(&records, policy, command, now_ms)
        }
    }?;
    // The amounts are valid one by one; here their sums with the ledger terms are
    // checked, so a total that would overflow is refused and never reaches `apply`
    // (where it would crash). `decide` never under-runs a term, so an error here is
    // always an overflow.
    let mut ledger = partition.ledger;
    let mut further: Vec<_> = partition.further.iter().map(|d| d.ledger).collect();
    for fact in &facts {
        ledger_effect(&mut ledger, &fact.body).map_err(|_| InvalidInput::Overflow)?;
        if further.len() < fact.further.len() {
            further.resize(fact.further.len(), Default::default()); // opening
        }
        for (l, amounts) in further.iter_mut().zip(&fact.further) {
            dimension_effect(l, &fact.body, amounts).map_err(|_| InvalidInput::Overflow)?;
        }
    }
    // Both sides of the decision, in the build we ship: a state that was already
    // broken, or events that would break it, crash here rather than reach the log.
    assert_eq!(
        partition.check_ledgers(),
        Ok(()),
        "decide called on a partition whose books do not balance"
    );
    for l in std::iter::once(&ledger).chain(&further) {
        assert_eq!(l.check(), Ok(()), "decide produced unbalanced events");
    }
    stamp(partition, facts, now_ms)
}

/// The event to log when a reserve was refused for a limit, so refusal patterns
/// can be diagnosed later. `None` for rejections that are not limit refusals.
pub fn refusal_event(
    partition: &Partition,
    command: &Command,
    rejection: &Rejection,
    now_ms: TimestampMs,
) -> Option<Event> {
    let (
        Command::Reserve {
            id,
            units,
            further_units,
            ..
        },
        Some(policy),
    ) = (command, partition.policy.as_ref())
    else {
        return None;
    };
    let reason = match rejection {
        Rejection::InsufficientCapacity { .. } => RefusalReason::InsufficientCapacity,
        Rejection::DebtOutstanding { .. } => RefusalReason::DebtOutstanding,
        Rejection::RequestTooLarge { .. } => RefusalReason::RequestTooLarge,
        _ => return None,
    };
    let dimension = rejection.dimension()?;
    let requested_units = match policy.dimension_index(dimension)? {
        0 => *units,
        i => *further_units.get(i - 1)?,
    };
    let body = EventBody::AdmissionRefused {
        id: id.clone(),
        requested_units,
        reason,
        retry_after_ms: rejection.retry_after_ms(),
        dimension: Some(dimension),
    };
    stamp(
        partition,
        vec![body.into()],
        now_ms.max(partition.last_at_ms),
    )
    .ok()?
    .pop()
}

/// Numbers the events after the partition's last one. A partition whose
/// sequence would pass `u64::MAX` refuses (`Overflow`) rather than wrap.
fn stamp(
    partition: &Partition,
    facts: Vec<Fact>,
    now_ms: TimestampMs,
) -> Result<Vec<Event>, Rejection> {
    let mut sequence = partition.last_sequence;
    facts
        .into_iter()
        .map(|Fact { body, further }| {
            sequence = sequence.checked_add(1).ok_or(InvalidInput::Overflow)?;
            Ok(Event {
                sequence,
                at_ms: now_ms,
                body,
                further,
            })
        })
        .collect()
}

/// Checks that a command gives one amount per further dimension.
fn check_dimension_count(policy: &Policy, given: usize) -> Result<(), InvalidInput> {
    let expected = policy.dimension_count();
    if given + 1 != expected {
        return Err(InvalidInput::DimensionCount {
            given: given + 1,
            expected,
        });
    }
    Ok(())
}

fn check_units(units: Units) -> Result<(), InvalidInput> {
    match units {
        0 => Err(InvalidInput::ZeroUnits),
        u if u > MAX_UNITS => Err(InvalidInput::AbsurdUnits {
            units: u,
            limit: MAX_UNITS,
        }),
        _ => Ok(()),
    }
}

/// An amount that may be zero but never absurd.
fn check_amount(units: Units) -> Result<(), InvalidInput> {
    if units > MAX_UNITS {
        return Err(InvalidInput::AbsurdUnits {
            units,
            limit: MAX_UNITS,
        });
    }
    Ok(())
}

/// The records a decision may read: the partition's, and a retired one.
struct Records<'a> {
    partition: &'a Partition,
    retired: Option<&'a Reservation>,
}

impl<'a> Records<'a> {
    fn get(&self, id: &ReservationId) -> Option<&'a Reservation> {
        self.partition
            .reservation(id)
            .or(self.retired.filter(|r| r.id == *id))
    }
}

fn record<'a>(records: &Records<'a>, id: &ReservationId) -> Result<&'a Reservation, Rejection> {
    records
        .get(id)
        .ok_or_else(|| Rejection::UnknownReservation { id: id.clone() })
}

fn wrong_state(r: &Reservation, transition: Transition) -> Rejection {
    Rejection::WrongState {
        id: r.id.clone(),
        state: r.state,
        transition,
    }
}

/// The dispatch over an open partition's commands. A command whose fields fit
/// on its line is handed its fields; a wider one is handed the command and
/// takes it apart itself.
fn decide_open(
    records: &Records<'_>,
    policy: &Policy,
    command: &Command,
    now: TimestampMs,
) -> Decision {
    let partition = records.partition;
    match command {
        Command::OpenPartition { .. } | Command::OpenSuccessor { .. } => {
            unreachable!("handled by decide")
        }
        Command::Reserve { .. } => reserve::reserve(records, policy, command, now),
        Command::Start { id, operation_id } => lease::start(records, policy, id, operation_id, now),
        Command::Settle { .. } => settle::settle(records, policy, command),
        Command::Release { id } => lease::release(records, id),
        Command::Expire { id } => lease::expire(records, id, now),
        Command::MarkUsageUnknown { id } => settle::mark_usage_unknown(records, id, now),
        Command::Refill => Ok(buckets::pending_refill(partition, policy, now)
            .map(|(body, further)| Fact { body, further })
            .into_iter()
            .collect()),
        Command::IssueShard { .. } => shards::issue(partition, policy, command),
        Command::RemintShard { .. } => shards::remint(partition, policy, command),
        Command::Close => Ok(if partition.closed {
            vec![]
        } else {
            vec![EventBody::Closed.into()]
        }),
        Command::MoveOut { .. } => partitions::move_out(partition, policy, command),
        Command::MoveIn { .. } => partitions::move_in(partition, policy, command),
    }
}
