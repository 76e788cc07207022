//! Why is a tenant refused below their contract? The first seed's reasoning as
//! a decision table over three measures:
//!
//! - **efficiency**: the p50 of the tenant's reservation-efficiency histogram
//!   (settled ÷ reserved, per mille);
//! - **clustering** of refusals: the coefficient of variation (standard
//!   deviation ÷ mean) of the gaps between consecutive refusal timestamps. Evenly
//!   spread refusals give ≈ 0 (periodic) to ≈ 1 (Poisson); bursts separated by
//!   quiet periods give well above 1. Plus the share of refusals that found the
//!   bucket empty (available at most [`EMPTY_BUCKET_PERMILLE_OF_BURST`] of the
//!   burst);
//! - **utilization**: spent ÷ capacity the policy offered since the partitions
//!   opened (opening + refill × elapsed), per mille.
//!
//! | refusals | efficiency | refusals clustered, bucket empty | utilization | verdict |
//! |---|---|---|---|---|
//! | none | – | – | – | healthy |
//! | some | no settlements | – | – | inconclusive |
//! | some | low | – | – | over-reservation |
//! | some | good | yes | – | burst capacity |
//! | some | good | no | near the limit | limit too low |
//! | some | good | no | below | inconclusive |
//!
//! Burst is tested before the limit: clustered refusals into an empty bucket
//! point at the bucket size even when the average rate is also high.

use serde::{Deserialize, Serialize};

use crate::model::{EfficiencyHistogram, Refusal};

/// p50 efficiency at or above this is good (the seed: 0.75–0.9 is the healthy
/// band, a burst-limited tenant shows ≈ 0.85, an over-reserving one ≈ 0.47).
pub const GOOD_EFFICIENCY_PERMILLE: u64 = 700;
/// Gap CV above this (1.5) means the refusals are clustered.
pub const CLUSTERED_GAP_CV_PERMILLE: u64 = 1_500;
/// Fewest refusals whose gaps say anything about clustering.
pub const MIN_REFUSALS_FOR_PATTERN: usize = 4;
/// A bucket holding at most 10% of its burst at a refusal counts as empty.
pub const EMPTY_BUCKET_PERMILLE_OF_BURST: u64 = 100;
/// At least half the refusals must have found the bucket empty.
pub const EMPTY_AT_REFUSAL_SHARE_PERMILLE: u64 = 500;
/// Spending at least 85% of the offered capacity is running at the limit.
pub const NEAR_LIMIT_UTILIZATION_PERMILLE: u64 = 850;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Healthy,
    /// Reservations are sized far above use: fix the estimator.
    OverReservation,
    /// Refusals come in bursts into an empty bucket: raise the burst.
    BurstCapacity,
    /// Efficient reservations, steady refusals, spending at the limit.
    LimitTooLow,
    Inconclusive,
}

/// What the diagnosis looks at.
#[derive(Clone, Debug, Default)]
pub struct DiagnosisInputs {
    /// In time order.
    pub refusals: Vec<Refusal>,
    pub efficiency: EfficiencyHistogram,
    pub utilization_permille: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub tenant: String,
    pub verdict: Verdict,
    pub refusals: u64,
    pub settled_samples: u64,
    pub efficiency_p50_permille: Option<u64>,
    pub refusal_gap_cv_permille: Option<u64>,
    pub empty_bucket_share_permille: Option<u64>,
    pub utilization_permille: u64,
    pub explanation: String,
}

/// Coefficient of variation of the gaps between consecutive refusals, per mille.
pub fn gap_cv_permille(refusals: &[Refusal]) -> Option<u64> {
    if refusals.len() < MIN_REFUSALS_FOR_PATTERN {
        return None;
    }
    let gaps: Vec<f64> = refusals
        .windows(2)
        .map(|w| w[1].at_ms.saturating_sub(w[0].at_ms) as f64)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    if mean == 0.0 {
        return Some(u64::MAX); // all at one instant: as clustered as it gets
    }
    let variance = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    Some((variance.sqrt() / mean * 1000.0).round() as u64)
}

fn empty_bucket_share_permille(refusals: &[Refusal]) -> Option<u64> {
    if refusals.is_empty() {
        return None;
    }
    let empty = refusals
        .iter()
        .filter(|r| {
            u128::from(r.available_units) * 1000
                <= u128::from(r.burst_units) * u128::from(EMPTY_BUCKET_PERMILLE_OF_BURST)
        })
        .count();
    Some(empty as u64 * 1000 / refusals.len() as u64)
}

