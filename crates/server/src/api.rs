//! The HTTP API (axum) and its OpenAPI 3 description, generated from the code
//! below by `utoipa` and served at `/openapi.json`.
//!
//! Handlers validate and translate; they never decide. Each write becomes one
//! [`Request`] to the shard that owns the partition, and the answer comes back
//! only after the writer's batch is durable in the log, carrying its position.
//! Bodies are read by [`ApiJson`], which turns every way a body can be wrong into
//! a problem+json answer (see [`crate::problem`] for the status table).

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use reservoir_core::{Command, OperationId, PartitionKey, Policy, RequestDigest, ReservationId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::{OpenApi, ToSchema};

pub use crate::app::AppState;
use crate::problem::{ApiError, Problem};
use crate::sizing::EstimatorBody;
pub use crate::views::PartitionKeyView;
use crate::views::{LogPosition, PartitionView, Receipt};
use crate::writer::{Amount, Answer, Request, Writers};

/// The router, with the body limit applied to every route.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/policies", post(publish_policy))
        .route("/v1/policies/{subject}/{route}", get(get_policy))
        .route(
            "/v1/policies/{subject}/{route}/rollback",
            post(rollback_policy),
        )
        .route("/v1/reservations", post(reserve))
        .route("/v1/reservations/{id}", get(get_reservation))
        .route("/v1/reservations/{id}/start", post(start))
        .route("/v1/reservations/{id}/settle", post(settle))
        .route("/v1/reservations/{id}/release", post(release))
        .route("/v1/partitions", get(list_partitions))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/openapi.json", get(openapi_json))
        .merge(crate::queries::routes())
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such resource")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this resource",
            )
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
            .into_response()
        }))
        .with_state(state)
}

// ---------------------------------------------------------------- bodies

/// A JSON body, read with the configured size limit. Empty bodies count as `{}`.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
            let json = ct.starts_with("application/json")
                || (ct.starts_with("application/") && ct.contains("+json"));
            if !json {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "send application/json",
                ));
            }
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "request body is above the size limit",
                )
            } else {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "malformed_json",
                    format!("cannot read body: {e}"),
                )
            }
        })?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(ApiJson)
            .map_err(|e| match e.classify() {
                serde_json::error::Category::Data => ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    e.to_string(),
                ),
                _ => ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", e.to_string()),
            })
    }
}

