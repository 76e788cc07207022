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
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    /// Keeps every histogram value with its key.
    #[derive(Default)]
    struct Capture(Arc<Mutex<Vec<(String, f64)>>>);

    struct Values(String, Arc<Mutex<Vec<(String, f64)>>>);

    impl metrics::HistogramFn for Values {
        fn record(&self, value: f64) {
            self.1.lock().unwrap().push((self.0.clone(), value));
        }
    }

    impl Recorder for Capture {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            Histogram::from_arc(Arc::new(Values(name, self.0.clone())))
        }
    }

    #[test]
    fn a_settled_receipt_records_its_efficiency_by_subject_and_route() {
        let capture = Capture::default();
        let seen = capture.0.clone();
        let receipt: crate::Receipt = serde_json::from_value(serde_json::json!({
            "id": "rl-1", "subject": "t", "route": "chat", "accounting_epoch": "e",
            "policy_generation": 1, "state": "SETTLED", "reserved_units": 600,
            "held_units": 0, "actual_units": 450, "expires_at_ms": 5,
            "log_position": {"log_partition": 0, "offset": 3}
        }))
        .unwrap();
        metrics::with_local_recorder(&capture, || super::settled(&receipt));
        assert_eq!(
            *seen.lock().unwrap(),
            [(
                "reservoir_client_reservation_efficiency{route=chat,subject=t}".to_string(),
                0.75
            )]
        );
    }

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
