//! Dimensions: the several limits a provider enforces at once (requests,
//! input tokens, output tokens, or tokens = input + output), held together in
//! one reservation, in one partition, atomically.
//!
//! A policy's *primary* dimension is the one its top-level fields describe
//! (`capacity_unit`, `refill`, `burst_units`, …): every policy written before
//! dimensions existed is exactly that, one dimension. A policy may name
//! *further* dimensions in [`crate::Policy::dimensions`], each a
//! [`DimensionLimit`] with its own refill, burst, opening, largest reservation
//! and overdraft. Dimension `i` is the primary for `i = 0`, else
//! `dimensions[i - 1]`.
//!
//! Each further dimension keeps its own [`Ledger`](crate::Ledger) (in
//! [`crate::Partition::further`]) with the very same conservation equation,
//! checked after every event. An event's amounts in the primary dimension are
//! its body's fields, as always; its amounts in the further dimensions are
//! [`Event::further`](crate::Event::further), one [`DimensionAmounts`] per
//! further dimension, in policy order, of the kind the body's type names.

use serde::{Deserialize, Serialize};

use crate::policy::{CapacityUnit, Policy, RefillRule, MAX_UNITS};
use crate::rejection::InvalidInput;
use crate::sizing::Sizing;
use crate::types::Units;
use crate::usage::Usage;
use crate::Ledger;

/// What one dimension counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// One unit per call.
    Requests,
    /// Input tokens: counted × drift at reserve, as reported at settle.
    InputTokens,
    /// Output tokens: the sizing rules at reserve, as reported at settle.
    OutputTokens,
    /// Input + output tokens.
    Tokens,
}

impl Dimension {
    pub const ALL: [Dimension; 4] = [
        Dimension::Requests,
        Dimension::InputTokens,
        Dimension::OutputTokens,
        Dimension::Tokens,
    ];

    /// The name on the wire, in problem bodies and in rate-limit headers.
    pub const fn name(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::InputTokens => "input_tokens",
            Dimension::OutputTokens => "output_tokens",
            Dimension::Tokens => "tokens",
        }
    }

    /// The dimension named `name` (see [`Dimension::name`]).
    pub fn from_name(name: &str) -> Option<Dimension> {
        Dimension::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Units a sized reserve holds in this dimension: requests 1, input the
    /// counted input × drift, output the output estimate, tokens their sum.
    pub fn sized_units(self, sizing: &Sizing) -> Units {
        match self {
            Dimension::Requests => 1,
            Dimension::InputTokens => sizing.input_units,
            Dimension::OutputTokens => sizing.output_units,
            Dimension::Tokens => sizing.units,
        }
    }

    /// Units a settle spends in this dimension, from the usage the gateway
    /// reported: requests 1; input the provider's reported input (the
    /// gateway's count if the provider reported none), plus cache-read input
    /// unless the policy excludes it; output as reported; tokens their sum.
    /// `None` when the usage lacks what this dimension needs.
    pub fn used_units(self, usage: &Usage, count_cache_reads: bool) -> Option<Units> {
        let cache_reads = if count_cache_reads {
            usage.cache_read_input_tokens.unwrap_or(0)
        } else {
            0
        };
        let input = || {
            usage
                .reported_input_tokens
                .or(usage.counted_input_tokens)
                .map(|i| i.saturating_add(cache_reads))
        };
        match self {
            Dimension::Requests => Some(1),
            Dimension::InputTokens => input(),
            Dimension::OutputTokens => usage.output_tokens,
            Dimension::Tokens => Some(input()?.saturating_add(usage.output_tokens?)),
        }
    }
}

impl From<CapacityUnit> for Dimension {
    fn from(unit: CapacityUnit) -> Dimension {
        match unit {
            CapacityUnit::Tokens => Dimension::Tokens,
            CapacityUnit::Requests => Dimension::Requests,
        }
    }
}

impl std::fmt::Display for Dimension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The limits of one dimension. For the primary dimension these are the
/// policy's top-level fields ([`Policy::limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DimensionLimit {
    pub dimension: Dimension,
    pub refill: RefillRule,
    /// Bucket size: `available + reserved` never exceeds it.
    pub burst_units: Units,
    /// Balance a new partition opens with (at most `burst_units`).
    pub opening_units: Units,
    /// Largest single reservation in this dimension.
    pub max_reservation_units: Units,
    /// Overdraft beyond this is recorded in full and flagged as a breach.
    pub max_overdraft_units: Units,
}

impl DimensionLimit {
    /// The largest reservation this dimension can ever admit.
    pub fn admissible_units(&self) -> Units {
        self.max_reservation_units.min(self.burst_units)
    }

