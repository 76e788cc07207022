//! The end of a started call: settling it with what it used (also the
//! operation receipt that resolves USAGE_UNKNOWN), or marking its usage
//! unknown once it passed its hard execution limit unsettled.

use super::{check_amount, check_dimension_count, record, wrong_state, Decision, Fact, Records};
use crate::buckets;
use crate::command::Command;
use crate::dimension::DimensionAmounts;
use crate::event::EventBody;
use crate::partition::Partition;
use crate::policy::Policy;
use crate::rejection::{Rejection, Transition};
use crate::reservation::{Reservation, ReservationState};
use crate::types::{ReservationId, TimestampMs, Units};
use crate::usage::Usage;

/// `Settle`: a repeat with the same actual units is already done; a started
/// call, or one whose usage is unknown answered by its operation receipt,
/// settles.
pub(super) fn settle(records: &Records<'_>, policy: &Policy, command: &Command) -> Decision {
    let Command::Settle {
        id,
        operation_id,
        actual_units,
        usage,
        further_actual_units,
    } = command
    else {
        unreachable!("called for Settle only");
    };
    let partition = records.partition;
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
        ReservationState::Started => Ok(vec![settlement(
            partition,
            policy,
            r,
            (*actual_units, further_actual_units),
            usage,
            false,
        )]),
        // Only an operation receipt resolves UNKNOWN: it must name the operation.
        ReservationState::UsageUnknown if operation_id.is_some() => Ok(vec![settlement(
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

/// The settlement of `r` with `actual` used (primary, further), in every dimension.
fn settlement(
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

/// `MarkUsageUnknown`: a started call past its execution deadline.
pub(super) fn mark_usage_unknown(
    records: &Records<'_>,
    id: &ReservationId,
    now: TimestampMs,
) -> Decision {
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