/// `POST /v1/policies`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishPolicy {
    /// Accounting window the new partition belongs to, e.g. `2026-11`.
    #[schema(example = "2026-11")]
    pub accounting_epoch: String,
    #[schema(value_type = PolicyDoc)]
    pub policy: Policy,
    /// How reserves without `units` are sized on this route (or give it as
    /// `policy.estimator`). Absent: the defaults, written into the policy.
    /// Its digest becomes the policy's `estimator_digest` (give that empty or
    /// equal).
    #[serde(default)]
    pub estimator: Option<EstimatorBody>,
    /// Counted input tokens of a typical request on the route (default 500
    /// when an estimator is given). The publish is refused (422
    /// `cold_route_never_warms`) when a cold route's reserve for it is above
    /// what some dimension admits, since then no sized reserve is ever
    /// admitted and the route never warms. Not checked for the default
    /// estimator unless given.
    #[serde(default)]
    pub typical_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct PublishedPolicy {
    pub partition_key: PartitionKeyView,
    /// Where the partition was opened (absent only for a re-publish of a partition
    /// opened before this process kept positions, which cannot happen today).
    pub log_position: Option<LogPosition>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
pub struct ActivePolicy {
    pub partition_key: PartitionKeyView,
    pub accounting_epoch: String,
    #[schema(value_type = PolicyDoc)]
    pub policy: Policy,
    /// The estimator settings the route is sized with (the policy's own;
    /// for a policy logged before they were, those stored on this node under
    /// its `estimator_digest`; absent: the defaults).
    pub estimator: Option<EstimatorBody>,
}

/// `POST /v1/reservations`. The id may come from the `Idempotency-Key` header instead.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveBody {
    #[schema(example = "rl-01J8Z")]
    pub id: Option<String>,
    #[schema(example = "tenant-7")]
    pub subject: String,
    #[schema(example = "chat.generate")]
    pub route: String,
    /// Units to reserve. Absent: the server sizes the reservation from
    /// `counted_input_tokens` and `max_tokens` (see the route's estimator).
    #[schema(example = 600)]
    pub units: Option<u64>,
    /// Input tokens the gateway counted (required when `units` is absent).
    pub counted_input_tokens: Option<u64>,
    /// The request's output limit, when it sets one (only without `units`).
    pub max_tokens: Option<u64>,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    pub operation_id: String,
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettleBody {
    /// Units used in the primary dimension. Absent: derived from `usage` (as
    /// every further dimension's are): requests 1, input the reported input
    /// (plus cache reads unless the policy excludes them), output the
    /// reported output, tokens their sum.
    pub actual_units: Option<u64>,
    /// Required to resolve USAGE_UNKNOWN (the operation receipt); else optional.
    pub operation_id: Option<String>,
    /// What the call used, as counted and reported. Recorded in the `Settled`
    /// event for the projections (route estimates, input drift); the ledger
    /// moves `actual_units` only.
    pub usage: Option<UsageBody>,
}

/// The usage breakdown of a settle; every part optional.
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageBody {
    /// Model id (1..128 bytes of `[A-Za-z0-9._:/@-]`).
    #[schema(example = "claude-sonnet-4")]
    pub model: Option<String>,
    /// Output tokens the provider reported.
    pub output_tokens: Option<u64>,
    /// Input tokens the gateway counted before the call.
    pub counted_input_tokens: Option<u64>,
    /// Input tokens the provider reported (cache reads not included).
    pub reported_input_tokens: Option<u64>,
    /// Input tokens the provider read from its prompt cache.
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
}

impl From<UsageBody> for reservoir_core::Usage {
    fn from(u: UsageBody) -> Self {
        reservoir_core::Usage {
            cache_read_input_tokens: u.cache_read_input_tokens,
            model: u.model,
            output_tokens: u.output_tokens,
            counted_input_tokens: u.counted_input_tokens,
            reported_input_tokens: u.reported_input_tokens,
        }
    }
}

#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {}

/// Documentation mirror of `reservoir_core::Policy` (`admissionBudget.v1`); a test
/// checks that its fields are exactly the core type's serde fields.
#[allow(dead_code)]
#[derive(ToSchema)]
pub struct PolicyDoc {
    subject: String,
    route: String,
    region: String,
    capacity_unit: CapacityUnitDoc,
    refill: RefillRuleDoc,
    burst_units: u64,
    opening_units: u64,
    estimator_digest: String,
    max_reservation_units: u64,
    hold_ttl_ms: u64,
    hard_execution_limit_ms: u64,
    max_overdraft_units: u64,
    priority: u32,
    emergency_mode: EmergencyModeDoc,
    shadow_mode: bool,
    generation: u64,
    /// Optional (default 600000 = 10 minutes): how long a finished
    /// reservation's record stays in memory; retries after it are answered
    /// from the on-disk idempotency index.
    idempotency_window_ms: Option<u64>,
    /// Optional: further dimensions limited beside the primary one
    /// (`capacity_unit` and the fields above), each with its own bucket; one
    /// reservation holds in all of them at once.
    dimensions: Option<Vec<DimensionLimitDoc>>,
    /// Optional (default false): leave cache-read input tokens out of the
    /// input dimensions at settle.
    exclude_cache_read_input_tokens: Option<bool>,
    /// Optional: how reserves without units are sized (the publish writes
    /// the defaults in when none is given), in the log with the policy.
    estimator: Option<EstimatorBody>,
    /// Optional (default `none`): `hourly`, `daily` or `monthly` (UTC) to have
    /// the writer open the next accounting epoch's partition at each boundary
    /// and move capacity and debt into it.
    epoch_length: Option<EpochLengthDoc>,
}

#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum EpochLengthDoc {
    None,
    Hourly,
    Daily,
    Monthly,
}

#[allow(dead_code)]
#[derive(ToSchema)]
pub struct DimensionLimitDoc {
    /// `requests`, `input_tokens`, `output_tokens` or `tokens` (each at most
    /// once per policy, and not the primary's).
    dimension: String,
    refill: RefillRuleDoc,
    burst_units: u64,
    opening_units: u64,
    max_reservation_units: u64,
    max_overdraft_units: u64,
}

