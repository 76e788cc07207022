//! The HTTP API (axum) and its OpenAPI 3 description, generated from the code
//! below by `utoipa` and served at `/openapi.json`.
//!
//! Handlers validate and translate; they never decide. Each write becomes one
//! [`Request`] to the shard that owns the partition, and the answer comes back
//! only after the writer's batch is durable in the log, carrying its position.
//! Bodies are read by [`ApiJson`], which turns every way a body can be wrong into
//! a problem+json answer (see [`crate::problem`] for the status table).

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use reservoir_core::{Command, OperationId, PartitionKey, RequestDigest, ReservationId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::{OpenApi, ToSchema};

pub use crate::app::AppState;
use crate::auth::{self, authenticate, require, Auth, Principal, GATEWAY, OPERATOR, SUBJECT_READ};
use crate::problem::{ApiError, Problem};
use crate::sizing::EstimatorBody;
pub use crate::views::PartitionKeyView;
use crate::views::{LogPosition, PartitionView, Receipt};
use crate::writer::{Amount, Answer, Request, Writers};

/// The router, with the body limit applied to every route, each route
/// granted to the scopes beside it (see [`crate::auth`]).
pub fn router(state: AppState, max_body_bytes: usize, auth: Arc<Auth>) -> Router {
    let metrics_public = auth.metrics_public();
    let metrics = match metrics_public {
        true => get(metrics_text),
        false => require(auth::METRICS, get(metrics_text)),
    };
    Router::new()
        .route("/v1/policies", require(OPERATOR, post(publish_policy)))
        .route(
            "/v1/policies/{subject}/{route}",
            require(SUBJECT_READ, get(get_policy)),
        )
        .route(
            "/v1/policies/{subject}/{route}/rollback",
            require(OPERATOR, post(rollback_policy)),
        )
        .route("/v1/reservations", require(GATEWAY, post(reserve)))
        .route(
            "/v1/reservations/{id}",
            require(SUBJECT_READ, get(get_reservation)),
        )
        .route("/v1/reservations/{id}/start", require(GATEWAY, post(start)))
        .route(
            "/v1/reservations/{id}/settle",
            require(GATEWAY, post(settle)),
        )
        .route(
            "/v1/reservations/{id}/release",
            require(GATEWAY, post(release)),
        )
        .route("/v1/partitions", require(OPERATOR, get(list_partitions)))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", metrics)
        .route("/openapi.json", get(move || openapi_json(metrics_public)))
        .merge(crate::queries::routes())
        .merge(crate::shards::http::routes(max_body_bytes))
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such resource")
        })
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(auth, authenticate))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
        .with_state(state)
}

/// A method the resource does not take: 405 as a problem.
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this resource",
    )
}

/// What a panic in a handler answers (through `CatchPanicLayer`): a 500
/// problem, not a dropped connection.
pub fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error",
    )
    .into_response()
}

pub use crate::bodies::*;

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

/// A `{subject}/{route}` path, checked, and the writer shard that owns it.
fn subject_route_shard(
    writers: &Writers,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(String, String, usize), ApiError> {
    let Path((subject, route)) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()))?;
    let key = PartitionKey::new(subject.clone(), route.clone(), "e", 0).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            e.to_string(),
        )
    })?;
    let shard = writers.shard_of_key(&key);
    Ok((subject, route, shard))
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
            let mut response = receipt_body(status, &receipt)?;
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

/// Room for a receipt's JSON: in the server's tests a one-dimension receipt
/// is 288 bytes and a three-dimension one 609.
const RECEIPT_JSON_BYTES: usize = 1_024;

