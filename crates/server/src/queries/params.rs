//! The opening every query shares: the path's identifier, `?min_position=` and
//! `?wait_ms=` (plus an endpoint's own parameters; anything else is a 400), and
//! the projection once it reached `min_position`, as the [`Projected`] extractor.

use super::*;

pub(super) type Params = Result<Query<BTreeMap<String, String>>, QueryRejection>;

pub(super) fn bad_query(detail: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", detail)
}

pub(super) fn store_failure(e: ProjectionError) -> ApiError {
    match e {
        ProjectionError::Timeout { .. } => unreachable!("handled by wait"),
        e if e.transient() => ApiError::unavailable(e.to_string()),
        e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    }
}

pub(super) fn path_value(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(raw) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()))?;
    // The rule every subject, route and tenant was written under, so a
    // value outside it names nothing (and the OpenAPI document says so).
    reservoir_core::types::validate_id("path identifier", &raw)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.to_string()))?;
    Ok(raw)
}

/// `LP:OFFSET`, or a bare `OFFSET` in log partition 0.
pub fn parse_position(raw: &str) -> Option<Position> {
    let (lp, offset) = match raw.split_once(':') {
        Some((lp, offset)) => (lp.parse().ok()?, offset),
        None => (0, raw),
    };
    Some(Position {
        log_partition: lp,
        offset: offset.parse().ok()?,
    })
}

/// The query parameters every endpoint shares, plus the endpoint's own `extra`.
pub(super) struct Consistency {
    pub(super) min_position: Option<Position>,
    pub(super) wait_ms: u64,
    pub(super) rest: BTreeMap<String, String>,
}

pub(super) fn consistency(params: Params, extra: &[&str]) -> Result<Consistency, ApiError> {
    let Query(mut map) = params.map_err(|e| bad_query(e.body_text()))?;
    if let Some(unknown) = map.keys().find(|k| {
        !["min_position", "wait_ms"].contains(&k.as_str()) && !extra.contains(&k.as_str())
    }) {
        return Err(bad_query(format!("unknown query parameter `{unknown}`")));
    }
    let min_position = match map.remove("min_position") {
        None => None,
        Some(raw) => Some(parse_position(&raw).ok_or_else(|| {
            bad_query(format!(
                "min_position `{raw}` is not LP:OFFSET or OFFSET (unsigned integers)"
            ))
        })?),
    };
    let wait_ms = match map.remove("wait_ms") {
        None => DEFAULT_WAIT_MS,
        Some(raw) => match raw.parse::<u64>() {
            Ok(ms) if ms <= MAX_WAIT_MS => ms,
            _ => {
                return Err(bad_query(format!(
                    "wait_ms `{raw}` is not an integer in 0..={MAX_WAIT_MS}"
                )))
            }
        },
    };
    Ok(Consistency {
        min_position,
        wait_ms,
        rest: map,
    })
}

/// The projection, once it reached `min_position` (or a 503 after the wait).
pub(super) async fn projection(queries: &QueryHandle, c: &Consistency) -> Result<Live, ApiError> {
    // Right after start the projector may still be opening its database.
    let started = std::time::Instant::now();
    let live = loop {
        match queries.live() {
            Ok(live) => break live,
            Err(e) if started.elapsed() >= Duration::from_millis(c.wait_ms) => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    if let Some(position) = c.min_position {
        if position.log_partition >= live.log_partitions {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "position_beyond_log",
                format!(
                    "min_position names log partition {}, and the log has {} (0 to {})",
                    position.log_partition,
                    live.log_partitions,
                    live.log_partitions.saturating_sub(1)
                ),
            ));
        }
        beyond_the_log(
            &live,
            position,
            c.wait_ms
                .saturating_sub(started.elapsed().as_millis() as u64),
        )
        .await?;
        match live
            .projections
            .wait_for_position(
                position,
                Duration::from_millis(c.wait_ms).saturating_sub(started.elapsed()),
            )
            .await
        {
            Ok(()) => {}
            Err(ProjectionError::Timeout { waited_ms, .. }) => {
                let at = live
                    .projections
                    .consumed(position.log_partition)
                    .map_err(store_failure)?;
                let mut e = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "projection_behind",
                    format!(
                        "the projection did not reach {}:{} within {waited_ms} ms (it has consumed log partition {} up to offset {at}, exclusive)",
                        position.log_partition, position.offset, position.log_partition
                    ),
                );
                e.retry_after_s = Some(1);
                return Err(e);
            }
            Err(e) => return Err(store_failure(e)),
        }
    }
    Ok(live)
}

