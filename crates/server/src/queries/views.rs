//! What the query endpoints answer: balances, estimates, efficiency,
//! diagnosis and projected reservation records, with the log position the
//! projection had reached (`projected_to`).

use super::*;

/// One ledger partition's balance as projected.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct PartitionBalanceView {
    pub partition_key: PartitionKeyView,
    pub ledger: LedgerView,
    pub debt_units: u64,
    /// Admission is suspended while debt is outstanding.
    pub frozen: bool,
    pub closed: bool,
    pub quarantined: bool,
    pub open_reservations: u64,
    pub refusals: u64,
    pub last_sequence: u64,
    pub opened_at_ms: u64,
    pub last_at_ms: u64,
    /// Opening plus refill over the partition's life (utilization denominator).
    pub offered_units: u64,
}

impl From<&PartitionBalance> for PartitionBalanceView {
    fn from(b: &PartitionBalance) -> Self {
        PartitionBalanceView {
            partition_key: (&b.key).into(),
            ledger: (&b.ledger).into(),
            debt_units: b.debt_units,
            frozen: b.frozen,
            closed: b.closed,
            quarantined: b.quarantined,
            open_reservations: b.open_reservations,
            refusals: b.refusals,
            last_sequence: b.last_sequence,
            opened_at_ms: b.opened_at_ms,
            last_at_ms: b.last_at_ms,
            offered_units: b.offered_units,
        }
    }
}

/// Balances summed over partitions.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct RollupView {
    pub partitions: u64,
    pub frozen_partitions: u64,
    pub closed_partitions: u64,
    pub quarantined_partitions: u64,
    pub open_reservations: u64,
    pub refusals: u64,
    pub debt_units: u64,
    pub offered_units: u64,
    /// Spent ÷ offered, per mille.
    pub utilization_permille: u64,
    pub ledger: LedgerView,
}

impl From<&Rollup> for RollupView {
    fn from(r: &Rollup) -> Self {
        RollupView {
            partitions: r.partitions,
            frozen_partitions: r.frozen_partitions,
            closed_partitions: r.closed_partitions,
            quarantined_partitions: r.quarantined_partitions,
            open_reservations: r.open_reservations,
            refusals: r.refusals,
            debt_units: r.debt_units,
            offered_units: r.offered_units,
            utilization_permille: r.utilization_permille(),
            ledger: (&r.ledger).into(),
        }
    }
}

/// `GET /v1/tenants/{tenant}/balances` and `GET /v1/routes/{route}/balances`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct BalancesView {
    /// The tenant or the route.
    pub name: String,
    pub total: RollupView,
    pub partitions: Vec<PartitionBalanceView>,
    /// Next offset the projection will consume, per log partition.
    pub projected_to: Vec<u64>,
}

/// Counted vs provider-reported input tokens of a route.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct InputDriftView {
    pub samples: u64,
    pub counted_input_units: u64,
    pub reported_input_units: u64,
    /// Reported ÷ counted in parts per million, never below 1,000,000.
    pub multiplier_ppm: Option<u64>,
}

/// `GET /v1/routes/{route}/estimate`: settled output tokens of the route.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct EstimateView {
    pub route: String,
    /// The model asked for, or `*` for every model of the route merged.
    pub model: String,
    /// Samples in the rolling window (what the quantiles describe).
    pub samples: u64,
    pub lifetime_samples: u64,
    pub p50_units: Option<u64>,
    pub p75_units: Option<u64>,
    pub p90_units: Option<u64>,
    pub p99_units: Option<u64>,
    pub min_samples: u64,
    /// `warm` (samples ≥ min_samples) or `cold`.
    pub temperature: String,
    pub warm: bool,
    pub input_drift: Option<InputDriftView>,
    pub projected_to: Vec<u64>,
}

/// Reservation efficiency (settled ÷ reserved) of a route or a tenant.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct EfficiencyView {
    /// `route` or `tenant`.
    pub scope: String,
    pub name: String,
    pub samples: u64,
    pub settled_units: u64,
    pub reserved_units: u64,
    /// Total settled ÷ total reserved, per mille.
    pub overall_permille: Option<u64>,
    pub p10_permille: Option<u64>,
    pub p50_permille: Option<u64>,
    pub p90_permille: Option<u64>,
    /// Bucket `i` counts settles with efficiency in `[i·w, (i+1)·w)` per mille;
    /// the last bucket holds everything above.
    pub bucket_width_permille: u64,
    pub buckets: Vec<u64>,
    pub projected_to: Vec<u64>,
}

pub(super) fn efficiency_view(
    scope: &str,
    name: String,
    h: &EfficiencyHistogram,
    at: Vec<u64>,
) -> EfficiencyView {
    EfficiencyView {
        scope: scope.to_string(),
        name,
        samples: h.samples,
        settled_units: h.settled_units,
        reserved_units: h.reserved_units,
        overall_permille: h.overall_permille(),
        p10_permille: h.quantile_permille(100),
        p50_permille: h.quantile_permille(500),
        p90_permille: h.quantile_permille(900),
        bucket_width_permille: reservoir_projections::model::EFFICIENCY_BUCKET_PERMILLE,
        buckets: h.buckets.clone(),
        projected_to: at,
    }
}

/// `GET /v1/tenants/{tenant}/diagnosis`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct DiagnosisView {
    pub tenant: String,
    /// The dimension diagnosed (`?dimension=`); absent: the primary ones.
    pub dimension: Option<String>,
    /// `healthy`, `over_reservation`, `burst_capacity`, `limit_too_low` or `inconclusive`.
    pub verdict: String,
    pub refusals: u64,
    pub settled_samples: u64,
    pub efficiency_p50_permille: Option<u64>,
    /// Coefficient of variation of the gaps between refusals (low: uniform, high: clustered).
    pub refusal_gap_cv_permille: Option<u64>,
    pub empty_bucket_share_permille: Option<u64>,
    pub utilization_permille: u64,
    pub explanation: String,
    pub projected_to: Vec<u64>,
}

/// `GET /v1/projections/reservations/{id}`: the projected record.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ReservationRecordView {
    pub id: String,
    pub partition_key: PartitionKeyView,
    /// `RESERVED`, `STARTED`, `SETTLED`, `SETTLED_WITH_DEBT`, `RELEASED`, `EXPIRED`, `USAGE_UNKNOWN`, …
    pub state: String,
    pub reserved_units: u64,
    pub held_units: u64,
    pub actual_units: Option<u64>,
    pub overdraft_units: u64,
    pub operation_id: Option<String>,
    pub reserved_at_ms: u64,
    pub expires_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub execution_deadline_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub projected_to: Vec<u64>,
}

pub(super) fn json_text<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(e) => e.to_string(),
    }
}