#[allow(dead_code)]
#[derive(ToSchema)]
pub struct RefillRuleDoc {
    units: u64,
    interval_ms: u64,
}

#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum CapacityUnitDoc {
    Tokens,
    Requests,
}

#[allow(dead_code)]
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum EmergencyModeDoc {
    Disabled,
    Enabled,
}

/// sha256 over the canonical request: a version tag and subject, route and units
/// separated by newlines (none can contain one: ids are `[A-Za-z0-9._:/@-]`).
pub fn request_digest(subject: &str, route: &str, units: u64) -> RequestDigest {
    let canonical = format!("reservoir.reserve.v1\n{subject}\n{route}\n{units}");
    RequestDigest(Sha256::digest(canonical.as_bytes()).into())
}

fn reservation_id(raw: &str) -> Result<ReservationId, ApiError> {
    ReservationId::new(raw).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_id",
            e.to_string(),
        )
    })
}

fn path_id(path: Result<Path<String>, PathRejection>) -> Result<ReservationId, ApiError> {
    let Path(raw) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()))?;
    reservation_id(&raw)
}

fn receipt_response(answer: Answer) -> Result<Response, ApiError> {
    match answer {
        Answer::Reservation {
            key,
            reservation,
            position,
            created,
            limits,
        } => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let mut receipt = Receipt::new(&key, &reservation, position);
            if let Some(limits) = &limits {
                receipt.add_dimensions(&reservation, limits.dimensions());
            }
            let mut response = (status, Json(receipt)).into_response();
            if let Some(limits) = limits {
                limits.write_headers(response.headers_mut());
            }
            Ok(response)
        }
        other => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected answer {other:?}"),
        )),
    }
}

// ---------------------------------------------------------------- handlers

/// Publish a policy generation; it becomes the active one for its subject and route.
#[utoipa::path(post, path = "/v1/policies", request_body = PublishPolicy,
    responses(
        (status = 201, description = "Partition opened under the policy", body = PublishedPolicy),
        (status = 200, description = "Already published with the same policy", body = PublishedPolicy),
        (status = 409, description = "Partition exists with a different policy", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid policy", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn publish_policy(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<PublishPolicy>,
) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let mut body = body;
    settle_sizing(&mut body)?;
    let p = &body.policy;
    let key = PartitionKey::new(
        p.subject.clone(),
        p.route.clone(),
        body.accounting_epoch.clone(),
        p.generation,
    )
    .map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            e.to_string(),
        )
    })?;
    let shard = writers.shard_of_key(&key);
    match writers
        .call(
            shard,
            Request::Publish {
                key,
                policy: body.policy,
            },
        )
        .await?
    {
        Answer::Published {
            key,
            created,
            position,
        } => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok((
                status,
                Json(PublishedPolicy {
                    partition_key: (&key).into(),
                    log_position: position.map(LogPosition::from),
                }),
            )
                .into_response())
        }
        other => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected answer {other:?}"),
        )),
    }
}

/// `POST /v1/policies/{subject}/{route}/rollback`.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    /// The generation the rollback creates (above every one so far); by
    /// default the active one + 1. Naming it makes a retried rollback
    /// idempotent: once that generation runs, the same call answers 200.
    #[serde(default)]
    pub generation: Option<u64>,
}

