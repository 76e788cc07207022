//! `decide`: a command against the current state, at the writer-assigned `now`,
//! gives the events to append or a [`Rejection`]. It never mutates anything.
//!
//! An `Ok(vec![])` answer means "already done": an idempotent retry whose receipt
//! is the existing record, so the caller answers from state and appends nothing.

use crate::buckets;
use crate::command::Command;
use crate::dimension::{Dimension, DimensionAmounts};
use crate::event::{Event, EventBody, RefusalReason};
use crate::partition::{
    dimension_effect, ledger_effect, Partition, MAX_MOVES_PER_PARTITION, MAX_SHARDS_PER_PARTITION,
};
use crate::policy::{EmergencyMode, Policy, MAX_UNITS};
use crate::rejection::{InvalidInput, Rejection, Transition};
use crate::reservation::{Reservation, ReservationState, ShadowVerdict};
use crate::retention::MAX_OPEN_RESERVATIONS_PER_PARTITION;
use crate::rollout::Mode;
use crate::types::{ReservationId, TimestampMs, Units};
use crate::usage::Usage;

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
        Command::OpenPartition { key, policy } => open(partition, key, policy, Opening::First),
        Command::OpenSuccessor { key, policy } => open(partition, key, policy, Opening::Successor),
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

/// Whether a partition opens with the policy's `opening_units` or empty.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opening {
    First,
    Successor,
}

fn open(
    partition: &Partition,
    key: &crate::types::PartitionKey,
    policy: &Policy,
    opening: Opening,
) -> Decision {
    let opened = |units: Units| match opening {
        Opening::First => units,
        Opening::Successor => 0,
    };
    key.validate()?;
    policy.validate()?;
    if key.subject != policy.subject
        || key.route != policy.route
        || key.policy_generation != policy.generation
    {
        return Err(InvalidInput::WrongPartition {
            expected: format!("{}|{}|g{}", policy.subject, policy.route, policy.generation),
            found: key.to_string(),
        }
        .into());
    }
    match (&partition.key, &partition.policy) {
        (Some(k), Some(p))
            if k == key && p == policy && partition_opened_as(partition, opening) =>
        {
            Ok(vec![])
        }
        (Some(_), _) => Err(Rejection::PartitionExistsWithDifferentPolicy),
        _ => Ok(vec![Fact {
            body: EventBody::PartitionOpened {
                key: key.clone(),
                policy: policy.clone(),
                opening_units: opened(policy.opening_units),
            },
            further: policy
                .dimensions
                .iter()
                .map(|l| DimensionAmounts::Opened {
                    opening_units: opened(l.opening_units),
                })
                .collect(),
        }]),
    }
}

