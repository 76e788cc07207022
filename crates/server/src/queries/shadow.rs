//! Shadow verdicts an operator compares before enforcing: for a route or a
//! tenant, how many reserves decided in shadow mode (a policy's `shadow_mode`,
//! or a staged rollout that leaves the route out) enforcement would have
//! admitted or refused, and why, over a window of log time.

use super::*;
use reservoir_projections::model::ShadowRecord;

/// `/v1/{routes,tenants}/{id}/shadow`: `from_ms`, `to_ms` (log time,
/// inclusive; default: all of it).
pub struct ShadowParams;
impl ExtraParams for ShadowParams {
    const NAMES: &'static [&'static str] = &["from_ms", "to_ms"];
}

/// Shadow verdicts of a route or a tenant over `[from_ms, to_ms]`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ShadowView {
    /// `route` or `tenant`.
    pub scope: String,
    pub name: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub would_admit: u64,
    pub would_refuse: u64,
    /// The would-refuse verdicts by reason and dimension, most frequent first.
    pub reasons: Vec<ShadowReasonCount>,
    pub projected_to: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ShadowReasonCount {
    /// `insufficient_capacity`, `debt_outstanding` or `request_too_large`.
    pub reason: String,
    /// The dimension it would have refused in (absent in records logged
    /// before it was kept).
    pub dimension: Option<String>,
    pub count: u64,
}

fn window(rest: &BTreeMap<String, String>) -> Result<(u64, u64), ApiError> {
    let at = |name: &str, default: u64| match rest.get(name) {
        None => Ok(default),
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| bad_query(format!("{name} must be milliseconds since the Unix epoch"))),
    };
    let (from, to) = (at("from_ms", 0)?, at("to_ms", u64::MAX)?);
    if from > to {
        return Err(bad_query("from_ms is after to_ms"));
    }
    Ok((from, to))
}

fn shadow_view(
    scope: &str,
    name: String,
    (from_ms, to_ms): (u64, u64),
    records: &[ShadowRecord],
    projected_to: Vec<u64>,
) -> ShadowView {
    let mut reasons: BTreeMap<(&str, Option<&str>), u64> = BTreeMap::new();
    let mut would_admit = 0;
    for r in records {
        let Some(reason) = r.verdict.would_refuse() else {
            would_admit += 1;
            continue;
        };
        *reasons
            .entry((reason, r.dimension.map(|d| d.name())))
            .or_default() += 1;
    }
    let mut reasons: Vec<ShadowReasonCount> = reasons
        .into_iter()
        .map(|((reason, dimension), count)| ShadowReasonCount {
            reason: reason.to_string(),
            dimension: dimension.map(str::to_string),
            count,
        })
        .collect();
    reasons.sort_by_key(|r| std::cmp::Reverse(r.count));
    ShadowView {
        scope: scope.to_string(),
        name,
        from_ms,
        to_ms,
        would_admit,
        would_refuse: reasons.iter().map(|r| r.count).sum(),
        reasons,
        projected_to,
    }
}

async fn shadow(scope: &str, p: Projected<ShadowParams>) -> Result<Response, ApiError> {
    let w = window(&p.rest)?;
    let at = p.live.projections.at();
    let records = at
        .shadow_verdicts(scope, &p.value, w.0, w.1)
        .map_err(store_failure)?;
    let to = projected_to(&at, &p.live)?;
    Ok(Json(shadow_view(scope, p.value, w, &records, to)).into_response())
}

/// Shadow verdicts of a route (every tenant).
#[utoipa::path(get, path = "/v1/routes/{route}/shadow",
    params(("route" = String, Path, description = "percent-encode any `/`"),
        ("from_ms" = Option<u64>, Query, description = "window start, log time (ms since the Unix epoch, inclusive; default 0)"),
        ("to_ms" = Option<u64>, Query, description = "window end, log time (inclusive; default: no end)"),
        MinPosition, WaitMs),
    responses(
        (status = 200, body = ShadowView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn route_shadow(p: Projected<ShadowParams>) -> Result<Response, ApiError> {
    shadow("route", p).await
}

/// Shadow verdicts of a tenant (every route).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/shadow",
    params(("tenant" = String, Path),
        ("from_ms" = Option<u64>, Query, description = "window start, log time (ms since the Unix epoch, inclusive; default 0)"),
        ("to_ms" = Option<u64>, Query, description = "window end, log time (inclusive; default: no end)"),
        MinPosition, WaitMs),
    responses(
        (status = 200, body = ShadowView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "min_position is past the end of the log (position_beyond_log)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn tenant_shadow(p: Projected<ShadowParams>) -> Result<Response, ApiError> {
    shadow("tenant", p).await
}