    /// Checks the fields for sense; the error names the first bad one by
    /// `names` (the primary dimension's field names are the policy's own,
    /// [`PRIMARY_FIELDS`]; a further dimension's, [`FURTHER_FIELDS`]).
    pub(crate) fn validate(&self, names: &LimitFieldNames) -> Result<(), InvalidInput> {
        let bad = |field: &'static str| Err(InvalidInput::Policy { field });
        if self.burst_units == 0 || self.burst_units > MAX_UNITS {
            return bad(names.burst_units);
        }
        if self.opening_units > self.burst_units {
            return bad(names.opening_units);
        }
        if self.max_reservation_units == 0 || self.max_reservation_units > MAX_UNITS {
            return bad(names.max_reservation_units);
        }
        if self.max_overdraft_units > MAX_UNITS {
            return bad(names.max_overdraft_units);
        }
        if self.refill.units > MAX_UNITS {
            return bad(names.refill_units);
        }
        if self.refill.interval_ms == 0 || self.refill.interval_ms > crate::policy::MAX_SPAN_MS {
            return bad(names.refill_interval_ms);
        }
        Ok(())
    }
}

/// How a validation error names a dimension's fields.
pub(crate) struct LimitFieldNames {
    burst_units: &'static str,
    opening_units: &'static str,
    max_reservation_units: &'static str,
    max_overdraft_units: &'static str,
    refill_units: &'static str,
    refill_interval_ms: &'static str,
}

/// The primary dimension's fields: the policy's top-level ones.
pub(crate) const PRIMARY_FIELDS: LimitFieldNames = LimitFieldNames {
    burst_units: "burst_units",
    opening_units: "opening_units",
    max_reservation_units: "max_reservation_units",
    max_overdraft_units: "max_overdraft_units",
    refill_units: "refill.units",
    refill_interval_ms: "refill.interval_ms",
};

/// A further dimension's fields, inside `dimensions`.
pub(crate) const FURTHER_FIELDS: LimitFieldNames = LimitFieldNames {
    burst_units: "dimensions[].burst_units",
    opening_units: "dimensions[].opening_units",
    max_reservation_units: "dimensions[].max_reservation_units",
    max_overdraft_units: "dimensions[].max_overdraft_units",
    refill_units: "dimensions[].refill.units",
    refill_interval_ms: "dimensions[].refill.interval_ms",
};

/// Most dimensions a policy may limit: every [`Dimension`] at most once.
pub const MAX_DIMENSIONS: usize = Dimension::ALL.len();

/// Most further dimensions a policy may name (besides its primary one).
pub const MAX_FURTHER_DIMENSIONS: usize = MAX_DIMENSIONS - 1;

/// What one half of a capacity move carried, by dimension: the event's own
/// amounts under the policy's primary dimension, each further `Moved`
/// under its dimension, zero amounts left out, sorted. Two halves pair when
/// these are equal: the writer matches dimensions by name, so a move
/// between policies that order their dimensions differently (a new primary)
/// carries the same amounts under other indexes.
pub fn moved_by_dimension(
    policy: &Policy,
    units: Units,
    debt_units: Units,
    further: &[DimensionAmounts],
) -> Vec<(Dimension, Units, Units)> {
    let mut amounts: Vec<(Dimension, Units, Units)> = std::iter::once((units, debt_units))
        .chain(further.iter().map(|a| match *a {
            DimensionAmounts::Moved { units, debt_units } => (units, debt_units),
            _ => (0, 0),
        }))
        .enumerate()
        .filter(|&(i, (units, debt))| i < policy.dimension_count() && (units, debt) != (0, 0))
        .map(|(i, (units, debt))| (policy.limit(i).dimension, units, debt))
        .collect();
    amounts.sort();
    amounts
}

impl Policy {
    /// How many dimensions the policy limits (1 + further).
    pub fn dimension_count(&self) -> usize {
        1 + self.dimensions.len()
    }

    /// The limits of dimension `i` (0 = primary). Panics past the last.
    pub fn limit(&self, i: usize) -> DimensionLimit {
        match i {
            0 => DimensionLimit {
                dimension: self.capacity_unit.into(),
                refill: self.refill,
                burst_units: self.burst_units,
                opening_units: self.opening_units,
                max_reservation_units: self.max_reservation_units,
                max_overdraft_units: self.max_overdraft_units,
            },
            i => self.dimensions[i - 1],
        }
    }