pub fn diagnose(tenant: &str, inputs: &DiagnosisInputs) -> Diagnosis {
    let efficiency = inputs.efficiency.quantile_permille(500);
    let cv = gap_cv_permille(&inputs.refusals);
    let empty = empty_bucket_share_permille(&inputs.refusals);
    let utilization = inputs.utilization_permille;
    let clustered = cv.is_some_and(|cv| cv > CLUSTERED_GAP_CV_PERMILLE)
        && empty.is_some_and(|e| e >= EMPTY_AT_REFUSAL_SHARE_PERMILLE);
    let (verdict, explanation) = match efficiency {
        _ if inputs.refusals.is_empty() => (Verdict::Healthy, "no refusals".to_string()),
        None => (
            Verdict::Inconclusive,
            "refusals but no settlements to measure efficiency".to_string(),
        ),
        Some(e) if e < GOOD_EFFICIENCY_PERMILLE => (
            Verdict::OverReservation,
            format!("p50 efficiency {e}‰ < {GOOD_EFFICIENCY_PERMILLE}‰: reservations hold far more than calls use"),
        ),
        Some(e) if clustered => (
            Verdict::BurstCapacity,
            format!("p50 efficiency {e}‰ is good; refusals clustered (gap CV {}‰) into an empty bucket", cv.unwrap_or(0)),
        ),
        Some(e) if utilization >= NEAR_LIMIT_UTILIZATION_PERMILLE => (
            Verdict::LimitTooLow,
            format!("p50 efficiency {e}‰ is good and spending is at {utilization}‰ of the offered capacity"),
        ),
        Some(e) => (
            Verdict::Inconclusive,
            format!("p50 efficiency {e}‰ is good, refusals not clustered, utilization only {utilization}‰"),
        ),
    };
    Diagnosis {
        tenant: tenant.to_string(),
        verdict,
        refusals: inputs.refusals.len() as u64,
        settled_samples: inputs.efficiency.samples,
        efficiency_p50_permille: efficiency,
        refusal_gap_cv_permille: cv,
        empty_bucket_share_permille: empty,
        utilization_permille: utilization,
        explanation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reservoir_core::{PartitionKey, RefusalReason};

    fn refusal(at_ms: u64, available_units: u64) -> Refusal {
        Refusal {
            key: PartitionKey::new("t", "r", "e", 1).unwrap(),
            at_ms,
            sequence: at_ms,
            reservation_id: "x".into(),
            requested_units: 1_000,
            reason: RefusalReason::InsufficientCapacity,
            retry_after_ms: None,
            available_units,
            burst_units: 10_000,
            dimension: None,
        }
    }

    fn efficiency(permille: u64, n: u64) -> EfficiencyHistogram {
        let mut h = EfficiencyHistogram::default();
        for _ in 0..n {
            h.observe(permille, 1000);
        }
        h
    }

    #[test]
    fn table() {
        let uniform: Vec<Refusal> = (0..20).map(|i| refusal(i * 3_000, 2_000)).collect();
        let bursts: Vec<Refusal> = (0..4)
            .flat_map(|b| (0..5).map(move |i| refusal(b * 300_000 + i * 10, 0)))
            .collect();
        // (refusals, p50 efficiency ‰, utilization ‰, expected verdict)
        let rows = [
            (vec![], 850, 300, Verdict::Healthy),
            (uniform.clone(), 470, 500, Verdict::OverReservation),
            (bursts.clone(), 470, 300, Verdict::OverReservation),
            (bursts.clone(), 850, 300, Verdict::BurstCapacity),
            (uniform.clone(), 850, 950, Verdict::LimitTooLow),
            (uniform.clone(), 850, 400, Verdict::Inconclusive),
            (uniform.clone(), 0, 950, Verdict::Inconclusive),
        ];
        for (refusals, eff, utilization_permille, expected) in rows {
            let inputs = DiagnosisInputs {
                refusals,
                efficiency: efficiency(eff, if eff == 0 { 0 } else { 10 }),
                utilization_permille,
            };
            let d = diagnose("t", &inputs);
            assert_eq!(d.verdict, expected, "{d:?}");
        }
        assert!(gap_cv_permille(&uniform).unwrap() < 100);
        assert!(gap_cv_permille(&bursts).unwrap() > CLUSTERED_GAP_CV_PERMILLE);
    }
}
