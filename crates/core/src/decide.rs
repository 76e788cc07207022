//! `decide`: a command against the current state, at the writer-assigned `now`,
//! gives the events to append or a [`Rejection`]. It never mutates anything.
//!
//! An `Ok(vec![])` answer means "already done": an idempotent retry whose receipt
//! is the existing record, so the caller answers from state and appends nothing.

use crate::command::Command;
use crate::event::{Event, EventBody, RefusalReason};
use crate::partition::{
    ledger_effect, Partition, MAX_MOVES_PER_PARTITION, MAX_SHARDS_PER_PARTITION,
};
use crate::policy::{EmergencyMode, Policy, MAX_UNITS};
use crate::rejection::{InvalidInput, Rejection, Transition};
use crate::reservation::{Reservation, ReservationState, ShadowVerdict};
use crate::retention::MAX_OPEN_RESERVATIONS_PER_PARTITION;
use crate::types::{ReservationId, TimestampMs, Units};
use crate::usage::Usage;

type Decision = Result<Vec<EventBody>, Rejection>;

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
    let bodies = match command {
        Command::OpenPartition { key, policy } => open(partition, key, policy),
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
    for body in &bodies {
        ledger_effect(&mut ledger, body).map_err(|_| InvalidInput::Overflow)?;
    }
    // Both sides of the decision, in the build we ship: a state that was already
    // broken, or events that would break it, crash here rather than reach the log.
    assert_eq!(
        partition.ledger.check(),
        Ok(()),
        "decide called on a partition whose books do not balance"
    );
    assert_eq!(ledger.check(), Ok(()), "decide produced unbalanced events");
    stamp(partition, bodies, now_ms)
}

/// The event to log when a reserve was refused for a limit, so refusal patterns
/// can be diagnosed later. `None` for rejections that are not limit refusals.
pub fn refusal_event(
    partition: &Partition,
    command: &Command,
    rejection: &Rejection,
    now_ms: TimestampMs,
) -> Option<Event> {
    let (Command::Reserve { id, units, .. }, true) = (command, partition.is_open()) else {
        return None;
    };
    let reason = match rejection {
        Rejection::InsufficientCapacity { .. } => RefusalReason::InsufficientCapacity,
        Rejection::DebtOutstanding { .. } => RefusalReason::DebtOutstanding,
        Rejection::RequestTooLarge { .. } => RefusalReason::RequestTooLarge,
        _ => return None,
    };
    let body = EventBody::AdmissionRefused {
        id: id.clone(),
        requested_units: *units,
        reason,
        retry_after_ms: rejection.retry_after_ms(),
    };
    stamp(partition, vec![body], now_ms.max(partition.last_at_ms))
        .ok()?
        .pop()
}

