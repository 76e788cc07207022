//! A reserve: the command's amounts, its idempotency and the partition's
//! limits, then admission against every dimension's buckets (enforced, or
//! only recorded in shadow mode).

use super::{check_amount, check_dimension_count, check_units, Decision, Fact, Records};
use crate::buckets;
use crate::command::Command;
use crate::dimension::{Dimension, DimensionAmounts};
use crate::event::EventBody;
use crate::partition::Partition;
use crate::policy::Policy;
use crate::rejection::{InvalidInput, Rejection};
use crate::reservation::{ReservationState, ShadowVerdict};
use crate::retention::MAX_OPEN_RESERVATIONS_PER_PARTITION;
use crate::rollout::Mode;
use crate::sizing::Sizing;
use crate::types::{RequestDigest, ReservationId, TimestampMs, Units};

/// `Reserve`: a repeat with the same digest is already done; a new
/// reservation needs an open generation and room under the open
/// reservations' limit before `admit` weighs it.
pub(super) fn reserve(
    records: &Records<'_>,
    policy: &Policy,
    command: &Command,
    now: TimestampMs,
) -> Decision {
    let Command::Reserve {
        id,
        digest,
        units,
        sizing,
        further_units,
    } = command
    else {
        unreachable!("called for Reserve only");
    };
    let partition = records.partition;
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
    admit(
        partition,
        policy,
        id,
        digest,
        (*units, further_units),
        sizing,
        now,
    )
}

/// Admission of a new reservation of `units` (primary, further): the refill
/// due first, then every dimension's verdict. In shadow mode a refusal is
/// recorded and the reservation admitted holding nothing.
fn admit(
    partition: &Partition,
    policy: &Policy,
    id: &ReservationId,
    digest: &RequestDigest,
    (units, further_units): (Units, &[Units]),
    sizing: &Option<Sizing>,
    now: TimestampMs,
) -> Decision {
    let refill = buckets::pending_refill(partition, policy, now);
    let after = buckets::after_refill(partition, refill.as_ref());
    // Every dimension's units, primary first (the count was checked by `reserve`).
    let n = policy.dimension_count();
    let mut all_units = [0; crate::dimension::MAX_DIMENSIONS];
    all_units[0] = units;
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
            reserved_units: units,
            held_units: held(units),
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
