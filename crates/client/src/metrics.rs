//! Gateway-side metrics, through the `metrics` facade (the gateway installs
//! the exporter): reservation efficiency (settled ÷ reserved) per subject and
//! route, beside the retry, unknown, fallback and scheduler counters recorded
//! where they happen.
//!
//! | name | kind | labels |
//! | --- | --- | --- |
//! | `reservoir_client_reservation_efficiency` | histogram | subject, route |
//! | `reservoir_client_retries_total` | counter | step |
//! | `reservoir_client_reservation_unknown_total` | counter | |
//! | `reservoir_client_dropped_leases_total` | counter | |
//! | `reservoir_client_background_failures_total` | counter | step |
//! | `reservoir_client_fallback_admissions_total` | counter | |
//! | `reservoir_client_starts_total` | counter | tenant |
//! | `reservoir_client_start_share`, `reservoir_client_start_fair_share` | gauge | tenant |

use crate::types::Receipt;

/// settled ÷ reserved, or `None` for a reservation of 0 units.
pub fn efficiency(actual_units: u64, reserved_units: u64) -> Option<f64> {
    (reserved_units > 0).then(|| actual_units as f64 / reserved_units as f64)
}

/// Records a settled (or released: 0 used) receipt's efficiency.
pub(crate) fn settled(receipt: &Receipt) {
    let actual = receipt.actual_units.unwrap_or(0);
    if let Some(e) = efficiency(actual, receipt.reserved_units) {
        metrics::histogram!(
            "reservoir_client_reservation_efficiency",
            "subject" => receipt.subject.clone(),
            "route" => receipt.route.clone()
        )
        .record(e);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn efficiency_is_settled_over_reserved() {
        // (actual, reserved, efficiency)
        let table = [
            (900, 1000, Some(0.9)),
            (0, 600, Some(0.0)),
            (1200, 600, Some(2.0)),
            (5, 0, None),
        ];
        for (actual, reserved, want) in table {
            assert_eq!(
                super::efficiency(actual, reserved),
                want,
                "{actual}/{reserved}"
            );
        }
    }
}
