//! The read models: what each column family's values hold.
//!
//! Values are JSON of these types (field order fixed by the struct, maps are
//! `BTreeMap`s), so a value's bytes are a pure function of its contents.

use std::collections::BTreeMap;

use reservoir_core::{
    Dimension, DimensionLimit, Ledger, Partition, PartitionKey, RefusalReason, Reservation,
    ShadowVerdict, Units,
};
use serde::{Deserialize, Serialize};

/// Where the projector stands in one log partition, and the fence state it needs
/// to resume there: the claim that was current after the last entry consumed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub next_offset: u64,
    pub claim: Option<ClaimState>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimState {
    pub writer_id: String,
    pub epoch: u64,
}

/// The projector's own state of one ledger partition: the core `Partition`
/// (folded with `try_apply`, the writer's code) plus what the read side derives.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionProjection {
    pub partition: Partition,
    pub opened_at_ms: u64,
    /// First event that could not be applied; the partition is frozen at the
    /// state before it and its later events are only counted.
    pub quarantine: Option<Finding>,
    pub skipped_events: u64,
}

/// An event `try_apply` refused: a corrupt or tampered log, kept as evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub key: PartitionKey,
    pub log_partition: u32,
    pub offset: u64,
    pub event_index: u32,
    pub sequence: u64,
    pub error: String,
}

/// Balances of one ledger partition: every conservation term and what follows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionBalance {
    pub key: PartitionKey,
    pub ledger: Ledger,
    pub debt_units: Units,
    /// Admission is 0 while debt is outstanding.
    pub frozen: bool,
    pub closed: bool,
    pub quarantined: bool,
    pub open_reservations: u64,
    pub refusals: u64,
    pub last_sequence: u64,
    pub opened_at_ms: u64,
    pub last_at_ms: u64,
    /// Capacity the policy offered from opening to the last event:
    /// `opening + refill rate × elapsed` (the denominator of utilization).
    pub offered_units: Units,
    pub skipped_events: u64,
    /// The policy's further dimensions (the fields above are the primary
    /// one's; `frozen` is any dimension owing). Absent for one dimension.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dimensions: Vec<DimensionBalance>,
}

/// One further dimension's balance in a partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DimensionBalance {
    pub dimension: Dimension,
    pub ledger: Ledger,
    pub debt_units: Units,
    pub offered_units: Units,
}

/// `opening + refill rate × elapsed` of one dimension.
fn offered(limit: &DimensionLimit, elapsed_ms: u64) -> Units {
    let refilled = u128::from(limit.refill.units) * u128::from(elapsed_ms)
        / u128::from(limit.refill.interval_ms.max(1));
    u64::try_from(u128::from(limit.opening_units) + refilled).unwrap_or(u64::MAX)
}

impl PartitionBalance {
    pub fn of(p: &PartitionProjection) -> Option<Self> {
        let partition = &p.partition;
        let key = partition.key.clone()?;
        let elapsed = partition.last_at_ms.saturating_sub(p.opened_at_ms);
        let offered_units = partition
            .policy
            .as_ref()
            .map_or(0, |policy| offered(&policy.limit(0), elapsed));
        let dimensions: Vec<DimensionBalance> = partition
            .policy
            .iter()
            .flat_map(|policy| policy.dimensions.iter())
            .zip(&partition.further)
            .map(|(limit, state)| DimensionBalance {
                dimension: limit.dimension,
                ledger: state.ledger,
                debt_units: state.ledger.debt_units().unwrap_or(0),
                offered_units: offered(limit, elapsed),
            })
            .collect();
        let debt_units = partition.debt_units();
        Some(Self {
            key,
            ledger: partition.ledger,
            debt_units,
            frozen: debt_units > 0 || dimensions.iter().any(|d| d.debt_units > 0),
            closed: partition.closed,
            quarantined: p.quarantine.is_some(),
            open_reservations: partition.open_reservations as u64,
            refusals: partition.refusals,
            last_sequence: partition.last_sequence,
            opened_at_ms: p.opened_at_ms,
            last_at_ms: partition.last_at_ms,
            offered_units,
            skipped_events: p.skipped_events,
            dimensions,
        })
    }
}

