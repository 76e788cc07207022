//! `admissionBudget.v1`: the policy a partition runs under, and its refill arithmetic.

use serde::{Deserialize, Serialize};

use crate::dimension::{DimensionLimit, FURTHER_FIELDS, MAX_FURTHER_DIMENSIONS, PRIMARY_FIELDS};
use crate::epoch::EpochLength;
use crate::rejection::InvalidInput;
use crate::rollout::{Mode, Rollout, PER_MILLION};
use crate::sizing::EstimatorConfig;
use crate::types::{TimestampMs, Units};

/// Largest capacity any single term may reach. Far above any real budget, far
/// below `u64::MAX`, so sums of a handful of terms never overflow a u64 in practice
/// and anything bigger is rejected as absurd input rather than wrapped.
pub const MAX_UNITS: Units = 1 << 53;

/// Highest policy generation: like [`MAX_UNITS`], exact in every JSON number
/// and far inside the signed 64-bit integers the log records.
pub const MAX_GENERATION: u64 = 1 << 53;

/// Longest time span (hold TTL, execution limit, refill interval) a policy may name: 30 days.
pub const MAX_SPAN_MS: u64 = 30 * 24 * 3_600_000;

/// What a unit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacityUnit {
    Tokens,
    Requests,
}

/// Whether the central ledger may carve emergency shards out of `available`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmergencyMode {
    Disabled,
    Enabled,
}

/// Continuous token-bucket refill: `units` per `interval_ms`, credited pro rata
/// with an exact integer remainder so no fraction of a unit is ever lost or invented.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefillRule {
    pub units: Units,
    pub interval_ms: u64,
}

/// Result of letting time pass: how much is credited, and the new remainder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefillCredit {
    pub credit_units: Units,
    /// Fractional credit carried forward, in units × ms (always `< interval_ms`).
    pub remainder: u64,
}

impl RefillRule {
    /// Credit earned between `from_ms` and `to_ms`, given the carried remainder.
    /// Computed in u128 so no product overflows.
    pub fn credit(&self, from_ms: TimestampMs, to_ms: TimestampMs, remainder: u64) -> RefillCredit {
        let elapsed = u128::from(to_ms.saturating_sub(from_ms));
        let total = elapsed * u128::from(self.units) + u128::from(remainder);
        let interval = u128::from(self.interval_ms.max(1));
        let credit = total / interval;
        RefillCredit {
            credit_units: u64::try_from(credit).unwrap_or(u64::MAX),
            remainder: (total % interval) as u64,
        }
    }

    /// Milliseconds until `needed` more units have been credited (rounded up),
    /// or `None` when the rule never refills.
    pub fn time_to_credit(&self, needed: Units, remainder: u64) -> Option<u64> {
        if self.units == 0 {
            return None;
        }
        let target = u128::from(needed) * u128::from(self.interval_ms);
        let missing = target.saturating_sub(u128::from(remainder));
        let ms = missing.div_ceil(u128::from(self.units));
        Some(u64::try_from(ms).unwrap_or(u64::MAX))
    }
}

