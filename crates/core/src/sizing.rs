//! Reservation sizing, from the first seed: a reservation must be *useful*, not
//! only safe. `reserve = counted input × drift multiplier + output estimate`, where
//! the output estimate is, in order:
//! 1. the request's `max_tokens` (nothing to estimate),
//! 2. the route's configured default `max_tokens`,
//! 3. the route's output-token distribution at the policy quantile (p75–p90),
//!    clamped to `[floor, ceiling]`, once the route has enough samples,
//! 4. a cold route: a configured sibling route's warm estimate, else the ceiling.
//!
//! Pure integer maths: the quantile value itself comes from a sketch kept by the
//! projections, handed in as data. The rule that sized a reservation is returned
//! so it can be recorded beside it.

use serde::{Deserialize, Serialize};

use crate::policy::MAX_UNITS;
use crate::rejection::InvalidInput;
use crate::types::Units;

/// Drift multipliers are parts per million: 1_034_000 means counted input runs
/// 3.4% below what the provider bills.
pub const PPM: u64 = 1_000_000;

/// Largest drift multiplier accepted (×4): anything above is a broken meter.
pub const MAX_DRIFT_PPM: u64 = 4 * PPM;

/// Which rule produced the output estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SizingRule {
    MaxTokens,
    RouteDefaultMaxTokens,
    RouteQuantile,
    SiblingQuantile,
    ColdCeiling,
}

/// The estimator settings of one route, carried by the published policy
/// ([`crate::Policy::estimator`]), so every node and replay sizes alike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EstimatorConfig {
    /// Quantile of the output distribution to reserve at, in ppm (750_000 = p75).
    pub quantile_ppm: u64,
    pub floor_units: Units,
    pub ceiling_units: Units,
    /// Samples a route needs before its own distribution is trusted.
    pub min_samples: u64,
    pub default_max_tokens: Option<Units>,
    /// A route whose warm estimate sizes this route while it is cold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sibling_route: Option<String>,
}

/// What the projections know of a route's output tokens at the configured quantile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEstimate {
    pub samples: u64,
    pub quantile_units: Units,
}

/// A sized reservation and how it was sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizing {
    pub units: Units,
    pub input_units: Units,
    pub output_units: Units,
    pub rule: SizingRule,
}

impl EstimatorConfig {
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let bad = |field| Err(InvalidInput::Policy { field });
        if !(1..PPM).contains(&self.quantile_ppm) {
            return bad("estimator.quantile_ppm");
        }
        if self.ceiling_units == 0
            || self.ceiling_units > MAX_UNITS
            || self.floor_units > self.ceiling_units
        {
            return bad("estimator.floor_units/ceiling_units");
        }
        if self
            .default_max_tokens
            .is_some_and(|m| m == 0 || m > MAX_UNITS)
        {
            return bad("estimator.default_max_tokens");
        }
        if let Some(sibling) = &self.sibling_route {
            if crate::types::validate_id("route", sibling).is_err() {
                return bad("estimator.sibling_route");
            }
        }
        Ok(())
    }
}

