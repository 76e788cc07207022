//! The query endpoints, each opened by the [`Projected`] extractor, and their
//! OpenAPI document.

use super::*;

/// Balances of a tenant: the roll-up over its partitions and each partition.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/balances",
    params(("tenant" = String, Path), MinPosition, WaitMs),
    responses(
        (status = 200, body = BalancesView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No partition of this tenant in the projection", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn tenant_balances(
    Projected {
        value: tenant,
        live,
        ..
    }: Projected,
) -> Result<Response, ApiError> {
    // One snapshot: the roll-up, its partitions and `projected_to` agree.
    let at = live.projections.at();
    let total = at.tenant_balance(&tenant).map_err(store_failure)?;
    let partitions = at.tenant_partitions(&tenant).map_err(store_failure)?;
    balances(&at, &live, tenant, "tenant", total, partitions)
}

/// Balances of a route: the roll-up over its partitions (every tenant) and each partition.
#[utoipa::path(get, path = "/v1/routes/{route}/balances",
    params(("route" = String, Path, description = "percent-encode any `/`"), MinPosition, WaitMs),
    responses(
        (status = 200, body = BalancesView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No partition of this route in the projection", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn route_balances(
    Projected {
        value: route, live, ..
    }: Projected,
) -> Result<Response, ApiError> {
    let at = live.projections.at();
    let total = at.route_balance(&route).map_err(store_failure)?;
    let partitions = at
        .all_balances()
        .map_err(store_failure)?
        .into_iter()
        .filter(|b| b.key.route == route)
        .collect();
    balances(&at, &live, route, "route", total, partitions)
}

fn balances(
    at: &At,
    live: &Live,
    name: String,
    scope: &str,
    total: Option<Rollup>,
    partitions: Vec<PartitionBalance>,
) -> Result<Response, ApiError> {
    let Some(total) = total else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no partition of {scope} {name} in the projection"),
        ));
    };
    Ok(Json(BalancesView {
        name,
        total: (&total).into(),
        partitions: partitions.iter().map(Into::into).collect(),
        projected_to: projected_to(at, live)?,
    })
    .into_response())
}