/// One further dimension summed over the partitions of a roll-up (only
/// partitions whose policy limits that dimension add to it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DimensionRollup {
    pub partitions: u64,
    pub debt_units: u64,
    pub offered_units: u64,
    pub ledger: Ledger,
}

/// Balances summed over the partitions of one tenant (subject) or one route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollup {
    pub partitions: u64,
    pub frozen_partitions: u64,
    pub closed_partitions: u64,
    pub quarantined_partitions: u64,
    pub open_reservations: u64,
    pub refusals: u64,
    pub debt_units: u64,
    pub offered_units: u64,
    /// The partitions' primary dimensions (as before dimensions existed).
    pub ledger: Ledger,
    /// Further dimensions, by dimension: units of one kind are only ever
    /// summed with units of the same kind.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dimensions: BTreeMap<Dimension, DimensionRollup>,
}

impl Rollup {
    /// Adds (`add = true`) or removes one partition's balance. Removing what was
    /// added before can never underflow; overflow saturates (terms are bounded by
    /// `MAX_UNITS` each, so it takes millions of partitions to get there).
    pub fn fold(&mut self, b: &PartitionBalance, add: bool) {
        let op = |total: &mut u64, v: u64| {
            *total = if add {
                total.saturating_add(v)
            } else {
                total
                    .checked_sub(v)
                    .expect("rollup: removing a balance that was never added")
            }
        };
        op(&mut self.partitions, 1);
        op(&mut self.frozen_partitions, u64::from(b.frozen));
        op(&mut self.closed_partitions, u64::from(b.closed));
        op(&mut self.quarantined_partitions, u64::from(b.quarantined));
        op(&mut self.open_reservations, b.open_reservations);
        op(&mut self.refusals, b.refusals);
        op(&mut self.debt_units, b.debt_units);
        op(&mut self.offered_units, b.offered_units);
        for (term, total) in self.ledger.terms_mut() {
            op(total, b.ledger.get(term));
        }
        for d in &b.dimensions {
            let r = self.dimensions.entry(d.dimension).or_default();
            op(&mut r.partitions, 1);
            op(&mut r.debt_units, d.debt_units);
            op(&mut r.offered_units, d.offered_units);
            for (term, total) in r.ledger.terms_mut() {
                op(total, d.ledger.get(term));
            }
            if r.partitions == 0 {
                // The last partition limiting it left: no empty entry stays.
                self.dimensions.remove(&d.dimension);
            }
        }
    }

    /// Spent ÷ offered, per mille (0 when nothing was offered).
    pub fn utilization_permille(&self) -> u64 {
        if self.offered_units == 0 {
            return 0;
        }
        (u128::from(self.ledger.spent_units) * 1000 / u128::from(self.offered_units)) as u64
    }
}

/// A reservation record with the partition that owns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationRecord {
    pub key: PartitionKey,
    pub reservation: Reservation,
}

/// Width of one efficiency bucket, per mille of the reservation.
pub const EFFICIENCY_BUCKET_PERMILLE: u64 = 50;
/// Buckets: `[0, 50)`, `[50, 100)`, … up to a last bucket for `>= 1500‰` (usage
/// well above the reservation).
pub const EFFICIENCY_BUCKETS: usize = 31;

/// Reservation efficiency (settled ÷ reserved) histogram, fixed integer buckets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EfficiencyHistogram {
    pub buckets: Vec<u64>,
    pub samples: u64,
    pub settled_units: u64,
    pub reserved_units: u64,
}

impl Default for EfficiencyHistogram {
    fn default() -> Self {
        Self {
            buckets: vec![0; EFFICIENCY_BUCKETS],
            samples: 0,
            settled_units: 0,
            reserved_units: 0,
        }
    }
}

