//! Metrics: the Prometheus exporter the binary serves at `/metrics`, and the
//! counters and histograms the writer and the API record through the `metrics` facade.
//!
//! - `reservoir_admissions_total{route}`: reservations admitted (committed).
//! - `reservoir_refusals_total{reason,route}`: limit refusals (committed `AdmissionRefused`).
//! - `reservoir_shadow_verdicts_total{route,verdict}`: what a policy in shadow
//!   mode would have decided (`would_admit`, `would_refuse_*`) for each reserve
//!   it admitted anyway.
//! - `reservoir_rejections_total{code}`: every other answered rejection, by problem code.
//! - `reservoir_batch_commands`, `reservoir_batch_records`: group-commit batch sizes.
//! - `reservoir_append_seconds`: log append latency; `reservoir_append_failures_total`;
//!   `reservoir_claim_unconfirmed_total`: batches that appended nothing and whose
//!   answers were withheld (503) because the writer could not confirm its claim.
//! - `reservoir_reservation_efficiency{route}`: settled ÷ reserved, per settlement.
//! - `reservoir_reservations_in_memory`: records the writers hold (open ones and
//!   finished ones inside the idempotency window), counted from the writers'
//!   index when `/metrics` is rendered ([`count_in_memory`] names the count);
//!   `reservoir_reservations_evicted_total`:
//!   records moved to the idempotency index; `reservoir_retired_lookups_total{result}`:
//!   lookups in that index (`miss` for every new reserve, `hit` for a retry of an
//!   evicted id).
//! - `reservoir_overdraft_units_total{route}`, `reservoir_expired_total`,
//!   `reservoir_usage_unknown_total`.
//! - `reservoir_cluster_forwarded_total`: requests a cluster node forwarded to
//!   the owner of their partition (one hop more; a client given the cluster's
//!   nodes learns the owner from the answer's `x-reservoir-served-by`).
//! - From the projector (`reservoir_projections`): `reservoir_projection_lag_entries{log_partition}`,
//!   and per route `reservoir_debt_units` and `reservoir_frozen_partitions`.
//!
//! `deploy/grafana/dashboards/reservoir.json` draws these; a test checks that
//! every metric it names is exported by a running server.

use std::sync::{OnceLock, RwLock};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use reservoir_core::{EventBody, Partition, PartitionKey, ShadowVerdict};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often histogram samples are folded into their buckets. The exporter
/// keeps every sample it is given until `/metrics` is rendered or upkeep
/// runs: a node nobody scraped grew by every sample of every request (about
/// ten a reserve/start/settle cycle), and one scraped once a minute held a
/// minute of them.
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Installs the global recorder once per process (several in-process servers in
/// a test share it) and returns the handle that renders `/metrics`.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("reservoir_reservation_efficiency".into()),
                    &[
                        0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 4.0,
                    ],
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Prefix("reservoir_batch_".into()),
                        &[
                            1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                        ],
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("reservoir_append_seconds".into()),
                        &[
                            0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0,
                        ],
                    )
                })
                .expect("static bucket lists are non-empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(UPKEEP_INTERVAL);
                    upkeep.run_upkeep();
                })
                .expect("spawn the metrics upkeep thread");
            // Another recorder may already be installed (an embedding program's): then
            // our handle still renders what is recorded through it, which is nothing;
            // say so rather than fail.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            // Counters without labels exist from the start, at 0: a rate over a
            // series that appears only with the first failure shows "no data"
            // instead of 0 until then (the dashboard in deploy/grafana).
            for name in [
                "reservoir_append_failures_total",
                "reservoir_expired_total",
                "reservoir_usage_unknown_total",
            ] {
                metrics::counter!(name).increment(0);
            }
            handle
        })
        .clone()
}

/// Records what one committed event means for the metrics.
pub fn record_event(key: &PartitionKey, body: &EventBody, partition: Option<&Partition>) {
    match body {
        EventBody::Reserved {
            shadow,
            shadow_dimension,
            ..
        } => {
            metrics::counter!("reservoir_admissions_total", "route" => key.route.clone())
                .increment(1);
            if let Some(verdict) = shadow {
                let verdict = match verdict {
                    ShadowVerdict::WouldAdmit => "would_admit",
                    ShadowVerdict::WouldRefuseInsufficientCapacity => {
                        "would_refuse_insufficient_capacity"
                    }
                    ShadowVerdict::WouldRefuseDebtOutstanding => "would_refuse_debt_outstanding",
                    ShadowVerdict::WouldRefuseRequestTooLarge => "would_refuse_request_too_large",
                };
                let route = key.route.clone();
                match shadow_dimension {
                    // The dimension a would-refuse verdict names.
                    Some(d) => metrics::counter!("reservoir_shadow_verdicts_total", "route" => route, "verdict" => verdict, "dimension" => d.name()).increment(1),
                    None => metrics::counter!("reservoir_shadow_verdicts_total", "route" => route, "verdict" => verdict).increment(1),
                }
            }
        }
        EventBody::AdmissionRefused { reason, .. } => {
            let reason = match reason {
                reservoir_core::RefusalReason::InsufficientCapacity => "insufficient_capacity",
                reservoir_core::RefusalReason::DebtOutstanding => "debt_outstanding",
                reservoir_core::RefusalReason::RequestTooLarge => "request_too_large",
            };
            metrics::counter!("reservoir_refusals_total", "reason" => reason, "route" => key.route.clone())
                .increment(1);
        }
        EventBody::Settled {
            id,
            actual_units,
            overdraft_units,
            ..
        } => {
            let reserved = partition
                .and_then(|p| p.reservation(id))
                .map(|r| r.reserved_units)
                .unwrap_or(0);
            if reserved > 0 {
                let efficiency = *actual_units as f64 / reserved as f64;
                metrics::histogram!("reservoir_reservation_efficiency", "route" => key.route.clone()).record(efficiency);
            }
            if *overdraft_units > 0 {
                metrics::counter!("reservoir_overdraft_units_total", "route" => key.route.clone())
                    .increment(*overdraft_units);
            }
        }
        EventBody::Expired { .. } => metrics::counter!("reservoir_expired_total").increment(1),
        EventBody::UsageUnknown { .. } => {
            metrics::counter!("reservoir_usage_unknown_total").increment(1)
        }
        _ => {}
    }
}

/// Records that left the writers' memory for the idempotency index.
pub fn evicted(records: usize) {
    metrics::counter!("reservoir_reservations_evicted_total").increment(records as u64);
}

type Count = Box<dyn Fn() -> usize + Send + Sync>;

/// What `reservoir_reservations_in_memory` reports, asked at every render.
static IN_MEMORY: RwLock<Option<Count>> = RwLock::new(None);

/// Names the count of records the writers hold: the index of the embedded
/// writers, or of every partition a cluster node serves. The last call wins
/// (a writer rebuilt in the same process names its new index). Counting when
/// `/metrics` is rendered gives the gauge one source: counted per event, it
/// drifted from the index whenever records arrived another way (recovery,
/// a take-over) or left with a partition.
pub fn count_in_memory(count: impl Fn() -> usize + Send + Sync + 'static) {
    *IN_MEMORY.write().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(count));
}

/// The Prometheus text of every metric, the in-memory gauge counted now.
pub fn render(handle: &PrometheusHandle) -> String {
    if let Some(count) = IN_MEMORY.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        metrics::gauge!("reservoir_reservations_in_memory").set(count() as f64);
    }
    handle.render()
}
