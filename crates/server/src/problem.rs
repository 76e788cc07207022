//! RFC 9457 problem details: every error answer is `application/problem+json`
//! with a stable `type` URI per code, `title`, `status` and `detail`.
//!
//! Status choices (one row per code, the contract on one screen):
//!
//! | code | status | note |
//! | --- | --- | --- |
//! | `insufficient_capacity`, `debt_outstanding` | 429 | `Retry-After` (s, rounded up), `policy_generation`, `limiting_dimension` |
//! | `open_reservations_limit` | 429 | a million reservations hold capacity in the partition; `Retry-After` = the hold TTL (by then every unstarted one is settled, released or expired) |
//! | `request_too_large` | 422 | never admissible under this policy: retrying cannot help, so not 429 |
//! | `exists_with_different_digest` | 422 | same id, other request |
//! | `cold_route_never_warms` | 422 | a publish whose cold reserve for a typical input no dimension admits; `limiting_dimension` names the one |
//! | `invalid_input`, `invalid_request`, `invalid_id` | 422 | well-formed JSON with bad values or unknown fields |
//! | `malformed_json` | 400 | not JSON at all |
//! | `payload_too_large` | 413 | body above the configured limit (64 KiB by default) |
//! | `unknown_reservation`, `no_policy`, `partition_not_open`, `not_found` | 404 | |
//! | `wrong_state`, `exists_with_different_*`, `lease_expired`, `not_yet_due`, `generation_closed`, `partition_exists_with_different_policy`, `limit_reached`, ... | 409 | |
//! | `unavailable`, `not_ready` | 503 | retry with the same id; `Retry-After: 1` |
//! | `internal` | 500 | a bug; the batch was not appended |
//!
//! A limit refusal names only the caller's own partition: no balance of anyone
//! else, not even the caller's own available units.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use reservoir_core::{CapacityUnit, Rejection};
use serde::{Deserialize, Serialize};

use crate::sizing::SizingFailure;
use crate::writer::Failure;

pub const PROBLEM_BASE: &str = "https://reservoir.dev/problems/";

#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    #[schema(example = "https://reservoir.dev/problems/insufficient_capacity")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The policy generation the refusal was decided under (limit refusals).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_generation: Option<u64>,
    /// What ran out: the refusing dimension (`requests`, `input_tokens`,
    /// `output_tokens` or `tokens`; for a one-dimension policy, its capacity unit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limiting_dimension: Option<String>,
    /// Same as the `Retry-After` header, in ms before rounding (limit refusals).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Whether the same request may succeed later.
    pub retryable: bool,
}

/// An error answer: the problem body plus its `Retry-After`, if any.
#[derive(Debug)]
pub struct ApiError {
    pub problem: Box<Problem>,
    pub retry_after_s: Option<u64>,
    /// The caller's own partition, for the rate-limit headers of a refusal.
    pub limits: Option<Box<crate::ratelimit::RateLimits>>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Self {
        ApiError {
            problem: Box::new(Problem {
                problem_type: format!("{PROBLEM_BASE}{code}"),
                title: title(code),
                status: status.as_u16(),
                detail: detail.into(),
                policy_generation: None,
                limiting_dimension: None,
                retry_after_ms: None,
                retryable: status == StatusCode::TOO_MANY_REQUESTS
                    || status == StatusCode::SERVICE_UNAVAILABLE,
            }),
            retry_after_s: None,
            limits: None,
        }
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail);
        e.retry_after_s = Some(1);
        e
    }

    pub fn code(&self) -> &str {
        self.problem.problem_type.trim_start_matches(PROBLEM_BASE)
    }
}

fn title(code: &str) -> String {
    let mut t = code.replace('_', " ");
    if let Some(first) = t.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    t
}

pub fn capacity_unit_name(u: CapacityUnit) -> &'static str {
    match u {
        CapacityUnit::Tokens => "tokens",
        CapacityUnit::Requests => "requests",
    }
}

fn rejection_status(r: &Rejection) -> StatusCode {
    match r {
        Rejection::InsufficientCapacity { .. }
        | Rejection::DebtOutstanding { .. }
        | Rejection::OpenReservationsLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
        Rejection::RequestTooLarge { .. }
        | Rejection::ExistsWithDifferentDigest { .. }
        | Rejection::InvalidInput(_) => StatusCode::UNPROCESSABLE_ENTITY,
        Rejection::UnknownReservation { .. } | Rejection::PartitionNotOpen => StatusCode::NOT_FOUND,
        Rejection::WrongState { .. }
        | Rejection::ExistsWithDifferentOperationId { .. }
        | Rejection::ExistsWithDifferentActualUnits { .. }
        | Rejection::LeaseExpired { .. }
        | Rejection::NotYetDue { .. }
        | Rejection::GenerationClosed { .. }
        | Rejection::PartitionExistsWithDifferentPolicy
        | Rejection::LimitReached { .. }
        | Rejection::EmergencyDisabled
        | Rejection::ExistsWithDifferentFields => StatusCode::CONFLICT,
    }
}

impl From<Failure> for ApiError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Rejected {
                rejection,
                policy_generation,
                capacity_unit,
                limits,
            } => {
                let status = rejection_status(&rejection);
                let detail = match &rejection {
                    // Our own words: the core's message carries the available balance.
                    Rejection::InsufficientCapacity { requested_units, .. } => {
                        format!("not enough capacity for {requested_units} units now")
                    }
                    Rejection::DebtOutstanding { .. } => {
                        "admission is suspended until outstanding overdraft debt is repaid by refill".to_string()
                    }
                    other => other.to_string(),
                };
                let mut e = ApiError::new(status, rejection.code(), detail);
                let limit = matches!(rejection, Rejection::OpenReservationsLimit { .. });
                if rejection.is_admission_refusal() || limit {
                    e.problem.policy_generation = policy_generation;
                    e.problem.limiting_dimension = rejection
                        .dimension()
                        .map(|d| d.name().to_string())
                        .or(capacity_unit.map(|u| capacity_unit_name(u).to_string()));
                    e.limits = limits;
                    e.problem.retry_after_ms = rejection.retry_after_ms();
                    // Rounded up, and never 0: a conservative hint.
                    e.retry_after_s = rejection
                        .retry_after_ms()
                        .map(|ms| ms.div_ceil(1000).max(1));
                }
                e
            }
            Failure::NoPolicy => ApiError::new(
                StatusCode::NOT_FOUND,
                "no_policy",
                "no policy is published for this subject and route",
            ),
            Failure::Sizing(SizingFailure::EstimatorUnknown { digest }) => ApiError::new(
                StatusCode::CONFLICT,
                "estimator_unknown",
                format!(
                    "the policy's estimator {digest} is not stored on this node; publish the policy with its estimator again"
                ),
            ),
            Failure::Sizing(SizingFailure::Invalid(why)) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", why)
            }
            Failure::Conflict { code, detail } => ApiError::new(StatusCode::CONFLICT, code, detail),
            Failure::Invalid { code, detail } => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, detail)
            }
            Failure::Unavailable(why) => ApiError::unavailable(why),
            Failure::Internal(why) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", why)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        metrics::counter!("reservoir_rejections_total", "code" => self.code().to_string())
            .increment(1);
        let status =
            StatusCode::from_u16(self.problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(s) = self.retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(limits) = &self.limits {
            limits.write_headers(headers);
        }
        response
    }
}