/// A receipt as `application/json`, written into one buffer sized for it
/// (axum's `Json` starts at 128 bytes and doubles: two or three reallocations
/// and copies per answer on the hottest path).
fn receipt_body(status: StatusCode, receipt: &Receipt) -> Result<Response, ApiError> {
    let mut body = Vec::with_capacity(RECEIPT_JSON_BYTES);
    serde_json::to_writer(&mut body, receipt).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the receipt could not be written as JSON: {e}"),
        )
    })?;
    let json = header::HeaderValue::from_static("application/json");
    Ok((status, [(header::CONTENT_TYPE, json)], body).into_response())
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
    let shard = writers.shard_of(&body.policy.subject, &body.policy.route);
    match writers
        .call(
            shard,
            Request::Publish {
                accounting_epoch: body.accounting_epoch,
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
    /// Without it, a call while the active generation already runs the
    /// policy of the one below the one it replaced (a rollback's result)
    /// is taken for that rollback asked again and answers 200: to roll
    /// back a rollback, name the generation.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 9_007_199_254_740_992_u64)]
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
        (status = 409, description = "Nothing to roll back to, the generation is not above the active one, or the active one is the highest there may be (generation_exhausted)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn rollback_policy(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(body): ApiJson<RollbackBody>,
) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let (subject, route, shard) = subject_route_shard(&writers, path)?;
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
    let (subject, route, shard) = subject_route_shard(&writers, path)?;
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
    principal: Principal,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ReserveBody>,
) -> Result<Response, ApiError> {
    principal.require_subject(GATEWAY, &body.subject)?;
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
        // Another subject's id: refused here, so its partition's numbers
        // (the rate-limit headers of its refusal) never reach this caller.
        Some(existing) if !principal.sees(&existing.subject) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "exists_with_different_digest",
                reservoir_core::Rejection::ExistsWithDifferentDigest { id }.to_string(),
            ));
        }
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

/// The partition holding reservation `id` and its writer shard, or a 404,
/// the same 404 where the reservation is another subject's than `principal`'s.
fn locate(
    writers: &Writers,
    id: &ReservationId,
    principal: &Principal,
) -> Result<(PartitionKey, usize), ApiError> {
    let key = writers
        .locate(id)
        .map_err(ApiError::unavailable)?
        .filter(|key| principal.sees(&key.subject))
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
    principal: &Principal,
    id: ReservationId,
    command: impl FnOnce(ReservationId) -> Command,
) -> Result<Response, ApiError> {
    let writers = state.writers()?;
    let (key, shard) = locate(&writers, &id, principal)?;
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
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    ApiJson(body): ApiJson<StartBody>,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    let operation_id = operation_id(&body.operation_id)?;
    act(&state, &principal, id, |id| Command::Start {
        id,
        operation_id,
    })
    .await
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
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    ApiJson(body): ApiJson<SettleBody>,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    let operation_id = body.operation_id.as_deref().map(operation_id).transpose()?;
    let usage = body.usage.map(reservoir_core::Usage::from);
    let writers = state.writers()?;
    let (key, shard) = locate(&writers, &id, &principal)?;
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
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
    ApiJson(_body): ApiJson<ReleaseBody>,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    act(&state, &principal, id, |id| Command::Release { id }).await
}

/// The committed receipt: how a client whose reserve answer was lost resolves RESERVATION_UNKNOWN.
#[utoipa::path(get, path = "/v1/reservations/{id}", params(("id" = String, Path)),
    responses(
        (status = 200, body = Receipt),
        (status = 404, body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_reservation(
    State(state): State<AppState>,
    principal: Principal,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_id(path)?;
    let writers = state.writers()?;
    let (key, shard) = locate(&writers, &id, &principal)?;
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
        crate::telemetry::render(state.metrics()),
    )
}

async fn openapi_json(metrics_public: bool) -> impl IntoResponse {
    Json(crate::openapi::document(metrics_public))
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Reservoir",
        description = "Event-sourced capacity ledger for LLM rate limits. Errors are RFC 9457 application/problem+json. Callers send `Authorization: Bearer <token>`; each operation's `security` names the scopes that grant it (gateway and tenant-read reach only the token's subjects). Integers are written without a fraction part (`759`, not `759.0`). Rules across fields (opening_units at most burst_units, an estimator's floor at most its ceiling, a reconcile's path and body naming one shard) are the server's: a body that breaks one is 422 with the rule in `detail`."
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
        RolloutDoc,
        PartitionView
    ))
)]
pub struct ApiDoc;