impl EfficiencyHistogram {
    pub fn observe(&mut self, settled_units: Units, reserved_units: Units) {
        if reserved_units == 0 {
            return;
        }
        let permille = u128::from(settled_units) * 1000 / u128::from(reserved_units);
        let bucket = (permille / u128::from(EFFICIENCY_BUCKET_PERMILLE))
            .min(EFFICIENCY_BUCKETS as u128 - 1) as usize;
        self.buckets[bucket] += 1;
        self.samples += 1;
        self.settled_units = self.settled_units.saturating_add(settled_units);
        self.reserved_units = self.reserved_units.saturating_add(reserved_units);
    }

    /// Midpoint (per mille) of the bucket holding quantile `q_permille`.
    pub fn quantile_permille(&self, q_permille: u64) -> Option<u64> {
        if self.samples == 0 {
            return None;
        }
        let target = (u128::from(self.samples) * u128::from(q_permille))
            .div_ceil(1000)
            .max(1);
        let mut seen = 0u128;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += u128::from(n);
            if seen >= target {
                return Some(
                    i as u64 * EFFICIENCY_BUCKET_PERMILLE + EFFICIENCY_BUCKET_PERMILLE / 2,
                );
            }
        }
        None
    }

    /// Total settled ÷ total reserved, per mille.
    pub fn overall_permille(&self) -> Option<u64> {
        (self.reserved_units > 0).then(|| {
            (u128::from(self.settled_units) * 1000 / u128::from(self.reserved_units)) as u64
        })
    }
}

/// Counted vs provider-reported input per route, summed over the settles whose
/// usage reports both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputDrift {
    pub samples: u64,
    pub counted_input_units: u64,
    pub reported_input_units: u64,
}

impl InputDrift {
    pub fn observe(&mut self, counted: Units, reported: Units) {
        self.samples += 1;
        self.counted_input_units = self.counted_input_units.saturating_add(counted);
        self.reported_input_units = self.reported_input_units.saturating_add(reported);
    }

    /// Reported ÷ counted in parts per million, the multiplier sizing uses
    /// (never below 1: undercounting is what must be corrected).
    pub fn multiplier_ppm(&self) -> Option<u64> {
        (self.counted_input_units > 0).then(|| {
            let ppm = u128::from(self.reported_input_units) * 1_000_000
                / u128::from(self.counted_input_units);
            (ppm as u64).max(1_000_000)
        })
    }
}

/// One refused admission, with what the bucket held at that moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub key: PartitionKey,
    pub at_ms: u64,
    pub sequence: u64,
    pub reservation_id: String,
    pub requested_units: Units,
    pub reason: RefusalReason,
    pub retry_after_ms: Option<u64>,
    /// Of the limiting dimension (the primary one when the record names none).
    pub available_units: Units,
    pub burst_units: Units,
    /// The limiting dimension (absent in refusals logged before dimensions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimension: Option<Dimension>,
}

/// One reserve decided in shadow mode: what enforcement would have said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowRecord {
    pub subject: String,
    pub route: String,
    pub at_ms: u64,
    pub reservation_id: String,
    pub verdict: ShadowVerdict,
    /// The dimension it would have refused in (absent for would-admit, and
    /// in records logged before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimension: Option<Dimension>,
}

/// One half of a capacity move, kept until its counterpart is projected
/// (the halves may sit in different log partitions, read in any order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveSide {
    pub key: PartitionKey,
    pub counterpart: PartitionKey,
    pub units: Units,
    pub debt_units: Units,
    /// What it carried in each dimension (`moved_by_dimension`); empty in
    /// a half stored before it was kept, which pairs by `units` and
    /// `debt_units` alone.
    #[serde(default)]
    pub amounts: Vec<(reservoir_core::Dimension, Units, Units)>,
}