/// Roll back: the generation below the active one runs again, as a new,
/// higher generation (generations only increase). The rolled-back partition
/// stops admitting, moves its capacity and debt into the new one, and keeps
/// settling, releasing and expiring its reservations until it is drained.
#[utoipa::path(post, path = "/v1/policies/{subject}/{route}/rollback", request_body = RollbackBody,
    params(("subject" = String, Path), ("route" = String, Path, description = "percent-encode any `/`")),
    responses(
        (status = 201, description = "The earlier policy runs as the new generation", body = PublishedPolicy),
        (status = 200, description = "That rollback already ran", body = PublishedPolicy),
        (status = 404, description = "No policy published", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Nothing to roll back to, or the generation is not above the active one", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn rollback_policy(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(body): ApiJson<RollbackBody>,
) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let Path((subject, route)) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()))?;
    let shard = reservoir_core::PartitionKey::new(subject.clone(), route.clone(), "e", 0)
        .map(|k| writers.shard_of_key(&k))
        .map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_input",
                e.to_string(),
            )
        })?;
    let request = Request::Rollback {
        subject,
        route,
        generation: body.generation,
    };
    match writers.call(shard, request).await? {
        Answer::Published {
            key,
            created,
            position,
        } => {
            let status = match created {
                true => StatusCode::CREATED,
                false => StatusCode::OK,
            };
            let body = PublishedPolicy {
                partition_key: (&key).into(),
                log_position: position.map(LogPosition::from),
            };
            Ok((status, Json(body)).into_response())
        }
        other => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected answer {other:?}"),
        )),
    }
}

/// The active policy of a subject and route, with its accounting epoch.
#[utoipa::path(get, path = "/v1/policies/{subject}/{route}",
    params(("subject" = String, Path), ("route" = String, Path, description = "percent-encode any `/`")),
    responses(
        (status = 200, body = ActivePolicy),
        (status = 404, description = "No policy published", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_policy(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let Path((subject, route)) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()))?;
    let shard = reservoir_core::PartitionKey::new(subject.clone(), route.clone(), "e", 0)
        .map(|k| writers.shard_of_key(&k))
        .map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_input",
                e.to_string(),
            )
        })?;
    match writers
        .call(shard, Request::GetPolicy { subject, route })
        .await?
    {
        Answer::Policy { key, policy } => Ok(Json(ActivePolicy {
            partition_key: (&key).into(),
            accounting_epoch: key.accounting_epoch.clone(),
            estimator: policy
                .estimator
                .as_ref()
                .map(|e| EstimatorBody::from(&**e))
                .or_else(|| state.estimators().get(&policy.estimator_digest)),
            policy: *policy,
        })
        .into_response()),
        other => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected answer {other:?}"),
        )),
    }
}

/// Reserve capacity. Idempotent on the id: the same id and body answer the same receipt.
#[utoipa::path(post, path = "/v1/reservations", request_body = ReserveBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "the reservation id, if not in the body")),
    responses(
        (status = 201, description = "Reserved", body = Receipt),
        (status = 200, description = "A retry: the original receipt", body = Receipt),
        (status = 429, description = "Limit refusal; see Retry-After", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "seconds, rounded up"))),
        (status = 422, description = "Request too large for the policy, same id with another request, or invalid input", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No policy for the subject and route", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Log unavailable: retry with the same id", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn reserve(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ReserveBody>,
) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let header_id = match headers.get("idempotency-key") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| {
                    ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "invalid_id",
                        "Idempotency-Key is not ASCII",
                    )
                })?
                .to_string(),
        ),
        None => None,
    };
    let raw_id = match (body.id, header_id) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_id",
                "body id and Idempotency-Key differ",
            ));
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_id",
                "give an id or an Idempotency-Key",
            ));
        }
    };
    let id = reservation_id(&raw_id)?;
    let key = PartitionKey::new(body.subject.clone(), body.route.clone(), "e", 0).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            e.to_string(),
        )
    })?;
    let shard = match writers.locate(&id).map_err(ApiError::unavailable)? {
        Some(existing) => writers.shard_of_key(&existing),
        None => writers.shard_of_key(&key),
    };
    let (digest, amount) = match (body.units, body.counted_input_tokens, body.max_tokens) {
        (Some(units), None, None) => (
            request_digest(&body.subject, &body.route, units),
            Amount::Units(units),
        ),
        (Some(_), ..) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                "give units, or counted_input_tokens (and max_tokens) to have the server size the reservation, not both",
            ));
        }
        (None, None, _) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                "give units, or counted_input_tokens to have the server size the reservation",
            ));
        }
        // Sized by the shard against the policy it decides with (see `crate::sizing`).
        (None, Some(counted_input_tokens), max_tokens) => (
            crate::sizing::sized_request_digest(
                &body.subject,
                &body.route,
                counted_input_tokens,
                max_tokens,
            ),
            Amount::Sized {
                counted_input_tokens,
                max_tokens,
            },
        ),
    };
    let request = Request::Reserve {
        subject: body.subject,
        route: body.route,
        id,
        digest,
        amount,
    };
    receipt_response(writers.call(shard, request).await?)
}