/// `admissionBudget.v1`: everything that fixes how one subject/route is admitted.
/// A published policy is immutable; a change is a new `generation`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Subject key the policy limits (e.g. a tenant).
    pub subject: String,
    pub route: String,
    pub region: String,
    pub capacity_unit: CapacityUnit,
    pub refill: RefillRule,
    /// Bucket size: `available + reserved` never exceeds it.
    pub burst_units: Units,
    /// Balance a new partition opens with (at most `burst_units`).
    pub opening_units: Units,
    /// Digest of the estimator configuration reservations are sized with.
    pub estimator_digest: String,
    /// Largest single reservation; anything above is refused unconditionally.
    pub max_reservation_units: Units,
    /// Lease: an unstarted reservation is expired this long after it was made.
    pub hold_ttl_ms: u64,
    /// A started call not settled this long after its start becomes USAGE_UNKNOWN.
    pub hard_execution_limit_ms: u64,
    /// Overdraft beyond this is still recorded in full, and flagged as a breach.
    pub max_overdraft_units: Units,
    pub priority: u32,
    pub emergency_mode: EmergencyMode,
    /// Record what enforcement would have decided, but admit.
    pub shadow_mode: bool,
    pub generation: u64,
    /// How long a finished reservation's record stays in the writer's memory
    /// (ms, > 0). A retry after it is still answered, from the on-disk index;
    /// see [`crate::retention`]. Policies written before it existed read as
    /// the default (10 minutes).
    #[serde(default = "default_idempotency_window_ms")]
    pub idempotency_window_ms: u64,
    /// Further dimensions limited beside the primary one (`capacity_unit` and
    /// the fields above), each with its own bucket; see [`crate::dimension`].
    /// Empty for a one-dimension policy (and every policy written before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dimensions: Vec<DimensionLimit>,
    /// Whether cache-read input tokens are left out of the input dimensions at
    /// settle (providers differ; by default they count).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclude_cache_read_input_tokens: bool,
    /// How reserves without units are sized on this route, carried by the
    /// policy so every node and replay size alike from the log alone. `None`
    /// in policies written before it (which named settings by
    /// `estimator_digest` only, or sized with the defaults). Boxed: events
    /// carry policies, and most events are far smaller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimator: Option<Box<EstimatorConfig>>,
    /// How long an accounting epoch lasts; at its end the writer opens the
    /// next epoch's partition under this policy and moves capacity and debt
    /// across. `none` (the default, and every older policy): never rolls.
    #[serde(default, skip_serializing_if = "EpochLength::is_none")]
    pub epoch_length: EpochLength,
    /// Staged rollout: enforce on this route only if it falls in the
    /// rollout's fraction, else run in shadow ([`crate::rollout`]). `None`
    /// (and every older policy): enforce unless `shadow_mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

fn default_idempotency_window_ms() -> u64 {
    crate::retention::DEFAULT_IDEMPOTENCY_WINDOW_MS
}

impl Policy {
    /// Checks every field for sense; the first problem found is returned.
    /// The mode reserves on this policy's route are decided in
    /// ([`crate::rollout`]).
    pub fn mode(&self) -> Mode {
        match (&self.rollout, self.shadow_mode) {
            (_, true) => Mode::Shadow,
            (Some(rollout), false) if !rollout.enforces(&self.route) => Mode::Shadow,
            _ => Mode::Enforce,
        }
    }

    pub fn validate(&self) -> Result<(), InvalidInput> {
        let bad = |field: &'static str| Err(InvalidInput::Policy { field });
        if self.subject.is_empty() || self.route.is_empty() {
            return bad("subject/route");
        }
        if self.region.is_empty() || self.region.len() > crate::types::MAX_ID_BYTES {
            return bad("region");
        }
        if self.estimator_digest.len() > 256 {
            return bad("estimator_digest");
        }
        if self.generation > MAX_GENERATION {
            return bad("generation");
        }
        self.limit(0).validate(&PRIMARY_FIELDS)?;
        if self.hold_ttl_ms == 0 || self.hold_ttl_ms > MAX_SPAN_MS {
            return bad("hold_ttl_ms");
        }
        if self.hard_execution_limit_ms == 0 || self.hard_execution_limit_ms > MAX_SPAN_MS {
            return bad("hard_execution_limit_ms");
        }
        if self.idempotency_window_ms == 0 || self.idempotency_window_ms > MAX_SPAN_MS {
            return bad("idempotency_window_ms");
        }
        if let Some(estimator) = &self.estimator {
            estimator.validate()?;
        }
        if let Some(rollout) = &self.rollout {
            if rollout.enforced_per_million > PER_MILLION {
                return bad("rollout.enforced_per_million");
            }
            if rollout.salt.len() > crate::types::MAX_ID_BYTES {
                return bad("rollout.salt");
            }
        }
        if self.dimensions.len() > MAX_FURTHER_DIMENSIONS {
            return bad("dimensions");
        }
        for (i, limit) in self.dimensions.iter().enumerate() {
            limit.validate(&FURTHER_FIELDS)?;
            // Each dimension once: the primary and every further one differ.
            if self
                .limits()
                .take(i + 1)
                .any(|l| l.dimension == limit.dimension)
            {
                return bad("dimensions[].dimension");
            }
        }
        Ok(())
    }