/// A route's output-token estimate: p50/p75/p90/p99 of settled output tokens in
/// the rolling window, sample counts, warm or cold, and the input drift.
#[utoipa::path(get, path = "/v1/routes/{route}/estimate",
    params(("route" = String, Path, description = "percent-encode any `/`"),
        ("model" = Option<String>, Query, description = "one model's digest; absent: every model of the route merged"),
        ("min_samples" = Option<u64>, Query, description = "samples needed to be warm (default 100)"),
        MinPosition, WaitMs),
    responses(
        (status = 200, body = EstimateView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn route_estimate(
    Projected {
        value: route,
        live,
        rest,
        ..
    }: Projected<EstimateParams>,
) -> Result<Response, ApiError> {
    let model = match rest.get("model") {
        Some(m) if m.is_empty() || m.contains('|') => {
            return Err(bad_query("model is non-empty and never contains `|`"))
        }
        other => other.cloned(),
    };
    let min_samples = match rest.get("min_samples") {
        None => DEFAULT_MIN_SAMPLES,
        Some(raw) => raw
            .parse()
            .map_err(|_| bad_query(format!("min_samples `{raw}` is not an unsigned integer")))?,
    };
    let at = live.projections.at();
    let e = at
        .route_estimate(&route, model.as_deref(), min_samples)
        .map_err(store_failure)?;
    let drift = at.input_drift(&route).map_err(store_failure)?;
    Ok(Json(EstimateView {
        route: e.route,
        model: e.model,
        samples: e.samples,
        lifetime_samples: e.lifetime_samples,
        p50_units: e.p50_units,
        p75_units: e.p75_units,
        p90_units: e.p90_units,
        p99_units: e.p99_units,
        min_samples,
        temperature: if e.warm { "warm" } else { "cold" }.to_string(),
        warm: e.warm,
        input_drift: drift.map(|d| InputDriftView {
            samples: d.samples,
            counted_input_units: d.counted_input_units,
            reported_input_units: d.reported_input_units,
            multiplier_ppm: d.multiplier_ppm(),
        }),
        projected_to: projected_to(&at, &live)?,
    })
    .into_response())
}

/// Reservation efficiency (settled ÷ reserved) of a route.
#[utoipa::path(get, path = "/v1/routes/{route}/efficiency",
    params(("route" = String, Path, description = "percent-encode any `/`"),
        ("dimension" = Option<String>, Query, description = "a further dimension (requests, input_tokens, output_tokens, tokens); absent: the primary one"),
        MinPosition, WaitMs),
    responses(
        (status = 200, body = EfficiencyView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn route_efficiency(
    Projected {
        value: route,
        live,
        rest,
        ..
    }: Projected<EfficiencyParams>,
) -> Result<Response, ApiError> {
    let at = live.projections.at();
    let h = at
        .efficiency_by_route(&efficiency_key(&route, &rest)?)
        .map_err(store_failure)?;
    let to = projected_to(&at, &live)?;
    Ok(Json(efficiency_view("route", route, &h, to)).into_response())
}

/// Reservation efficiency (settled ÷ reserved) of a tenant.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/efficiency",
    params(("tenant" = String, Path),
        ("dimension" = Option<String>, Query, description = "a further dimension (requests, input_tokens, output_tokens, tokens); absent: the primary one"),
        MinPosition, WaitMs),
    responses(
        (status = 200, body = EfficiencyView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn tenant_efficiency(
    Projected {
        value: tenant,
        live,
        rest,
        ..
    }: Projected<EfficiencyParams>,
) -> Result<Response, ApiError> {
    let at = live.projections.at();
    let h = at
        .efficiency_by_tenant(&efficiency_key(&tenant, &rest)?)
        .map_err(store_failure)?;
    let to = projected_to(&at, &live)?;
    Ok(Json(efficiency_view("tenant", tenant, &h, to)).into_response())
}

/// Why a tenant is refused: over-reservation (low efficiency, uniform
/// refusals), burst capacity (clustered refusals into an empty bucket) or a
/// limit that is too low (efficient, spending near the limit).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/diagnosis",
    params(("tenant" = String, Path),
        ("dimension" = Option<String>, Query, description = "diagnose one dimension (requests, input_tokens, output_tokens, tokens) on its own refusals, efficiency and utilization; absent: the primary ones"),
        MinPosition, WaitMs),
    responses(
        (status = 200, body = DiagnosisView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn tenant_diagnosis(
    Projected {
        value: tenant,
        live,
        rest,
        ..
    }: Projected<EfficiencyParams>,
) -> Result<Response, ApiError> {
    let dimension = dimension_param(&rest)?;
    let at = live.projections.at();
    let d = at.diagnosis_in(&tenant, dimension).map_err(store_failure)?;
    Ok(Json(DiagnosisView {
        tenant: d.tenant,
        dimension: dimension.map(|d| d.name().to_string()),
        verdict: json_text(&d.verdict),
        refusals: d.refusals,
        settled_samples: d.settled_samples,
        efficiency_p50_permille: d.efficiency_p50_permille,
        refusal_gap_cv_permille: d.refusal_gap_cv_permille,
        empty_bucket_share_permille: d.empty_bucket_share_permille,
        utilization_permille: d.utilization_permille,
        explanation: d.explanation,
        projected_to: projected_to(&at, &live)?,
    })
    .into_response())
}

/// A reservation's projected record (state, units, timestamps, operation id).
#[utoipa::path(get, path = "/v1/projections/reservations/{id}",
    params(("id" = String, Path), MinPosition, WaitMs),
    responses(
        (status = 200, body = ReservationRecordView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not in the projection", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn reservation(
    principal: crate::auth::Principal,
    Projected {
        value: raw, live, ..
    }: Projected,
) -> Result<Response, ApiError> {
    let id = ReservationId::new(&raw).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_id",
            e.to_string(),
        )
    })?;
    let at = live.projections.at();
    let pruned = at.pruned_before_ms().map_err(store_failure)?;
    let unknown = || {
        let retention = match pruned {
            Some(ms) => format!(
                " (records of reservations that finished before {ms} ms are pruned by the projection's retention rule; `reservoir-replay state` answers from the log)"
            ),
            None => String::new(),
        };
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_reservation",
            format!("reservation {id} is not in the projection{retention}"),
        )
    };
    // By id alone, through the projections' id index: the same on a node
    // whose writers hold the id and on one that only projects the log.
    let record = at
        .reservation_by_id(id.as_str())
        .map_err(store_failure)?
        // Another subject's reservation is answered as one that does not exist.
        .filter(|record| principal.sees(&record.key.subject))
        .ok_or_else(unknown)?;
    let r = &record.reservation;
    Ok(Json(ReservationRecordView {
        id: r.id.to_string(),
        partition_key: (&record.key).into(),
        state: json_text(&r.state),
        reserved_units: r.reserved_units,
        held_units: r.held_units,
        actual_units: r.actual_units,
        overdraft_units: r.overdraft_units,
        operation_id: r.operation_id.as_ref().map(|o| o.to_string()),
        reserved_at_ms: r.reserved_at_ms,
        expires_at_ms: r.expires_at_ms,
        started_at_ms: r.started_at_ms,
        execution_deadline_ms: r.execution_deadline_ms,
        finished_at_ms: r.finished_at_ms,
        projected_to: projected_to(&at, &live)?,
    })
    .into_response())
}

/// `?min_position=`: a write's `log_position` as `LP:OFFSET`, or a bare offset
/// in log partition 0.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MinPosition {
    /// Answer only once the projection includes this log position (`LP:OFFSET` or `OFFSET`).
    #[param(example = "0:42")]
    pub min_position: Option<String>,
}

/// `?wait_ms=`: how long to wait for `min_position`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitMs {
    /// Milliseconds to wait for `min_position` before a 503 (default 2000, at most 10000).
    pub wait_ms: Option<u64>,
}

#[derive(OpenApi)]
#[openapi(
    paths(
        tenant_balances,
        route_balances,
        route_estimate,
        route_efficiency,
        tenant_efficiency,
        tenant_diagnosis,
        route_shadow,
        tenant_shadow,
        reservation
    ),
    components(schemas(
        LedgerView,
        PartitionBalanceView,
        RollupView,
        BalancesView,
        InputDriftView,
        EstimateView,
        EfficiencyView,
        DiagnosisView,
        ShadowView,
        ShadowReasonCount,
        ReservationRecordView
    ))
)]
pub struct QueriesDoc;
