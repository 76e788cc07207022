//! The HTTP API's request and response bodies, and the documentation mirror
//! of the core's policy (`admissionBudget.v1`) for the OpenAPI document: the
//! shapes the handlers in [`crate::api`] read and write.

use axum::body::Bytes;
use axum::extract::FromRequest;
use axum::http::{header, StatusCode};
use reservoir_core::Policy;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::problem::ApiError;
use crate::sizing::EstimatorBody;
use crate::views::{LogPosition, PartitionKeyView};

mod numbers;
// ---------------------------------------------------------------- bodies

/// A JSON body, read with the configured size limit. Empty bodies count as
/// `{}`; integral numbers written as `600.0` or `1e3` count as integers.
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
        let refused = match serde_json::from_slice(bytes) {
            Ok(body) => return Ok(ApiJson(body)),
            Err(e) => e,
        };
        // A well-formed body of the wrong shape: it may be `600.0` where an
        // integer belongs, which the schema allows (see [`numbers`]).
        let rewritten = match refused.classify() {
            serde_json::error::Category::Data => numbers::integral_as_integers(bytes),
            _ => None,
        };
        match rewritten {
            Some(body) => serde_json::from_slice(&body)
                .map(ApiJson)
                .map_err(body_error),
            None => Err(body_error(refused)),
        }
    }
}

fn body_error(e: serde_json::Error) -> ApiError {
    match e.classify() {
        serde_json::error::Category::Data => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            e.to_string(),
        ),
        _ => ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", e.to_string()),
    }
}

/// `POST /v1/policies`.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishPolicy {
    /// Accounting window the new partition belongs to, e.g. `2026-11`.
    /// Required unless `policy.epoch_length` is hourly, daily or monthly:
    /// then the writer names the current epoch (a name given must be it).
    #[schema(example = "2026-11")]
    #[serde(default)]
    pub accounting_epoch: Option<String>,
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
    #[schema(min_length = 1, max_length = 128)]
    region: String,
    capacity_unit: CapacityUnitDoc,
    refill: RefillRuleDoc,
    #[schema(minimum = 1, maximum = 9_007_199_254_740_992_u64)]
    burst_units: u64,
    /// At most `burst_units`.
    #[schema(maximum = 9_007_199_254_740_992_u64)]
    opening_units: u64,
    #[schema(max_length = 256)]
    estimator_digest: String,
    #[schema(minimum = 1, maximum = 9_007_199_254_740_992_u64)]
    max_reservation_units: u64,
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    hold_ttl_ms: u64,
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    hard_execution_limit_ms: u64,
    #[schema(maximum = 9_007_199_254_740_992_u64)]
    max_overdraft_units: u64,
    #[schema(maximum = 4_294_967_295_u64)]
    priority: u32,
    emergency_mode: EmergencyModeDoc,
    shadow_mode: bool,
    #[schema(maximum = 9_007_199_254_740_992_u64)]
    generation: u64,
    /// Optional (default 600000 = 10 minutes): how long a finished
    /// reservation's record stays in memory; retries after it are answered
    /// from the on-disk idempotency index.
    #[schema(required = false, minimum = 1, maximum = 2_592_000_000_u64)]
    idempotency_window_ms: u64,
    /// Optional: further dimensions limited beside the primary one
    /// (`capacity_unit` and the fields above), each with its own bucket; one
    /// reservation holds in all of them at once.
    #[schema(required = false, max_items = 3)]
    dimensions: Vec<DimensionLimitDoc>,
    /// Optional (default false): leave cache-read input tokens out of the
    /// input dimensions at settle.
    #[schema(required = false)]
    exclude_cache_read_input_tokens: bool,
    /// Optional: how reserves without units are sized (the publish writes
    /// the defaults in when none is given), in the log with the policy.
    estimator: Option<EstimatorBody>,
    /// Optional (default `none`): `hourly`, `daily` or `monthly` (UTC) to have
    /// the writer open the next accounting epoch's partition at each boundary
    /// and move capacity and debt into it.
    #[schema(required = false)]
    epoch_length: EpochLengthDoc,
    /// Optional: staged rollout. Unless `shadow_mode`, the policy enforces
    /// on its route only if FNV-1a-64(salt, newline, route) mod 1,000,000 is
    /// below `enforced_per_million`, and runs in shadow otherwise (receipts
    /// say `mode`); raising the fraction only adds routes.
    rollout: Option<RolloutDoc>,
}

#[allow(dead_code)]
#[derive(ToSchema)]
pub struct RolloutDoc {
    /// Routes enforced, in parts per million (0 to 1,000,000).
    #[schema(maximum = 1_000_000)]
    enforced_per_million: u32,
    /// Chooses which routes; the same salt keeps the same routes enforced.
    #[schema(max_length = 128)]
    salt: String,
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
    #[schema(pattern = "^(requests|input_tokens|output_tokens|tokens)$")]
    dimension: String,
    refill: RefillRuleDoc,
    #[schema(minimum = 1, maximum = 9_007_199_254_740_992_u64)]
    burst_units: u64,
    /// At most `burst_units`.
    #[schema(maximum = 9_007_199_254_740_992_u64)]
    opening_units: u64,
    #[schema(minimum = 1, maximum = 9_007_199_254_740_992_u64)]
    max_reservation_units: u64,
    #[schema(maximum = 9_007_199_254_740_992_u64)]
    max_overdraft_units: u64,
}

#[allow(dead_code)]
#[derive(ToSchema)]
pub struct RefillRuleDoc {
    #[schema(maximum = 9_007_199_254_740_992_u64)]
    units: u64,
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
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