/// How long a position past the log's end may take to appear in this
/// process's view of the log before it is answered as beyond it: a secondary
/// of the embedded log learns of new entries only when it catches up, and
/// a position a client holds was written before it asked.
const LOG_END_GRACE: Duration = Duration::from_millis(300);

/// 409 `position_beyond_log` when the log holds no entry at `position`
/// (after at most [`LOG_END_GRACE`], or `wait_ms` if shorter).
async fn beyond_the_log(live: &Live, position: Position, wait_ms: u64) -> Result<(), ApiError> {
    let lp = position.log_partition;
    let grace = LOG_END_GRACE.min(Duration::from_millis(wait_ms));
    let held = (live.log_has)(lp, position.offset, grace)
        .await
        .map_err(|e| ApiError::unavailable(format!("log partition {lp}: {e}")))?;
    if held {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "position_beyond_log",
        format!(
            "min_position {lp}:{} is past the end of log partition {lp}: no write was answered with it",
            position.offset
        ),
    ))
}

/// What an answer read through `at` reflects: the next offset per log
/// partition, read from the same snapshot as the answer.
pub(super) fn projected_to(at: &At, live: &Live) -> Result<Vec<u64>, ApiError> {
    (0..live.log_partitions)
        .map(|lp| at.consumed(lp).map_err(store_failure))
        .collect()
}

/// The query parameters an endpoint takes beyond `min_position` and `wait_ms`.
pub trait ExtraParams {
    const NAMES: &'static [&'static str];
}

/// Only the shared parameters.
pub struct NoExtra;
impl ExtraParams for NoExtra {
    const NAMES: &'static [&'static str] = &[];
}

/// `/v1/routes/{route}/estimate`: `model`, `min_samples`.
pub struct EstimateParams;
impl ExtraParams for EstimateParams {
    const NAMES: &'static [&'static str] = &["model", "min_samples"];
}

/// `/v1/{routes,tenants}/{id}/efficiency`: `dimension` (a further dimension's
/// histogram; absent: the primary dimension's).
pub struct EfficiencyParams;
impl ExtraParams for EfficiencyParams {
    const NAMES: &'static [&'static str] = &["dimension"];
}

/// The histogram key of `owner`'s efficiency in the `dimension` parameter's
/// dimension (400 for a name that is not one), or the bare owner.
pub(super) fn efficiency_key(
    owner: &str,
    rest: &BTreeMap<String, String>,
) -> Result<String, ApiError> {
    Ok(match dimension_param(rest)? {
        None => owner.to_string(),
        Some(d) => reservoir_projections::store::dimension_key(owner, d),
    })
}

/// The `dimension` parameter (400 for a name that is not one).
pub(super) fn dimension_param(
    rest: &BTreeMap<String, String>,
) -> Result<Option<reservoir_core::Dimension>, ApiError> {
    let Some(name) = rest.get("dimension") else {
        return Ok(None);
    };
    reservoir_core::Dimension::from_name(name)
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_parameter",
                format!(
                    "dimension must be requests, input_tokens, output_tokens or tokens, not {name:?}"
                ),
            )
        })
}

/// The opening every query handler shares: the path's identifier (non-empty,
/// no `|`), the consistency parameters and the endpoint's own (`E`; anything
/// else is a 400), and the projection once it reached `min_position` (or a
/// 503 with Retry-After when it did not in `wait_ms`).
pub struct Projected<E = NoExtra> {
    pub value: String,
    pub(super) live: Live,
    /// The endpoint's own parameters, unparsed.
    pub rest: BTreeMap<String, String>,
    extra: std::marker::PhantomData<E>,
}

impl<S, E> FromRequestParts<S> for Projected<E>
where
    QueryHandle: FromRef<S>,
    S: Send + Sync,
    E: ExtraParams,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let path = Path::<String>::from_request_parts(parts, state).await;
        let value = path_value(path)?;
        let params = Query::<BTreeMap<String, String>>::from_request_parts(parts, state).await;
        let c = consistency(params, E::NAMES)?;
        let live = projection(&QueryHandle::from_ref(state), &c).await?;
        Ok(Projected {
            value,
            live,
            rest: c.rest,
            extra: std::marker::PhantomData,
        })
    }
}