/// Numbers the events after the partition's last one. A partition whose
/// sequence would pass `u64::MAX` refuses (`Overflow`) rather than wrap.
fn stamp(
    partition: &Partition,
    bodies: Vec<EventBody>,
    now_ms: TimestampMs,
) -> Result<Vec<Event>, Rejection> {
    let mut sequence = partition.last_sequence;
    bodies
        .into_iter()
        .map(|body| {
            sequence = sequence.checked_add(1).ok_or(InvalidInput::Overflow)?;
            Ok(Event {
                sequence,
                at_ms: now_ms,
                body,
            })
        })
        .collect()
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

fn open(partition: &Partition, key: &crate::types::PartitionKey, policy: &Policy) -> Decision {
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
        (Some(k), Some(p)) if k == key && p == policy => Ok(vec![]),
        (Some(_), _) => Err(Rejection::PartitionExistsWithDifferentPolicy),
        _ => Ok(vec![EventBody::PartitionOpened {
            key: key.clone(),
            policy: policy.clone(),
            opening_units: policy.opening_units,
        }]),
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
        Command::OpenPartition { .. } => unreachable!("handled by decide"),
        Command::Reserve {
            id,
            digest,
            units,
            sizing,
        } => {
            check_units(*units)?;
            if sizing.is_some_and(|s| s.units != *units) {
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
            let refill = pending_refill(partition, policy, now);
            let (available, debt) = after_refill(partition, refill.as_ref());
            let verdict = admission(partition, policy, *units, available, debt);
            let (held_units, shadow) = match (verdict, policy.shadow_mode) {
                (Ok(()), false) => (*units, None),
                (Ok(()), true) => (*units, Some(ShadowVerdict::WouldAdmit)),
                (Err(rejection), false) => return Err(rejection),
                (Err(rejection), true) => (0, Some(shadow_verdict(&rejection))),
            };
            let expires_at_ms = now
                .checked_add(policy.hold_ttl_ms)
                .ok_or(InvalidInput::Overflow)?;
            let reserved = EventBody::Reserved {
                id: id.clone(),
                digest: *digest,
                reserved_units: *units,
                held_units,
                expires_at_ms,
                shadow,
                sizing: *sizing,
            };
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
                }]),
                (None, _) => Err(wrong_state(r, Transition::Start)),
            }
        }
        Command::Settle {
            id,
            operation_id,
            actual_units,
            usage,
        } => {
            if let Some(usage) = usage {
                usage.validate()?;
            }
            if *actual_units > MAX_UNITS {
                return Err(InvalidInput::AbsurdUnits {
                    units: *actual_units,
                    limit: MAX_UNITS,
                }
                .into());
            }
            let r = record(records, id)?;
            if let (Some(given), Some(bound)) = (operation_id, &r.operation_id) {
                if given != bound {
                    return Err(Rejection::ExistsWithDifferentOperationId { id: id.clone() });
                }
            }
            match r.state {
                ReservationState::Settled | ReservationState::SettledWithDebt => {
                    match r.actual_units {
                        Some(settled) if settled == *actual_units => Ok(vec![]),
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
                    *actual_units,
                    usage,
                    false,
                )]),
                // Only an operation receipt resolves UNKNOWN: it must name the operation.
                ReservationState::UsageUnknown if operation_id.is_some() => Ok(vec![settle(
                    partition,
                    policy,
                    r,
                    *actual_units,
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
                ReservationState::Reserved => Ok(vec![EventBody::Released {
                    id: id.clone(),
                    refunded_units: r.held_units,
                }]),
                _ => Err(wrong_state(r, Transition::Release)),
            }
        }
        Command::Expire { id } => {
            let r = record(records, id)?;
            match r.state {
                ReservationState::Expired => Ok(vec![]),
                // A log cut between ExpiryBegan and Expired (an older writer, a
                // hand-repaired log) must not leave the hold stuck: finish the expiry.
                ReservationState::Expiring => Ok(vec![EventBody::Expired {
                    id: id.clone(),
                    refunded_units: r.held_units,
                }]),
                ReservationState::Reserved if now < r.expires_at_ms => Err(Rejection::NotYetDue {
                    id: id.clone(),
                    due_at_ms: r.expires_at_ms,
                }),
                ReservationState::Reserved => Ok(vec![
                    EventBody::ExpiryBegan { id: id.clone() },
                    EventBody::Expired {
                        id: id.clone(),
                        refunded_units: r.held_units,
                    },
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
                    Ok(vec![EventBody::UsageUnknown { id: id.clone() }])
                }
                _ => Err(wrong_state(r, Transition::MarkUsageUnknown)),
            }
        }
        Command::Refill => Ok(pending_refill(partition, policy, now).into_iter().collect()),
        Command::IssueShard {
            shard_id,
            units,
            gateway_id,
            boot_epoch,
            expires_at_ms,
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
            // Shards are carved only while the ledger is healthy: no debt.
            let debt = partition.debt_units();
            if debt > 0 {
                return Err(Rejection::DebtOutstanding {
                    debt_units: debt,
                    retry_after_ms: None,
                });
            }
            let available = partition.ledger.available_units;
            if *units > available {
                return Err(Rejection::InsufficientCapacity {
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
            }])
        }
        Command::RemintShard {
            shard_id,
            source,
            issued_units,
            unused_units,
        } => {
            source.validate()?;
            if *unused_units > *issued_units {
                return Err(InvalidInput::AbsurdUnits {
                    units: *unused_units,
                    limit: *issued_units,
                }
                .into());
            }
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
            }])
        }
        Command::Close => Ok(if partition.closed {
            vec![]
        } else {
            vec![EventBody::Closed]
        }),
        Command::MoveOut { move_id, to, units } => {
            to.validate()?;
            if let Some(m) = partition.moves_out.get(move_id) {
                return if m.counterpart == *to && m.units == *units {
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
            if *units > MAX_UNITS {
                return Err(InvalidInput::AbsurdUnits {
                    units: *units,
                    limit: MAX_UNITS,
                }
                .into());
            }
            let available = partition.ledger.available_units;
            if *units > available {
                return Err(Rejection::InsufficientCapacity {
                    requested_units: *units,
                    available_units: available,
                    retry_after_ms: None,
                });
            }
            Ok(vec![EventBody::MovedOut {
                move_id: move_id.clone(),
                to: to.clone(),
                units: *units,
                debt_units: partition.debt_units(),
            }])
        }
        Command::MoveIn {
            move_id,
            from,
            units,
            debt_units,
        } => {
            from.validate()?;
            if let Some(m) = partition.moves_in.get(move_id) {
                let same =
                    m.counterpart == *from && m.units == *units && m.debt_units == *debt_units;
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
            for u in [*units, *debt_units] {
                if u > MAX_UNITS {
                    return Err(InvalidInput::AbsurdUnits {
                        units: u,
                        limit: MAX_UNITS,
                    }
                    .into());
                }
            }
            Ok(vec![EventBody::MovedIn {
                move_id: move_id.clone(),
                from: from.clone(),
                units: *units,
                debt_units: *debt_units,
            }])
        }
    }
}

/// The enforcement decision for a reserve, in contract order: too large is refused
/// unconditionally, then debt freezes admission, then capacity.
fn admission(
    partition: &Partition,
    policy: &Policy,
    units: Units,
    available: Units,
    debt: Units,
) -> Result<(), Rejection> {
    let max_units = policy.admissible_units();
    if units > max_units {
        return Err(Rejection::RequestTooLarge {
            requested_units: units,
            max_units,
        });
    }
    if debt > 0 {
        return Err(Rejection::DebtOutstanding {
            debt_units: debt,
            retry_after_ms: policy
                .refill
                .time_to_credit(debt, partition.refill_remainder),
        });
    }
    if units > available {
        return Err(Rejection::InsufficientCapacity {
            requested_units: units,
            available_units: available,
            retry_after_ms: policy
                .refill
                .time_to_credit(units.saturating_sub(available), partition.refill_remainder),
        });
    }
    Ok(())
}

fn shadow_verdict(rejection: &Rejection) -> ShadowVerdict {
    match rejection {
        Rejection::RequestTooLarge { .. } => ShadowVerdict::WouldRefuseRequestTooLarge,
        Rejection::DebtOutstanding { .. } => ShadowVerdict::WouldRefuseDebtOutstanding,
        _ => ShadowVerdict::WouldRefuseInsufficientCapacity,
    }
}

fn room_below_burst(partition: &Partition, policy: &Policy) -> Units {
    let l = &partition.ledger;
    policy
        .burst_units
        .saturating_sub(l.available_units.saturating_add(l.reserved_units))
}

/// The refill earned since the last one, as an event, or `None` if no whole unit
/// has been earned yet. Debt is repaid first; credit above the burst is dropped.
fn pending_refill(partition: &Partition, policy: &Policy, now: TimestampMs) -> Option<EventBody> {
    let credit = policy
        .refill
        .credit(partition.refill_anchor_ms, now, partition.refill_remainder);
    if credit.credit_units == 0 {
        return None;
    }
    let repaid_units = credit.credit_units.min(partition.debt_units());
    // `repaid_units <= credit_units` (a min): cannot under-run.
    let left = credit.credit_units.saturating_sub(repaid_units);
    let room = room_below_burst(partition, policy);
    let to_available = left.min(room);
    // A full bucket drops the fractional remainder too: refill restarts from now.
    let remainder = if to_available < left {
        0
    } else {
        credit.remainder
    };
    Some(EventBody::Refilled {
        // Both parts are at most `credit_units`, so their sum is too.
        minted_units: repaid_units.saturating_add(to_available),
        repaid_units,
        remainder,
    })
}

fn after_refill(partition: &Partition, refill: Option<&EventBody>) -> (Units, Units) {
    let (available, debt) = (partition.ledger.available_units, partition.debt_units());
    match refill {
        Some(EventBody::Refilled {
            minted_units,
            repaid_units,
            ..
        }) => (
            // A refill never lifts available above the burst, and never
            // repays more than the debt: both are checked again in `apply`.
            available.saturating_add(minted_units.saturating_sub(*repaid_units)),
            debt.saturating_sub(*repaid_units),
        ),
        _ => (available, debt),
    }
}

fn settle(
    partition: &Partition,
    policy: &Policy,
    r: &Reservation,
    actual: Units,
    usage: &Option<Usage>,
    from_usage_unknown: bool,
) -> EventBody {
    let held = r.held_units;
    let (refunded_units, from_available_units, overdraft_units) = if actual <= held {
        (held - actual, 0, 0)
    } else {
        let excess = actual - held;
        let from_available = excess.min(partition.ledger.available_units);
        (0, from_available, excess - from_available)
    };
    let debt_after = u128::from(partition.debt_units()) + u128::from(overdraft_units);
    EventBody::Settled {
        id: r.id.clone(),
        actual_units: actual,
        refunded_units,
        from_available_units,
        overdraft_units,
        overdraft_limit_breached: overdraft_units > 0
            && debt_after > u128::from(policy.max_overdraft_units),
        from_usage_unknown,
        usage: usage.clone(),
    }
}