/// Fixes the sizing settings of a publish into its policy (so they are in
/// the log): the stated estimator (top level or `policy.estimator`, which
/// must agree), else the defaults; its digest as `estimator_digest`. Refuses
/// settings under which a cold route's reserve for a typical input is never
/// admissible (see [`PublishPolicy::typical_input_tokens`]).
fn settle_sizing(body: &mut PublishPolicy) -> Result<(), ApiError> {
    let invalid =
        |detail: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", detail);
    // The policy's own problems first: the defaults are derived from it.
    body.policy.validate().map_err(|e| invalid(e.to_string()))?;
    let stated = body.estimator.as_ref().map(EstimatorBody::config);
    let estimator = match (stated, body.policy.estimator.take()) {
        (Some(top), Some(inner)) if top != *inner => {
            return Err(invalid(
                "estimator and policy.estimator differ (give one of them)".to_string(),
            ))
        }
        (Some(config), _) => Some(config),
        (None, Some(config)) => Some(*config),
        (None, None) => None,
    };
    let checked = estimator.is_some() || body.typical_input_tokens.is_some();
    if estimator.is_none() && !body.policy.estimator_digest.is_empty() {
        return Err(invalid(
            "policy.estimator_digest names settings the publish does not carry: give the estimator itself".to_string(),
        ));
    }
    let estimator = estimator.unwrap_or_else(|| reservoir_core::default_estimator(&body.policy));
    estimator.validate().map_err(|e| invalid(e.to_string()))?;
    let digest = EstimatorBody::from(&estimator).digest();
    if !body.policy.estimator_digest.is_empty() && body.policy.estimator_digest != digest {
        return Err(invalid(format!(
            "policy.estimator_digest is not the estimator's digest {digest} (leave it empty)"
        )));
    }
    if checked {
        let typical = body
            .typical_input_tokens
            .unwrap_or(reservoir_core::cold::DEFAULT_TYPICAL_INPUT_TOKENS);
        match reservoir_core::check_cold_reservation(&body.policy, &estimator, typical) {
            Ok(_) => {}
            Err(reservoir_core::ColdCheck::Invalid(e)) => {
                return Err(invalid(format!("typical_input_tokens: {e}")))
            }
            Err(reservoir_core::ColdCheck::NeverWarms(never)) => {
                let mut error = ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "cold_route_never_warms",
                    never.to_string(),
                );
                error.problem.limiting_dimension = Some(never.dimension.name().to_string());
                return Err(error);
            }
        }
    }
    body.policy.estimator = Some(Box::new(estimator));
    body.policy.estimator_digest = digest;
    Ok(())
}

/// The partition holding reservation `id` and its writer shard, or a 404.
fn locate(writers: &Writers, id: &ReservationId) -> Result<(PartitionKey, usize), ApiError> {
    let key = writers
        .locate(id)
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_reservation",
                format!("unknown reservation {id}"),
            )
        })?;
    let shard = writers.shard_of_key(&key);
    Ok((key, shard))
}

async fn act(
    state: &AppState,
    id: ReservationId,
    command: impl FnOnce(ReservationId) -> Command,
) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let (key, shard) = locate(&writers, &id)?;
    receipt_response(
        writers
            .call(
                shard,
                Request::Act {
                    key,
                    command: command(id),
                },
            )
            .await?,
    )
}

fn operation_id(raw: &str) -> Result<OperationId, ApiError> {
    OperationId::new(raw).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_id",
            e.to_string(),
        )
    })
}

/// RESERVED → STARTED, binding the operation id (idempotent for the same one).
#[utoipa::path(post, path = "/v1/reservations/{id}/start", request_body = StartBody, params(("id" = String, Path)),
    responses(
        (status = 200, body = Receipt),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Wrong state, lease expired, or another operation id", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn start(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    ApiJson(body): ApiJson<StartBody>,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    let operation_id = operation_id(&body.operation_id)?;
    act(&state, id, |id| Command::Start { id, operation_id }).await
}

