//! The bucket arithmetic of a decision, in every dimension of the policy at
//! once: the refill earned since the last one, admission of a reserve (held in
//! all dimensions or refused naming the limiting one), and the split of a
//! settlement into refund, extra from `available` and overdraft.
//!
//! `decide` calls these; they read state and return amounts, never events'
//! numbers they have not checked. Dimension `i` is the primary for `i = 0`
//! (see [`crate::dimension`]).

use crate::dimension::{DimensionAmounts, MAX_DIMENSIONS};
use crate::event::EventBody;
use crate::partition::Partition;
use crate::policy::Policy;
use crate::rejection::Rejection;
use crate::types::{TimestampMs, Units};

/// The refill earned since the last one, in every dimension, or `None` if no
/// dimension has earned a whole unit yet. Debt is repaid first; credit above
/// the burst is dropped.
pub(crate) fn pending_refill(
    partition: &Partition,
    policy: &Policy,
    now: TimestampMs,
) -> Option<(EventBody, Vec<DimensionAmounts>)> {
    let mut any = false;
    let mut all = (0..policy.dimension_count()).map(|i| {
        let limit = policy.limit(i);
        let ledger = partition.ledger_of(i);
        let credit = limit.refill.credit(
            partition.refill_anchor_ms,
            now,
            partition.refill_remainder_of(i),
        );
        any |= credit.credit_units > 0;
        let debt = ledger.debt_units().unwrap_or(0);
        let repaid_units = credit.credit_units.min(debt);
        // `repaid_units <= credit_units` (a min): cannot under-run.
        let left = credit.credit_units.saturating_sub(repaid_units);
        let room = limit
            .burst_units
            .saturating_sub(ledger.available_units.saturating_add(ledger.reserved_units));
        let to_available = left.min(room);
        // A full bucket drops the fractional remainder too: refill restarts from now.
        let remainder = if to_available < left {
            0
        } else {
            credit.remainder
        };
        DimensionAmounts::Refilled {
            // Both parts are at most `credit_units`, so their sum is too.
            minted_units: repaid_units.saturating_add(to_available),
            repaid_units,
            remainder,
        }
    });
    let Some(DimensionAmounts::Refilled {
        minted_units,
        repaid_units,
        remainder,
    }) = all.next()
    else {
        unreachable!("a policy has a primary dimension");
    };
    let further: Vec<_> = all.collect();
    any.then_some((
        EventBody::Refilled {
            minted_units,
            repaid_units,
            remainder,
        },
        further,
    ))
}

/// One dimension as a reserve sees it: after the pending refill.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Bucket {
    pub available: Units,
    pub debt: Units,
    pub reserved: Units,
    /// The refill remainder from which further credit accrues.
    pub remainder: u64,
}

/// Every dimension's bucket after `refill` (the [`pending_refill`], if any),
/// primary first; the first `policy.dimension_count()` entries are used. A
/// fixed array: the reserve path allocates nothing for it.
pub(crate) fn after_refill(
    partition: &Partition,
    refill: Option<&(EventBody, Vec<DimensionAmounts>)>,
) -> [Bucket; MAX_DIMENSIONS] {
    let mut buckets = [Bucket::default(); MAX_DIMENSIONS];
    for ((i, ledger), slot) in partition.ledgers().enumerate().zip(&mut buckets) {
        *slot = {
            let mut bucket = Bucket {
                available: ledger.available_units,
                debt: ledger.debt_units().unwrap_or(0),
                reserved: ledger.reserved_units,
                remainder: partition.refill_remainder_of(i),
            };
            let amounts = refill.map(|(body, further)| match i {
                0 => crate::partition::primary_amounts(body).expect("a refill moves amounts"),
                i => further[i - 1],
            });
            if let Some(DimensionAmounts::Refilled {
                minted_units,
                repaid_units,
                remainder,
            }) = amounts
            {
                // A refill never lifts available above the burst, and never
                // repays more than the debt: both are checked again in `apply`.
                bucket.available = bucket
                    .available
                    .saturating_add(minted_units.saturating_sub(repaid_units));
                bucket.debt = bucket.debt.saturating_sub(repaid_units);
                bucket.remainder = remainder;
            }
            bucket
        };
    }
    buckets
}