    /// Every dimension's limits, primary first.
    pub fn limits(&self) -> impl Iterator<Item = DimensionLimit> + '_ {
        (0..self.dimension_count()).map(|i| self.limit(i))
    }

    /// The index of `dimension` in this policy, if it limits it.
    pub fn dimension_index(&self, dimension: Dimension) -> Option<usize> {
        self.limits().position(|l| l.dimension == dimension)
    }

    /// Units a sized reserve holds in every dimension, primary first.
    pub fn sized_units(&self, sizing: &Sizing) -> (Units, Vec<Units>) {
        let mut all = self.limits().map(|l| l.dimension.sized_units(sizing));
        let primary = all.next().expect("a policy has a primary dimension");
        (primary, all.collect())
    }

    /// Units a settle spends in every dimension, primary first: `actual_units`
    /// when given (the only way for a one-dimension policy without usage),
    /// else derived from `usage`. A multi-dimension settle must carry usage
    /// that covers every token dimension.
    pub fn used_units(
        &self,
        actual_units: Option<Units>,
        usage: Option<&Usage>,
    ) -> Result<(Units, Vec<Units>), InvalidInput> {
        let count_cache_reads = !self.exclude_cache_read_input_tokens;
        let derived = |l: DimensionLimit| {
            usage
                .and_then(|u| l.dimension.used_units(u, count_cache_reads))
                .ok_or(InvalidInput::UsageMissing {
                    dimension: l.dimension,
                })
        };
        let primary = match actual_units {
            Some(units) => units,
            None => derived(self.limit(0))?,
        };
        let further = self.dimensions.iter().map(|l| derived(*l));
        Ok((primary, further.collect::<Result<_, _>>()?))
    }
}

/// What one event moves in one further dimension. Which variant an event
/// carries is fixed by its body's type; `apply` refuses any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DimensionAmounts {
    /// `PartitionOpened`: the balance the dimension opens with.
    Opened { opening_units: Units },
    /// `Refilled`: as the body's fields, for this dimension.
    Refilled {
        minted_units: Units,
        repaid_units: Units,
        remainder: u64,
    },
    /// `Reserved`.
    Reserved {
        reserved_units: Units,
        held_units: Units,
    },
    /// `Settled`: `actual = held − refunded + from_available + overdraft`.
    Settled {
        actual_units: Units,
        refunded_units: Units,
        from_available_units: Units,
        overdraft_units: Units,
        overdraft_limit_breached: bool,
    },
    /// `Released`, `Expired`: the held units go back to `available`.
    Refunded { refunded_units: Units },
    /// `MovedOut`, `MovedIn`.
    Moved { units: Units, debt_units: Units },
}

/// One reservation's amounts in one further dimension (the primary's are the
/// record's own fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DimensionHold {
    pub reserved_units: Units,
    pub held_units: Units,
    pub actual_units: Option<Units>,
    pub overdraft_units: Units,
}

/// The state of one further dimension in a partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DimensionState {
    pub ledger: Ledger,
    /// Fractional refill carried forward (see [`crate::Partition::refill_remainder`]).
    pub refill_remainder: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sizing::SizingRule;

    #[test]
    fn names_round_trip_and_are_the_serde_names() {
        for d in Dimension::ALL {
            assert_eq!(Dimension::from_name(d.name()), Some(d));
            assert_eq!(serde_json::to_value(d).unwrap(), d.name());
        }
        assert_eq!(Dimension::from_name("cached_tokens"), None);
    }

    #[test]
    fn sized_and_used_units_per_dimension() {
        let sizing = Sizing {
            units: 700,
            input_units: 200,
            output_units: 500,
            rule: SizingRule::MaxTokens,
        };
        let usage = Usage {
            output_tokens: Some(300),
            counted_input_tokens: Some(190),
            reported_input_tokens: Some(180),
            cache_read_input_tokens: Some(20),
            ..Usage::default()
        };
        let table = [
            (Dimension::Requests, 1, Some(1), Some(1)),
            (Dimension::InputTokens, 200, Some(200), Some(180)),
            (Dimension::OutputTokens, 500, Some(300), Some(300)),
            (Dimension::Tokens, 700, Some(500), Some(480)),
        ];
        for (d, sized, used_with_cache, used_without) in table {
            assert_eq!(d.sized_units(&sizing), sized, "{d}");
            assert_eq!(d.used_units(&usage, true), used_with_cache, "{d}");
            assert_eq!(d.used_units(&usage, false), used_without, "{d}");
        }
        let empty = Usage::default();
        assert_eq!(Dimension::Requests.used_units(&empty, true), Some(1));
        assert_eq!(Dimension::InputTokens.used_units(&empty, true), None);
        assert_eq!(Dimension::Tokens.used_units(&empty, true), None);
    }
}