/// Settle with the actual usage; the unused difference goes back, any excess becomes debt.
#[utoipa::path(post, path = "/v1/reservations/{id}/settle", request_body = SettleBody, params(("id" = String, Path)),
    responses(
        (status = 200, body = Receipt),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
        (status = 422, body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn settle(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    ApiJson(body): ApiJson<SettleBody>,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    let operation_id = body.operation_id.as_deref().map(operation_id).transpose()?;
    let usage = body.usage.map(reservoir_core::Usage::from);
    let writers = state.writers()?;
    let (key, shard) = locate(&writers, &id)?;
    let request = Request::Settle {
        key,
        id,
        operation_id,
        actual_units: body.actual_units,
        usage,
    };
    receipt_response(writers.call(shard, request).await?)
}

/// Give back an unstarted reservation.
#[utoipa::path(post, path = "/v1/reservations/{id}/release", request_body = ReleaseBody, params(("id" = String, Path)),
    responses(
        (status = 200, body = Receipt),
        (status = 404, body = Problem, content_type = "application/problem+json"),
        (status = 409, body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn release(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    ApiJson(_body): ApiJson<ReleaseBody>,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    act(&state, id, |id| Command::Release { id }).await
}

/// The committed receipt: how a client whose reserve answer was lost resolves RESERVATION_UNKNOWN.
#[utoipa::path(get, path = "/v1/reservations/{id}", params(("id" = String, Path)),
    responses(
        (status = 200, body = Receipt),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_reservation(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    let writers = state.writers()?;
    let (key, shard) = locate(&writers, &id)?;
    receipt_response(writers.call(shard, Request::Get { key, id }).await?)
}

/// Every partition's conservation terms and invariant check (operators, tests).
#[utoipa::path(get, path = "/v1/partitions", responses((status = 200, body = Vec<PartitionView>)))]
pub async fn list_partitions(State(state): State<AppState>) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let mut all = Vec::new();
    for shard in 0..writers.shards() {
        match writers.call(shard, Request::Partitions).await? {
            Answer::Partitions(statuses) => all.extend(statuses.iter().map(PartitionView::from)),
            other => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("unexpected answer {other:?}"),
                ));
            }
        }
    }
    all.sort_by(|a, b| {
        (
            &a.subject,
            &a.route,
            &a.accounting_epoch,
            a.policy_generation,
        )
            .cmp(&(
                &b.subject,
                &b.route,
                &b.accounting_epoch,
                b.policy_generation,
            ))
    });
    Ok(Json(all).into_response())
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "alive")))]
pub async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({"status": "ok"}))
}

/// Readiness: 200 only after recovery from the log finished.
#[utoipa::path(get, path = "/readyz", responses(
    (status = 200, description = "ready"),
    (status = 503, description = "recovering", body = Problem, content_type = "application/problem+json")))]
pub async fn readyz(State(state): State<AppState>) -> Result<Response, ApiError> {
    state.writers()?;
    Ok(Json(serde_json::json!({"status": "ready"})).into_response())
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics().render(),
    )
}

async fn openapi_json() -> impl IntoResponse {
    let mut doc = ApiDoc::openapi();
    doc.merge(crate::queries::QueriesDoc::openapi());
    Json(doc)
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Reservoir",
        description = "Event-sourced capacity ledger for LLM rate limits. Errors are RFC 9457 application/problem+json."
    ),
    paths(
        publish_policy,
        get_policy,
        rollback_policy,
        reserve,
        start,
        settle,
        release,
        get_reservation,
        list_partitions,
        healthz,
        readyz,
        metrics_text
    ),
    components(schemas(
        Receipt,
        crate::views::SizingReceipt,
        LogPosition,
        Problem,
        ReserveBody,
        StartBody,
        SettleBody,
        UsageBody,
        EstimatorBody,
        ReleaseBody,
        PublishPolicy,
        PublishedPolicy,
        RollbackBody,
        ActivePolicy,
        PartitionKeyView,
        PolicyDoc,
        RefillRuleDoc,
        CapacityUnitDoc,
        EmergencyModeDoc,
        EpochLengthDoc,
        PartitionView
    ))
)]
pub struct ApiDoc;