/// Sizes a reservation. `route` is the route's own estimate, `sibling` a
/// configured sibling route's, both as the projections last saw them.
pub fn size_reservation(
    config: &EstimatorConfig,
    counted_input_units: Units,
    drift_ppm: u64,
    max_tokens: Option<Units>,
    route: Option<RouteEstimate>,
    sibling: Option<RouteEstimate>,
) -> Result<Sizing, InvalidInput> {
    config.validate()?;
    if !(PPM..=MAX_DRIFT_PPM).contains(&drift_ppm) {
        return Err(InvalidInput::Policy {
            field: "drift multiplier",
        });
    }
    if counted_input_units > MAX_UNITS {
        return Err(InvalidInput::AbsurdUnits {
            units: counted_input_units,
            limit: MAX_UNITS,
        });
    }
    // Round up: undercounting input is what turns into systematic overshoot.
    let input_units =
        (u128::from(counted_input_units) * u128::from(drift_ppm)).div_ceil(u128::from(PPM));
    let input_units = u64::try_from(input_units).map_err(|_| InvalidInput::Overflow)?;
    let warm = |e: Option<RouteEstimate>| e.filter(|e| e.samples >= config.min_samples);
    let clamp = |q: Units| q.clamp(config.floor_units, config.ceiling_units);
    let (output_units, rule) = match (
        max_tokens,
        config.default_max_tokens,
        warm(route),
        warm(sibling),
    ) {
        (Some(0), ..) => return Err(InvalidInput::ZeroUnits),
        (Some(m), ..) => (m, SizingRule::MaxTokens),
        (None, Some(d), ..) => (d, SizingRule::RouteDefaultMaxTokens),
        (None, None, Some(r), _) => (clamp(r.quantile_units), SizingRule::RouteQuantile),
        (None, None, None, Some(s)) => (clamp(s.quantile_units), SizingRule::SiblingQuantile),
        (None, None, None, None) => (config.ceiling_units, SizingRule::ColdCeiling),
    };
    if output_units > MAX_UNITS {
        return Err(InvalidInput::AbsurdUnits {
            units: output_units,
            limit: MAX_UNITS,
        });
    }
    let units = input_units
        .checked_add(output_units)
        .ok_or(InvalidInput::Overflow)?;
    Ok(Sizing {
        units,
        input_units,
        output_units,
        rule,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EstimatorConfig {
        EstimatorConfig {
            quantile_ppm: 900_000,
            floor_units: 256,
            ceiling_units: 8_192,
            min_samples: 200,
            default_max_tokens: None,
            sibling_route: None,
        }
    }

    const WARM: RouteEstimate = RouteEstimate {
        samples: 5_000,
        quantile_units: 2_400,
    };
    const COLD: RouteEstimate = RouteEstimate {
        samples: 10,
        quantile_units: 90,
    };

    /// (config, counted input, drift ppm, max_tokens, route, sibling, expected units, expected rule)
    type Row = (
        EstimatorConfig,
        u64,
        u64,
        Option<u64>,
        Option<RouteEstimate>,
        Option<RouteEstimate>,
        u64,
        SizingRule,
    );

    #[test]
    fn each_rule_in_order() {
        let with_default = EstimatorConfig {
            default_max_tokens: Some(1_024),
            ..config()
        };
        // (config, counted input, drift ppm, max_tokens, route, sibling) -> (units, rule)
        let rows: [Row; 8] = [
            (
                config(),
                1_000,
                PPM,
                Some(500),
                Some(WARM),
                None,
                1_500,
                SizingRule::MaxTokens,
            ),
            (
                with_default.clone(),
                1_000,
                PPM,
                None,
                Some(WARM),
                None,
                2_024,
                SizingRule::RouteDefaultMaxTokens,
            ),
            (
                with_default,
                1_000,
                PPM,
                Some(300),
                None,
                None,
                1_300,
                SizingRule::MaxTokens,
            ),
            (
                config(),
                1_000,
                PPM,
                None,
                Some(WARM),
                None,
                3_400,
                SizingRule::RouteQuantile,
            ),
            (
                config(),
                1_000,
                PPM,
                None,
                Some(COLD),
                Some(WARM),
                3_400,
                SizingRule::SiblingQuantile,
            ),
            (
                config(),
                1_000,
                PPM,
                None,
                Some(COLD),
                Some(COLD),
                9_192,
                SizingRule::ColdCeiling,
            ),
            (
                config(),
                0,
                PPM,
                None,
                None,
                None,
                8_192,
                SizingRule::ColdCeiling,
            ),
            // Drift 3.4% on 1,000 counted tokens rounds up to 1,034; p90 below the floor is clamped.
            (
                config(),
                1_000,
                1_034_000,
                None,
                Some(RouteEstimate {
                    samples: 500,
                    quantile_units: 10,
                }),
                None,
                1_290,
                SizingRule::RouteQuantile,
            ),
        ];
        for (cfg, input, drift, max_tokens, route, sibling, units, rule) in rows {
            let sized = size_reservation(&cfg, input, drift, max_tokens, route, sibling).unwrap();
            assert_eq!(
                (sized.units, sized.rule),
                (units, rule),
                "{cfg:?} {input} {drift} {max_tokens:?} {route:?}"
            );
            assert_eq!(sized.units, sized.input_units + sized.output_units);
        }
    }

    #[test]
    fn bad_input_is_refused() {
        let c = config();
        assert_eq!(
            size_reservation(&c, 1, PPM, Some(0), None, None),
            Err(InvalidInput::ZeroUnits)
        );
        assert!(size_reservation(&c, 1, PPM - 1, None, None, None).is_err());
        assert!(size_reservation(&c, 1, MAX_DRIFT_PPM + 1, None, None, None).is_err());
        assert!(size_reservation(&c, MAX_UNITS + 1, PPM, None, None, None).is_err());
        assert!(size_reservation(&c, 1, PPM, Some(MAX_UNITS + 1), None, None).is_err());
        let inverted = EstimatorConfig {
            floor_units: 10_000,
            ..config()
        };
        assert!(size_reservation(&inverted, 1, PPM, None, None, None).is_err());
    }
}
