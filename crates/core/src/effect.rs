//! What an event does to the conservation terms, from the amounts written in
//! it alone: [`ledger_effect`] for the primary dimension, [`dimension_effect`]
//! for any dimension given its amounts, and the checked step of the further
//! dimensions that `apply` commits with the rest.

use crate::dimension::{DimensionAmounts, DimensionState};
use crate::event::{Event, EventBody};
use crate::ledger::Ledger;
use crate::partition::{add, settled_held_units, sub, ApplyError, Partition};
use crate::types::Units;

/// What `body` does to the primary dimension's ledger terms, from the amounts
/// written in it alone. Every step is checked: a term that would overflow or go
/// below zero is an error. `decide` runs it too, so an amount that would
/// overflow is refused as a command instead of reaching `apply`.
pub fn ledger_effect(l: &mut Ledger, body: &EventBody) -> Result<(), ApplyError> {
    match body {
        EventBody::ShardIssued { units, .. } => {
            l.available_units = sub(l.available_units, *units)?;
            l.retired_for_emergency_units = add(l.retired_for_emergency_units, *units)?;
        }
        EventBody::ShardReminted {
            units,
            excess_units,
            ..
        } => {
            l.reminted_units = add(l.reminted_units, *units)?;
            l.available_units = add(l.available_units, *units)?;
            // Spend reported beyond the shard's allocation is a debt, like an
            // overdraft on settle: issued and spent, so admission stops until
            // refills repay it.
            l.overdraft_issued_units = add(l.overdraft_issued_units, *excess_units)?;
            l.spent_units = add(l.spent_units, *excess_units)?;
        }
        _ => {
            if let Some(amounts) = primary_amounts(body) {
                dimension_effect(l, body, &amounts)?;
            }
        }
    }
    Ok(())
}

/// The body's own amounts (the primary dimension's) in the form further
/// dimensions carry theirs; `None` for an event that moves no amounts
/// (or, for shard events, moves them in the primary dimension only).
pub fn primary_amounts(body: &EventBody) -> Option<DimensionAmounts> {
    Some(match body {
        EventBody::PartitionOpened { opening_units, .. } => DimensionAmounts::Opened {
            opening_units: *opening_units,
        },
        EventBody::Refilled {
            minted_units,
            repaid_units,
            remainder,
        } => DimensionAmounts::Refilled {
            minted_units: *minted_units,
            repaid_units: *repaid_units,
            remainder: *remainder,
        },
        EventBody::Reserved {
            reserved_units,
            held_units,
            ..
        } => DimensionAmounts::Reserved {
            reserved_units: *reserved_units,
            held_units: *held_units,
        },
        EventBody::Settled {
            actual_units,
            refunded_units,
            from_available_units,
            overdraft_units,
            overdraft_limit_breached,
            ..
        } => DimensionAmounts::Settled {
            actual_units: *actual_units,
            refunded_units: *refunded_units,
            from_available_units: *from_available_units,
            overdraft_units: *overdraft_units,
            overdraft_limit_breached: *overdraft_limit_breached,
        },
        EventBody::Released { refunded_units, .. } | EventBody::Expired { refunded_units, .. } => {
            DimensionAmounts::Refunded {
                refunded_units: *refunded_units,
            }
        }
        EventBody::MovedOut {
            units, debt_units, ..
        }
        | EventBody::MovedIn {
            units, debt_units, ..
        } => DimensionAmounts::Moved {
            units: *units,
            debt_units: *debt_units,
        },
        _ => return None,
    })
}

