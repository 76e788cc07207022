//! Emergency shards: issuing one (capacity carved out of `available` for a
//! gateway to spend offline), and reminting what its reconcile confirmed
//! unused, with what the gateway spent on it.

use super::{check_units, Decision};
use crate::command::Command;
use crate::event::EventBody;
use crate::partition::{Partition, MAX_SHARDS_PER_PARTITION};
use crate::policy::{EmergencyMode, Policy};
use crate::rejection::{InvalidInput, Rejection};
use crate::types::Units;

/// `IssueShard`: a repeat with the same fields is already done; a new shard
/// must pass [`check_issuable`].
pub(super) fn issue(partition: &Partition, policy: &Policy, command: &Command) -> Decision {
    let Command::IssueShard {
        shard_id,
        units,
        gateway_id,
        boot_epoch,
        expires_at_ms,
        fence_epoch,
        signature,
    } = command
    else {
        unreachable!("called for IssueShard only");
    };
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
    check_issuable(partition, policy, *units)?;
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

/// Whether a new shard of `units` may be carved out of `partition` now:
/// emergency mode on, the generation open, the shard limit not reached, no
/// debt, and `units` available.
fn check_issuable(partition: &Partition, policy: &Policy, units: Units) -> Result<(), Rejection> {
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
    if units > available {
        return Err(Rejection::InsufficientCapacity {
            dimension: policy.limit(0).dimension,
            requested_units: units,
            available_units: available,
            retry_after_ms: None,
        });
    }
    Ok(())
}

/// `RemintShard`: at most once per shard, and never past the burst.
pub(super) fn remint(partition: &Partition, policy: &Policy, command: &Command) -> Decision {
    let Command::RemintShard {
        shard_id,
        source,
        issued_units,
        unused_units,
        spent_units,
        unknown_units,
        excess_units,
    } = command
    else {
        unreachable!("called for RemintShard only");
    };
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

fn room_below_burst(partition: &Partition, policy: &Policy) -> Units {
    let l = &partition.ledger;
    policy
        .burst_units
        .saturating_sub(l.available_units.saturating_add(l.reserved_units))
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