/// Whether an open partition was opened the way `opening` asks: a
/// successor with nothing, a first partition with its policy's opening
/// (the same for a policy that opens with nothing).
fn partition_opened_as(partition: &Partition, opening: Opening) -> bool {
    let opened = partition.ledger.opening_units;
    let policy_opening = partition.policy.as_ref().map_or(0, |p| p.opening_units);
    match opening {
        Opening::First => opened == policy_opening,
        Opening::Successor => opened == 0,
    }
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
        Command::Reserve {
            id,
            digest,
            units,
            sizing,
            further_units,
        } => {
            check_units(*units)?;
            check_dimension_count(policy, further_units.len())?;
            for &u in further_units {
                check_amount(u)?;
            }
            if sizing.is_some_and(|s| policy.sized_units(&s) != (*units, further_units.clone())) {
                return Err(InvalidInput::Policy {
                    field: "sizing.units",
                }
                .into());
            }
            if let Some(existing) = records.get(id) {
                return if existing.digest == *digest {
                    Ok(vec![])
                } else {
                    Err(Rejection::ExistsWithDifferentDigest { id: id.clone() })
                };
            }
            if partition.closed {
                return Err(Rejection::GenerationClosed {
                    generation: policy.generation,
                });
            }
            if partition.open_reservations >= MAX_OPEN_RESERVATIONS_PER_PARTITION {
                // By a lease from now every reservation unstarted now has been
                // released, started or expired.
                return Err(Rejection::OpenReservationsLimit {
                    limit: MAX_OPEN_RESERVATIONS_PER_PARTITION,
                    retry_after_ms: policy.hold_ttl_ms,
                });
            }
            let refill = buckets::pending_refill(partition, policy, now);
            let after = buckets::after_refill(partition, refill.as_ref());
            // Every dimension's units, primary first (the count was checked above).
            let n = policy.dimension_count();
            let mut all_units = [0; crate::dimension::MAX_DIMENSIONS];
            all_units[0] = *units;
            all_units[1..n].copy_from_slice(further_units);
            let leases = |i: usize| unstarted_leases(partition, i, now);
            let verdict = buckets::admission(policy, &all_units[..n], &after[..n], &leases);
            let (holds, shadow, shadow_dimension) = match (verdict, policy.mode()) {
                (Ok(()), Mode::Enforce) => (true, None, None),
                (Ok(()), Mode::Shadow) => (true, Some(ShadowVerdict::WouldAdmit), None),
                (Err(rejection), Mode::Enforce) => return Err(rejection),
                (Err(rejection), Mode::Shadow) => {
                    let (verdict, dimension) = shadow_verdict(&rejection);
                    (false, Some(verdict), dimension)
                }
            };
            // A shadow admission enforcement would have refused holds nothing.
            let held = |units: Units| if holds { units } else { 0 };
            let expires_at_ms = now
                .checked_add(policy.hold_ttl_ms)
                .ok_or(InvalidInput::Overflow)?;
            let reserved = Fact {
                body: EventBody::Reserved {
                    id: id.clone(),
                    digest: *digest,
                    reserved_units: *units,
                    held_units: held(*units),
                    expires_at_ms,
                    shadow,
                    shadow_dimension,
                    sizing: *sizing,
                },
                further: further_units
                    .iter()
                    .map(|&u| DimensionAmounts::Reserved {
                        reserved_units: u,
                        held_units: held(u),
                    })
                    .collect(),
            };
            let refill = refill.map(|(body, further)| Fact { body, further });
            Ok(refill.into_iter().chain([reserved]).collect())
        }
        Command::Start { id, operation_id } => {
            let r = record(records, id)?;
            match (&r.operation_id, r.state) {
                (Some(bound), _) if bound == operation_id => Ok(vec![]),
                (Some(_), _) => Err(Rejection::ExistsWithDifferentOperationId { id: id.clone() }),
                (None, ReservationState::Reserved) if now >= r.expires_at_ms => {
                    Err(Rejection::LeaseExpired {
                        id: id.clone(),
                        expires_at_ms: r.expires_at_ms,
                    })
                }
                (None, ReservationState::Reserved) => Ok(vec![EventBody::Started {
                    id: id.clone(),
                    operation_id: operation_id.clone(),
                    execution_deadline_ms: now
                        .checked_add(policy.hard_execution_limit_ms)
                        .ok_or(InvalidInput::Overflow)?,
                }
                .into()]),
                (None, _) => Err(wrong_state(r, Transition::Start)),
            }
        }
        Command::Settle {
            id,
            operation_id,
            actual_units,
            usage,
            further_actual_units,
        } => {
            if let Some(usage) = usage {
                usage.validate()?;
            }
            check_dimension_count(policy, further_actual_units.len())?;
            for &u in std::iter::once(actual_units).chain(further_actual_units) {
                check_amount(u)?;
            }
            let r = record(records, id)?;
            if let (Some(given), Some(bound)) = (operation_id, &r.operation_id) {
                if given != bound {
                    return Err(Rejection::ExistsWithDifferentOperationId { id: id.clone() });
                }
            }
            match r.state {
                ReservationState::Settled | ReservationState::SettledWithDebt => {
                    let further_same = r
                        .further
                        .iter()
                        .map(|h| h.actual_units)
                        .eq(further_actual_units.iter().map(|&u| Some(u)));
                    match r.actual_units {
                        Some(settled) if settled == *actual_units && further_same => Ok(vec![]),
                        settled => Err(Rejection::ExistsWithDifferentActualUnits {
                            id: id.clone(),
                            settled_units: settled.unwrap_or(0),
                        }),
                    }
                }
                ReservationState::Started => Ok(vec![settle(
                    partition,
                    policy,
                    r,
                    (*actual_units, further_actual_units),
                    usage,
                    false,
                )]),
                // Only an operation receipt resolves UNKNOWN: it must name the operation.
                ReservationState::UsageUnknown if operation_id.is_some() => Ok(vec![settle(
                    partition,
                    policy,
                    r,
                    (*actual_units, further_actual_units),
                    usage,
                    true,
                )]),
                _ => Err(wrong_state(r, Transition::Settle)),
            }
        }
        Command::Release { id } => {
            let r = record(records, id)?;
            match r.state {
                ReservationState::Released => Ok(vec![]),
                ReservationState::Reserved => Ok(vec![refund(
                    r,
                    EventBody::Released {
                        id: id.clone(),
                        refunded_units: r.held_units,
                    },
                )]),
                _ => Err(wrong_state(r, Transition::Release)),
            }
        }
        Command::Expire { id } => {
            let r = record(records, id)?;
            match r.state {
                ReservationState::Expired => Ok(vec![]),
                // A log cut between ExpiryBegan and Expired (an older writer, a
                // hand-repaired log) must not leave the hold stuck: finish the expiry.
                ReservationState::Expiring => Ok(vec![refund(
                    r,
                    EventBody::Expired {
                        id: id.clone(),
                        refunded_units: r.held_units,
                    },
                )]),
                ReservationState::Reserved if now < r.expires_at_ms => Err(Rejection::NotYetDue {
                    id: id.clone(),
                    due_at_ms: r.expires_at_ms,
                }),
                ReservationState::Reserved => Ok(vec![
                    EventBody::ExpiryBegan { id: id.clone() }.into(),
                    refund(
                        r,
                        EventBody::Expired {
                            id: id.clone(),
                            refunded_units: r.held_units,
                        },
                    ),
                ]),
                _ => Err(wrong_state(r, Transition::Expire)),
            }
        }
        Command::MarkUsageUnknown { id } => {
            let r = record(records, id)?;
            match (r.state, r.execution_deadline_ms) {
                (ReservationState::UsageUnknown, _) => Ok(vec![]),
                (ReservationState::Started, Some(due)) if now < due => Err(Rejection::NotYetDue {
                    id: id.clone(),
                    due_at_ms: due,
                }),
                (ReservationState::Started, _) => {
                    Ok(vec![EventBody::UsageUnknown { id: id.clone() }.into()])
                }
                _ => Err(wrong_state(r, Transition::MarkUsageUnknown)),
            }
        }
        Command::Refill => Ok(buckets::pending_refill(partition, policy, now)
            .map(|(body, further)| Fact { body, further })
            .into_iter()
            .collect()),
        Command::IssueShard {
            shard_id,
            units,
            gateway_id,
            boot_epoch,
            expires_at_ms,
            fence_epoch,
            signature,
        } => {
            check_units(*units)?;
            crate::types::validate_id("gateway id", gateway_id)?;
            if let Some(s) = partition.shards_issued.get(shard_id) {
                let same = s.units == *units
                    && s.gateway_id == *gateway_id
                    && s.boot_epoch == *boot_epoch
                    && s.expires_at_ms == *expires_at_ms;
                return if same {
                    Ok(vec![])
                } else {
                    Err(Rejection::ExistsWithDifferentFields)
                };
            }
            if policy.emergency_mode == EmergencyMode::Disabled {
                return Err(Rejection::EmergencyDisabled);
            }
            if partition.closed {
                return Err(Rejection::GenerationClosed {
                    generation: policy.generation,
                });
            }
            if partition.shards_issued.len() >= MAX_SHARDS_PER_PARTITION {
                return Err(Rejection::LimitReached {
                    what: "shards",
                    limit: MAX_SHARDS_PER_PARTITION,
                });
            }
            // Shards are carved only while the ledger is healthy: no debt in
            // any dimension.
            let debt = partition
                .ledgers()
                .map(|l| l.debt_units().unwrap_or(0))
                .max()
                .unwrap_or(0);
            if debt > 0 {
                return Err(Rejection::DebtOutstanding {
                    dimension: policy.limit(0).dimension,
                    debt_units: debt,
                    retry_after_ms: None,
                });
            }
            let available = partition.ledger.available_units;
            if *units > available {
                return Err(Rejection::InsufficientCapacity {
                    dimension: policy.limit(0).dimension,
                    requested_units: *units,
                    available_units: available,
                    retry_after_ms: None,
                });
            }
            Ok(vec![EventBody::ShardIssued {
                shard_id: shard_id.clone(),
                units: *units,
                gateway_id: gateway_id.clone(),
                boot_epoch: *boot_epoch,
                expires_at_ms: *expires_at_ms,
                fence_epoch: *fence_epoch,
                signature: signature.clone(),
            }
            .into()])
        }
        Command::RemintShard {
            shard_id,
            source,
            issued_units,
            unused_units,
            spent_units,
            unknown_units,
            excess_units,
        } => {
            source.validate()?;
            check_shard_outcome(
                *issued_units,
                *unused_units,
                *spent_units,
                *unknown_units,
                *excess_units,
            )?;
            if let Some(done) = partition.shards_reminted.get(shard_id) {
                // Duplicate recovery of unused capacity is 0 by construction.
                return if done.source == *source {
                    Ok(vec![])
                } else {
                    Err(Rejection::ExistsWithDifferentFields)
                };
            }
            if partition.shards_reminted.len() >= MAX_SHARDS_PER_PARTITION {
                return Err(Rejection::LimitReached {
                    what: "shards",
                    limit: MAX_SHARDS_PER_PARTITION,
                });
            }
            // Never refill past the burst: what does not fit stays retired at the source.
            let units = (*unused_units).min(room_below_burst(partition, policy));
            Ok(vec![EventBody::ShardReminted {
                shard_id: shard_id.clone(),
                source: source.clone(),
                units,
                issued_units: *issued_units,
                spent_units: *spent_units,
                unknown_units: *unknown_units,
                excess_units: *excess_units,
            }
            .into()])
        }
        Command::Close => Ok(if partition.closed {
            vec![]
        } else {
            vec![EventBody::Closed.into()]
        }),
        Command::MoveOut {
            move_id,
            to,
            units,
            further_units,
        } => {
            to.validate()?;
            check_dimension_count(policy, further_units.len())?;
            if let Some(m) = partition.moves_out.get(move_id) {
                let further_same = moved_units(&m.further).eq(further_units.iter().copied());
                return if m.counterpart == *to && m.units == *units && further_same {
                    Ok(vec![])
                } else {
                    Err(Rejection::ExistsWithDifferentFields)
                };
            }
            if partition.moves_out.len() >= MAX_MOVES_PER_PARTITION {
                return Err(Rejection::LimitReached {
                    what: "moves",
                    limit: MAX_MOVES_PER_PARTITION,
                });
            }
            // A move takes units from `available` and all of the debt, in every dimension.
            let mut amounts = Vec::with_capacity(further_units.len());
            for (i, &units) in std::iter::once(units).chain(further_units).enumerate() {
                check_amount(units)?;
                let ledger = partition.ledger_of(i);
                if units > ledger.available_units {
                    return Err(Rejection::InsufficientCapacity {
                        dimension: policy.limit(i).dimension,
                        requested_units: units,
                        available_units: ledger.available_units,
                        retry_after_ms: None,
                    });
                }
                amounts.push(DimensionAmounts::Moved {
                    units,
                    debt_units: ledger.debt_units().unwrap_or(0),
                });
            }
            Ok(vec![Fact {
                body: EventBody::MovedOut {
                    move_id: move_id.clone(),
                    to: to.clone(),
                    units: *units,
                    debt_units: partition.debt_units(),
                },
                further: amounts.split_off(1),
            }])
        }
        Command::MoveIn {
            move_id,
            from,
            units,
            debt_units,
            further,
        } => {
            from.validate()?;
            check_dimension_count(policy, further.len())?;
            if let Some(m) = partition.moves_in.get(move_id) {
                let same = m.counterpart == *from
                    && m.units == *units
                    && m.debt_units == *debt_units
                    && m.further == *further;
                return if same {
                    Ok(vec![])
                } else {
                    Err(Rejection::ExistsWithDifferentFields)
                };
            }
            if partition.moves_in.len() >= MAX_MOVES_PER_PARTITION {
                return Err(Rejection::LimitReached {
                    what: "moves",
                    limit: MAX_MOVES_PER_PARTITION,
                });
            }
            for amounts in further {
                let DimensionAmounts::Moved { units, debt_units } = *amounts else {
                    return Err(InvalidInput::Policy {
                        field: "move.further",
                    }
                    .into());
                };
                check_amount(units)?;
                check_amount(debt_units)?;
            }
            check_amount(*units)?;
            check_amount(*debt_units)?;
            Ok(vec![Fact {
                body: EventBody::MovedIn {
                    move_id: move_id.clone(),
                    from: from.clone(),
                    units: *units,
                    debt_units: *debt_units,
                },
                further: further.clone(),
            }])
        }
    }
}

