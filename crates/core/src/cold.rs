//! What a cold route reserves, and whether a policy can ever admit it: the
//! publish-time rule that keeps a route from being "refused unconditionally"
//! (first seed) because its cold estimate plus a typical input exceeds the
//! largest reservation some dimension admits, which would keep it cold forever.

use crate::dimension::Dimension;
use crate::policy::Policy;
use crate::rejection::InvalidInput;
use crate::sizing::{size_reservation, EstimatorConfig, Sizing, PPM};
use crate::types::Units;

/// Counted input a publish assumes for a route when it states none: the
/// prompt of a short chat turn.
pub const DEFAULT_TYPICAL_INPUT_TOKENS: Units = 500;

/// A cold reservation some dimension can never admit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColdRouteNeverWarms {
    pub dimension: Dimension,
    /// What the cold reserve holds in that dimension.
    pub cold_units: Units,
    /// The most one reservation may hold there (`min(max_reservation, burst)`).
    pub admissible_units: Units,
    pub typical_input_tokens: Units,
}

impl std::fmt::Display for ColdRouteNeverWarms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a cold route's reserve for {} counted input tokens holds {} {} but at most {} are admissible, so no sized reserve is ever admitted and the route never warms; lower the estimator's ceiling_units (or set default_max_tokens) or raise max_reservation_units",
            self.typical_input_tokens, self.cold_units, self.dimension, self.admissible_units
        )
    }
}

/// Why a publish's sizing settings are refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColdCheck {
    Invalid(InvalidInput),
    NeverWarms(ColdRouteNeverWarms),
}

/// The reserve a cold route makes for `typical_input_tokens` (no `max_tokens`,
/// no drift, no warm sibling), checked against every dimension it lands in.
pub fn check_cold_reservation(
    policy: &Policy,
    estimator: &EstimatorConfig,
    typical_input_tokens: Units,
) -> Result<Sizing, ColdCheck> {
    let sizing = size_reservation(estimator, typical_input_tokens, PPM, None, None, None)
        .map_err(ColdCheck::Invalid)?;
    let (primary, further) = policy.sized_units(&sizing);
    let held = std::iter::once(primary).chain(further);
    for (limit, cold_units) in policy.limits().zip(held) {
        if cold_units > limit.admissible_units() {
            return Err(ColdCheck::NeverWarms(ColdRouteNeverWarms {
                dimension: limit.dimension,
                cold_units,
                admissible_units: limit.admissible_units(),
                typical_input_tokens,
            }));
        }
    }
    Ok(sizing)
}

/// Settings of a policy published without an estimator: p90 of the route's
/// output, floor 1, 100 samples to warm, and as the ceiling the most one
/// reservation may hold in the dimension that limits output (`output_tokens`,
/// else `tokens`, else the primary one) — less the typical input where that
/// dimension counts input too, so a cold reserve of a typical request fits.
pub fn default_estimator(policy: &Policy) -> EstimatorConfig {
    let limit = [Dimension::OutputTokens, Dimension::Tokens]
        .into_iter()
        .find_map(|d| policy.dimension_index(d))
        .map_or_else(|| policy.limit(0), |i| policy.limit(i));
    let admissible = limit.admissible_units();
    let ceiling_units = match limit.dimension {
        Dimension::Tokens if admissible > DEFAULT_TYPICAL_INPUT_TOKENS => {
            admissible - DEFAULT_TYPICAL_INPUT_TOKENS
        }
        _ => admissible,
    };
    EstimatorConfig {
        quantile_ppm: 900_000,
        floor_units: 1,
        ceiling_units: ceiling_units.max(1),
        min_samples: 100,
        default_max_tokens: None,
        sibling_route: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn estimator(ceiling_units: Units, default_max_tokens: Option<Units>) -> EstimatorConfig {
        EstimatorConfig {
            ceiling_units,
            default_max_tokens,
            ..default_estimator(&Policy::example("t", "r", 1))
        }
    }

    /// (policy, estimator, typical input, refused in (dimension, cold units, admissible))
    type Row<'a> = (
        &'a Policy,
        EstimatorConfig,
        Units,
        Option<(Dimension, Units, Units)>,
    );

    #[test]
    fn cold_reserves_table() {
        // max_reservation 8,000; and output 20,000, input 100,000.
        let tokens = Policy::example("t", "r", 1);
        let three = Policy::example_three_dimensions("t", "r", 1);
        // (policy, estimator, typical input) -> refused in (dimension, cold units, admissible)
        let rows: [Row; 7] = [
            // The issue's new user: 8,192 + 500 > 8,000.
            (
                &tokens,
                estimator(8_192, None),
                500,
                Some((Dimension::Tokens, 8_692, 8_000)),
            ),
            (&tokens, estimator(7_500, None), 500, None),
            (
                &tokens,
                estimator(7_500, None),
                501,
                Some((Dimension::Tokens, 8_001, 8_000)),
            ),
            // A route default max_tokens is what a cold route reserves instead.
            (&tokens, estimator(8_192, Some(1_024)), 500, None),
            (
                &tokens,
                default_estimator(&tokens),
                DEFAULT_TYPICAL_INPUT_TOKENS,
                None,
            ),
            // Output lands in output_tokens only; input in input_tokens.
            (
                &three,
                estimator(20_001, None),
                500,
                Some((Dimension::OutputTokens, 20_001, 20_000)),
            ),
            (
                &three,
                default_estimator(&three),
                100_001,
                Some((Dimension::InputTokens, 100_001, 100_000)),
            ),
        ];
        for (i, (policy, estimator, typical, expected)) in rows.into_iter().enumerate() {
            let got = match check_cold_reservation(policy, &estimator, typical) {
                Ok(_) => None,
                Err(ColdCheck::NeverWarms(e)) => {
                    Some((e.dimension, e.cold_units, e.admissible_units))
                }
                Err(ColdCheck::Invalid(e)) => panic!("row {i}: invalid {e}"),
            };
            assert_eq!(got, expected, "row {i}");
        }
    }

    #[test]
    fn the_default_ceiling_leaves_room_for_typical_input_only_where_input_counts() {
        assert_eq!(
            default_estimator(&Policy::example("t", "r", 1)).ceiling_units,
            7_500
        );
        let three = Policy::example_three_dimensions("t", "r", 1);
        assert_eq!(default_estimator(&three).ceiling_units, 20_000);
    }
}