/// What `amounts` do to one dimension's ledger, for an event of `body`'s type
/// (which says, for a move, which way it goes). The primary dimension runs
/// through here with [`primary_amounts`]; further dimensions with theirs.
pub fn dimension_effect(
    l: &mut Ledger,
    body: &EventBody,
    amounts: &DimensionAmounts,
) -> Result<(), ApplyError> {
    match (body, *amounts) {
        (EventBody::PartitionOpened { .. }, DimensionAmounts::Opened { opening_units }) => {
            l.opening_units = opening_units;
            l.available_units = opening_units;
        }
        (
            EventBody::Refilled { .. },
            DimensionAmounts::Refilled {
                minted_units,
                repaid_units,
                ..
            },
        ) => {
            l.minted_units = add(l.minted_units, minted_units)?;
            l.overdraft_repaid_units = add(l.overdraft_repaid_units, repaid_units)?;
            l.available_units = add(l.available_units, sub(minted_units, repaid_units)?)?;
        }
        (EventBody::Reserved { .. }, DimensionAmounts::Reserved { held_units, .. }) => {
            l.available_units = sub(l.available_units, held_units)?;
            l.reserved_units = add(l.reserved_units, held_units)?;
        }
        (
            EventBody::Settled { .. },
            DimensionAmounts::Settled {
                actual_units,
                refunded_units,
                from_available_units,
                overdraft_units,
                ..
            },
        ) => {
            let held = settled_held_units(
                actual_units,
                refunded_units,
                from_available_units,
                overdraft_units,
            )?;
            l.reserved_units = sub(l.reserved_units, held)?;
            l.available_units = sub(
                add(l.available_units, refunded_units)?,
                from_available_units,
            )?;
            l.spent_units = add(l.spent_units, actual_units)?;
            l.overdraft_issued_units = add(l.overdraft_issued_units, overdraft_units)?;
        }
        (
            EventBody::Released { .. } | EventBody::Expired { .. },
            DimensionAmounts::Refunded { refunded_units },
        ) => {
            l.reserved_units = sub(l.reserved_units, refunded_units)?;
            l.available_units = add(l.available_units, refunded_units)?;
        }
        (EventBody::MovedOut { .. }, DimensionAmounts::Moved { units, debt_units }) => {
            l.available_units = sub(l.available_units, units)?;
            l.moved_out_units = add(l.moved_out_units, units)?;
            l.debt_moved_out_units = add(l.debt_moved_out_units, debt_units)?;
        }
        (EventBody::MovedIn { .. }, DimensionAmounts::Moved { units, debt_units }) => {
            l.available_units = add(l.available_units, units)?;
            l.moved_in_units = add(l.moved_in_units, units)?;
            l.debt_moved_in_units = add(l.debt_moved_in_units, debt_units)?;
        }
        _ => {
            return Err(ApplyError::Inconsistent(
                "dimension amounts of another kind than the event",
            ))
        }
    }
    Ok(())
}

/// The further dimensions' states after `event`, checked like the primary's
/// (every term in range, conservation, a refill never lifting the bucket
/// above the burst), or `None` when the event moves nothing in them. An
/// event carries one amount per further dimension exactly when it moves
/// amounts ([`EventBody::moves_amounts`]).
pub(crate) fn next_further(
    p: &Partition,
    event: &Event,
) -> Result<Option<Vec<DimensionState>>, ApplyError> {
    let body = &event.body;
    // The states the amounts apply to: none yet for an opening, else the
    // partition's (only copied below, once the event is known to move any).
    let (policy, current) = match (body, p.policy.as_ref()) {
        (EventBody::PartitionOpened { policy, .. }, _) => (policy, None),
        (_, Some(policy)) => (policy, Some(&p.further)),
        (_, None) => return Err(ApplyError::NotOpen),
    };
    let expected = if body.moves_amounts() {
        policy.dimensions.len()
    } else {
        0
    };
    let known = current.map_or(policy.dimensions.len(), Vec::len);
    if event.further.len() != expected || known != policy.dimensions.len() {
        return Err(ApplyError::Inconsistent(
            "an event that moves amounts names them in every further dimension, any other in none",
        ));
    }
    if expected == 0 {
        return Ok(None);
    }
    let mut states = match current {
        Some(states) => states.clone(),
        None => vec![DimensionState::default(); expected],
    };
    for ((state, amounts), limit) in states
        .iter_mut()
        .zip(&event.further)
        .zip(&policy.dimensions)
    {
        dimension_effect(&mut state.ledger, body, amounts)?;
        match *amounts {
            // A successor opens every dimension with nothing.
            DimensionAmounts::Opened { opening_units }
                if opening_units != limit.opening_units && opening_units != 0 =>
            {
                return Err(ApplyError::Inconsistent(
                    "opening units differ from the policy",
                ));
            }
            DimensionAmounts::Refilled {
                minted_units,
                repaid_units,
                remainder,
            } => {
                check_refill_burst(&state.ledger, minted_units, repaid_units, limit.burst_units)?;
                state.refill_remainder = remainder;
            }
            _ => {}
        }
        state.ledger.check()?;
    }
    Ok(Some(states))
}

/// Refill credit above the burst is dropped, never minted: a refill that put
/// anything into `available` must leave `available + reserved <= burst`.
pub(crate) fn check_refill_burst(
    after: &Ledger,
    minted_units: Units,
    repaid_units: Units,
    burst_units: Units,
) -> Result<(), ApplyError> {
    let bucket = u128::from(after.available_units) + u128::from(after.reserved_units);
    if minted_units > repaid_units && bucket > u128::from(burst_units) {
        return Err(ApplyError::Inconsistent(
            "a refill lifted available + reserved above the burst",
        ));
    }
    Ok(())
}