    /// A small, valid policy for examples and tests: 10,000-unit bucket, opening
    /// full, refilling 10,000 units a minute, 180 s hold TTL, 600 s execution limit.
    pub fn example(subject: &str, route: &str, generation: u64) -> Policy {
        Policy {
            subject: subject.to_string(),
            route: route.to_string(),
            region: "eu-west-1".to_string(),
            capacity_unit: CapacityUnit::Tokens,
            refill: RefillRule {
                units: 10_000,
                interval_ms: 60_000,
            },
            burst_units: 10_000,
            opening_units: 10_000,
            estimator_digest: String::new(),
            max_reservation_units: 8_000,
            hold_ttl_ms: 180_000,
            hard_execution_limit_ms: 600_000,
            max_overdraft_units: 5_000,
            priority: 0,
            emergency_mode: EmergencyMode::Disabled,
            shadow_mode: false,
            generation,
            idempotency_window_ms: crate::retention::DEFAULT_IDEMPOTENCY_WINDOW_MS,
            dimensions: Vec::new(),
            exclude_cache_read_input_tokens: false,
            estimator: None,
            epoch_length: EpochLength::None,
            rollout: None,
        }
    }

    /// [`Policy::example`] limiting three dimensions as model providers do:
    /// 60 requests a minute (primary), 100,000 input tokens and 20,000 output
    /// tokens a minute, each bucket opening full.
    pub fn example_three_dimensions(subject: &str, route: &str, generation: u64) -> Policy {
        let per_minute = |units| RefillRule {
            units,
            interval_ms: 60_000,
        };
        let limit = |dimension, units: Units| DimensionLimit {
            dimension,
            refill: per_minute(units),
            burst_units: units,
            opening_units: units,
            max_reservation_units: units,
            max_overdraft_units: units / 2,
        };
        Policy {
            capacity_unit: CapacityUnit::Requests,
            refill: per_minute(60),
            burst_units: 60,
            opening_units: 60,
            max_reservation_units: 1,
            max_overdraft_units: 0,
            dimensions: vec![
                limit(crate::Dimension::InputTokens, 100_000),
                limit(crate::Dimension::OutputTokens, 20_000),
            ],
            ..Policy::example(subject, route, generation)
        }
    }

    /// The largest reservation this policy can ever admit.
    pub fn admissible_units(&self) -> Units {
        self.max_reservation_units.min(self.burst_units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refill_credit_is_exact_over_many_small_steps() {
        // 100 units per 60 s, credited in 1 ms steps for a minute: exactly 100.
        let rule = RefillRule {
            units: 100,
            interval_ms: 60_000,
        };
        let (mut credited, mut remainder) = (0, 0);
        for t in 0..60_000u64 {
            let c = rule.credit(t, t + 1, remainder);
            credited += c.credit_units;
            remainder = c.remainder;
        }
        assert_eq!((credited, remainder), (100, 0));
    }

    #[test]
    fn time_to_credit_rounds_up_and_uses_remainder() {
        let rule = RefillRule {
            units: 1_000,
            interval_ms: 60_000,
        };
        // 1 unit takes 60 ms.
        assert_eq!(rule.time_to_credit(1, 0), Some(60));
        assert_eq!(rule.time_to_credit(1, 30_000), Some(30));
        assert_eq!(rule.time_to_credit(7, 0), Some(420));
        let never = RefillRule {
            units: 0,
            interval_ms: 1,
        };
        assert_eq!(never.time_to_credit(1, 0), None);
    }
}
