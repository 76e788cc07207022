//! Commands on a partition itself: opening it (a subject/route's first, or a
//! successor that opens empty), and the two halves of a move of capacity and
//! debt from one of a subject/route's partitions to the next.

use super::{check_amount, check_dimension_count, Decision, Fact};
use crate::command::Command;
use crate::dimension::DimensionAmounts;
use crate::event::EventBody;
use crate::partition::{Partition, MAX_MOVES_PER_PARTITION};
use crate::policy::Policy;
use crate::rejection::{InvalidInput, Rejection};
use crate::types::Units;

/// Whether a partition opens with the policy's `opening_units` or empty.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Opening {
    First,
    Successor,
}

pub(super) fn open(
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

/// `MoveOut`, the first half of a move.
pub(super) fn move_out(partition: &Partition, policy: &Policy, command: &Command) -> Decision {
    let Command::MoveOut {
        move_id,
        to,
        units,
        further_units,
    } = command
    else {
        unreachable!("called for MoveOut only");
    };
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

/// `MoveIn`, the second half: what the paired `MoveOut` took.
pub(super) fn move_in(partition: &Partition, policy: &Policy, command: &Command) -> Decision {
    let Command::MoveIn {
        move_id,
        from,
        units,
        debt_units,
        further,
    } = command
    else {
        unreachable!("called for MoveIn only");
    };
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

/// The units of moves' further amounts, in order.
fn moved_units(further: &[DimensionAmounts]) -> impl Iterator<Item = Units> + '_ {
    further.iter().map(|a| match a {
        DimensionAmounts::Moved { units, .. } => *units,
        _ => 0,
    })
}