/// The enforcement decision for a reserve of `units[i]` in each dimension, in
/// contract order: too large in any dimension is refused unconditionally, then
/// debt in any dimension freezes admission, then capacity.
///
/// The Retry-After is the latest over the refusing dimensions of the time at
/// which that dimension, with no other traffic, admits the reserve: refill
/// repays its debt first and then covers the shortfall. Where the shortfall is
/// more than refill can add below the burst (open reservations hold the
/// rest), it is the earliest moment enough of those reservations' leases
/// expire ([`Lease`], `leases(i)`) that refill covers what is still missing;
/// when even every unstarted lease expiring is not enough (started calls hold
/// the rest, and only their settle frees it), the policy's hold TTL. The
/// rejection names the dimension with that latest time (among the owing ones,
/// for a debt refusal).
pub(crate) fn admission(
    policy: &Policy,
    units: &[Units],
    buckets: &[Bucket],
    leases: &dyn Fn(usize) -> Vec<Lease>,
) -> Result<(), Rejection> {
    for (i, &requested_units) in units.iter().enumerate() {
        let limit = policy.limit(i);
        let max_units = limit.admissible_units();
        if requested_units > max_units {
            return Err(Rejection::RequestTooLarge {
                dimension: limit.dimension,
                requested_units,
                max_units,
            });
        }
    }
    // Per refusing dimension: (index, wait; `None` = never).
    let waits: Vec<(usize, Option<u64>)> = (0..units.len())
        .filter(|&i| buckets[i].debt > 0 || units[i] > buckets[i].available)
        .map(|i| (i, wait_ms(policy, i, units[i], &buckets[i], &leases(i))))
        .collect();
    // `None` (never) sorts after every time.
    let order = |ms: Option<u64>| ms.map_or(u128::MAX, u128::from);
    let Some(retry_after_ms) = waits.iter().map(|w| w.1).max_by_key(|&ms| order(ms)) else {
        return Ok(());
    };
    let latest = |owing: bool| {
        waits
            .iter()
            .filter(|&&(i, _)| !owing || buckets[i].debt > 0)
            .max_by_key(|w| order(w.1))
            .map(|w| w.0)
    };
    if let Some(i) = latest(true) {
        return Err(Rejection::DebtOutstanding {
            dimension: policy.limit(i).dimension,
            debt_units: buckets[i].debt,
            retry_after_ms,
        });
    }
    let i = latest(false).expect("a refusing dimension");
    Err(Rejection::InsufficientCapacity {
        dimension: policy.limit(i).dimension,
        requested_units: units[i],
        available_units: buckets[i].available,
        retry_after_ms,
    })
}

/// An unstarted reservation's hold in one dimension: what its lease expiry
/// gives back, and in how many ms from now (0 when already past).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub expires_in_ms: u64,
    pub held_units: Units,
}

/// When dimension `i` admits `units` with no other traffic (see [`admission`]).
fn wait_ms(
    policy: &Policy,
    i: usize,
    units: Units,
    bucket: &Bucket,
    leases: &[Lease],
) -> Option<u64> {
    let limit = policy.limit(i);
    let shortfall = units.saturating_sub(bucket.available);
    let room = limit
        .burst_units
        .saturating_sub(bucket.available.saturating_add(bucket.reserved));
    let refill = |needed: Units| limit.refill.time_to_credit(needed, bucket.remainder);
    if shortfall <= room {
        return refill(bucket.debt.saturating_add(shortfall));
    }
    // An expiry gives its held units back to `available` (the room below the
    // burst does not change), so after the first k expiries refill must cover
    // `shortfall - freed`, which must fit in `room`. The answer is the best k.
    let mut leases = leases.to_vec();
    leases.sort_by_key(|l| l.expires_in_ms);
    let mut freed: Units = 0;
    let mut best: Option<u64> = None;
    for lease in leases {
        freed = freed.saturating_add(lease.held_units);
        let missing = shortfall.saturating_sub(freed);
        if missing > room {
            continue;
        }
        let Some(refilled) = refill(bucket.debt.saturating_add(missing)) else {
            continue;
        };
        let at = refilled.max(lease.expires_in_ms);
        best = Some(best.map_or(at, |b| b.min(at)));
    }
    match best {
        Some(at) => Some(at),
        None => {
            let filled = refill(bucket.debt.saturating_add(room))?;
            Some(filled.max(policy.hold_ttl_ms))
        }
    }
}

/// A settlement in one dimension: `(refunded, from_available, overdraft)` for
/// `actual` used against `held`, with `available` to draw from.
pub(crate) fn settle_split(held: Units, actual: Units, available: Units) -> (Units, Units, Units) {
    if actual <= held {
        (held - actual, 0, 0)
    } else {
        let excess = actual - held;
        let from_available = excess.min(available);
        (0, from_available, excess - from_available)
    }
}

/// Whether an overdraft of `overdraft` on top of `debt` passes `max_overdraft`.
pub(crate) fn breaches(overdraft: Units, debt: Units, max_overdraft: Units) -> bool {
    overdraft > 0 && u128::from(debt) + u128::from(overdraft) > u128::from(max_overdraft)
}