/// The holds of `partition`'s unstarted reservations in dimension `i`, with
/// the time to their lease expiry (the sweeper's due expiry frees them).
fn unstarted_leases(partition: &Partition, i: usize, now: TimestampMs) -> Vec<buckets::Lease> {
    partition
        .reservations
        .values()
        .filter(|r| {
            matches!(
                r.state,
                ReservationState::Reserved | ReservationState::Expiring
            )
        })
        .map(|r| buckets::Lease {
            expires_in_ms: r.expires_at_ms.saturating_sub(now),
            held_units: match i {
                0 => r.held_units,
                i => r.further.get(i - 1).map_or(0, |h| h.held_units),
            },
        })
        .collect()
}

/// The units of moves' further amounts, in order.
fn moved_units(further: &[DimensionAmounts]) -> impl Iterator<Item = Units> + '_ {
    further.iter().map(|a| match a {
        DimensionAmounts::Moved { units, .. } => *units,
        _ => 0,
    })
}

/// A release or expiry: the body's refund, and every further dimension's
/// held units back to `available`.
fn refund(r: &Reservation, body: EventBody) -> Fact {
    Fact {
        body,
        further: r
            .further
            .iter()
            .map(|h| DimensionAmounts::Refunded {
                refunded_units: h.held_units,
            })
            .collect(),
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

/// What enforcement would have refused with, and in which dimension.
fn shadow_verdict(rejection: &Rejection) -> (ShadowVerdict, Option<Dimension>) {
    match rejection {
        Rejection::RequestTooLarge { dimension, .. } => {
            (ShadowVerdict::WouldRefuseRequestTooLarge, Some(*dimension))
        }
        Rejection::DebtOutstanding { dimension, .. } => {
            (ShadowVerdict::WouldRefuseDebtOutstanding, Some(*dimension))
        }
        Rejection::InsufficientCapacity { dimension, .. } => (
            ShadowVerdict::WouldRefuseInsufficientCapacity,
            Some(*dimension),
        ),
        _ => (ShadowVerdict::WouldRefuseInsufficientCapacity, None),
    }
}

fn room_below_burst(partition: &Partition, policy: &Policy) -> Units {
    let l = &partition.ledger;
    policy
        .burst_units
        .saturating_sub(l.available_units.saturating_add(l.reserved_units))
}

/// The settlement of `r` with `actual` used (primary, further), in every dimension.
fn settle(
    partition: &Partition,
    policy: &Policy,
    r: &Reservation,
    (actual, further_actual): (Units, &[Units]),
    usage: &Option<Usage>,
    from_usage_unknown: bool,
) -> Fact {
    let split = |i: usize, held: Units, actual: Units| {
        let ledger = partition.ledger_of(i);
        let (refunded_units, from_available_units, overdraft_units) =
            buckets::settle_split(held, actual, ledger.available_units);
        DimensionAmounts::Settled {
            actual_units: actual,
            refunded_units,
            from_available_units,
            overdraft_units,
            overdraft_limit_breached: buckets::breaches(
                overdraft_units,
                ledger.debt_units().unwrap_or(0),
                policy.limit(i).max_overdraft_units,
            ),
        }
    };
    let further = r
        .further
        .iter()
        .zip(further_actual)
        .enumerate()
        .map(|(i, (hold, &actual))| split(i + 1, hold.held_units, actual))
        .collect();
    let DimensionAmounts::Settled {
        actual_units,
        refunded_units,
        from_available_units,
        overdraft_units,
        overdraft_limit_breached,
    } = split(0, r.held_units, actual)
    else {
        unreachable!("split settles");
    };
    Fact {
        body: EventBody::Settled {
            id: r.id.clone(),
            actual_units,
            refunded_units,
            from_available_units,
            overdraft_units,
            overdraft_limit_breached,
            from_usage_unknown,
            usage: usage.clone(),
        },
        further,
    }
}

/// A shard's reconcile adds up: without excess, what was spent, unknown and
/// unused fits in the allocation (less than all of it when a late reconcile
/// remints nothing); with excess, nothing is unused and the spend is the
/// allocation plus the excess exactly.
fn check_shard_outcome(
    issued: Units,
    unused: Units,
    spent: Units,
    unknown: Units,
    excess: Units,
) -> Result<(), Rejection> {
    let accounted = u128::from(spent) + u128::from(unknown);
    let fits = if excess == 0 {
        accounted + u128::from(unused) <= u128::from(issued)
    } else {
        unused == 0 && accounted == u128::from(issued) + u128::from(excess)
    };
    if fits {
        return Ok(());
    }
    Err(InvalidInput::AbsurdUnits {
        units: u64::try_from(accounted + u128::from(unused)).unwrap_or(u64::MAX),
        limit: issued,
    }
    .into())
}
