//! Reservation sizing in the command path: a reserve without `units` is sized
//! by `reservoir_core::size_reservation` as counted input × the route's drift
//! multiplier + an output estimate (`max_tokens`, else the route's default
//! `max_tokens`, else the route's digest at the estimator quantile clamped to
//! `[floor, ceiling]`, else — cold — a sibling route's warm estimate or the
//! ceiling). Drift and digests come from the projections ([`crate::queries`]),
//! as far as they have followed the log when the reserve arrives.
//!
//! The estimator settings are part of the published policy
//! (`Policy::estimator`, in the log): `POST /v1/policies` may carry an
//! `estimator` object, else the policy gets
//! [`reservoir_core::default_estimator`]'s settings written into it, so any
//! node — a restarted one, a Kafka failover, a second server on the same log —
//! sizes from the log alone. The canonical JSON's sha256 is still recorded as
//! `estimator_digest`. Policies logged before the settings moved into the log
//! name them by digest only; for those the node's
//! `<data-dir>/estimators/<hex>.json` (written by older versions) is read, and
//! a node without the file answers 409 `estimator_unknown`, as it did before.
//!
//! The request digest of a sized reserve covers its sizing inputs (counted
//! input and `max_tokens`), not the units they produced, so a retry with the
//! same id finds the original reservation even after the estimate moved.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use reservoir_core::sizing::PPM;
use reservoir_core::{EstimatorConfig, Policy, RequestDigest};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

/// Prefix of an `estimator_digest` this server computed.
pub const DIGEST_PREFIX: &str = "sha256:";
/// Directory of the stored estimator settings under `--data-dir`.
pub const ESTIMATORS_DIR: &str = "estimators";

/// The estimator settings of a route, on `POST /v1/policies` and in
/// `GET /v1/policies/{subject}/{route}`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EstimatorBody {
    /// Quantile of the route's output tokens to reserve at, in ppm (900000 = p90).
    #[schema(example = 900_000)]
    pub quantile_ppm: u64,
    pub floor_units: u64,
    /// Also what a cold route reserves for output.
    pub ceiling_units: u64,
    /// Settled samples the route needs before its own distribution is used.
    pub min_samples: u64,
    /// Output estimate when the request gives no `max_tokens` (skips the digest).
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
    /// A route whose warm estimate sizes this route while it is cold.
    #[serde(default)]
    pub sibling_route: Option<String>,
}

impl EstimatorBody {
    pub fn config(&self) -> EstimatorConfig {
        EstimatorConfig {
            quantile_ppm: self.quantile_ppm,
            floor_units: self.floor_units,
            ceiling_units: self.ceiling_units,
            min_samples: self.min_samples,
            default_max_tokens: self.default_max_tokens,
            sibling_route: self.sibling_route.clone(),
        }
    }

    /// `sha256:` and the hex sha256 of the canonical JSON (fields in
    /// declaration order, no whitespace).
    pub fn digest(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("estimator serializes");
        format!("{DIGEST_PREFIX}{}", hex::encode(Sha256::digest(&canonical)))
    }
}

impl From<&EstimatorConfig> for EstimatorBody {
    fn from(c: &EstimatorConfig) -> Self {
        EstimatorBody {
            quantile_ppm: c.quantile_ppm,
            floor_units: c.floor_units,
            ceiling_units: c.ceiling_units,
            min_samples: c.min_samples,
            default_max_tokens: c.default_max_tokens,
            sibling_route: c.sibling_route.clone(),
        }
    }
}

/// The settings a policy sizes with: its own (in the log), else — for a
/// policy logged before they were — the node's legacy store by digest, else
/// the defaults.
pub fn estimator_of(
    policy: &Policy,
    legacy: &EstimatorStore,
) -> Result<EstimatorConfig, SizingFailure> {
    match (&policy.estimator, policy.estimator_digest.is_empty()) {
        (Some(config), _) => Ok((**config).clone()),
        (None, true) => Ok(reservoir_core::default_estimator(policy)),
        (None, false) => legacy
            .get(&policy.estimator_digest)
            .map(|body| body.config())
            .ok_or_else(|| SizingFailure::EstimatorUnknown {
                digest: policy.estimator_digest.clone(),
            }),
    }
}

/// Canonical request of a sized reserve: its sizing inputs instead of units.
pub fn sized_request_digest(
    subject: &str,
    route: &str,
    counted_input_tokens: u64,
    max_tokens: Option<u64>,
) -> RequestDigest {
    let max = max_tokens.map_or("-".to_string(), |m| m.to_string());
    let canonical =
        format!("reservoir.reserve.sized.v1\n{subject}\n{route}\n{counted_input_tokens}\n{max}");
    RequestDigest(Sha256::digest(canonical.as_bytes()).into())
}

/// Clamps a projected drift multiplier into what sizing accepts.
pub fn drift_ppm(projected: Option<u64>) -> u64 {
    projected
        .unwrap_or(PPM)
        .clamp(PPM, reservoir_core::sizing::MAX_DRIFT_PPM)
}

/// Estimator settings by digest, read from `<data-dir>/estimators/<hex>.json`
/// (written by versions that kept them outside the log): only for policies
/// logged without their settings.
#[derive(Clone, Default)]
pub struct EstimatorStore {
    inner: Arc<RwLock<StoreInner>>,
}

#[derive(Default)]
struct StoreInner {
    dir: Option<PathBuf>,
    cache: HashMap<String, EstimatorBody>,
}

impl EstimatorStore {
    pub fn set_dir(&self, data_dir: &std::path::Path) {
        self.inner.write().unwrap_or_else(|e| e.into_inner()).dir =
            Some(data_dir.join(ESTIMATORS_DIR));
    }

    fn file(dir: &std::path::Path, digest: &str) -> Option<PathBuf> {
        let hex = digest.strip_prefix(DIGEST_PREFIX)?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| dir.join(format!("{hex}.json")))
    }

    /// The settings stored under `digest`, if any.
    pub fn get(&self, digest: &str) -> Option<EstimatorBody> {
        if let Some(body) = self
            .inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .cache
            .get(digest)
        {
            return Some(body.clone());
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let path = Self::file(inner.dir.as_ref()?, digest)?;
        let body: EstimatorBody = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        (body.digest() == digest).then(|| {
            inner.cache.insert(digest.to_string(), body.clone());
            body
        })
    }
}

/// Why a reserve the server was to size could not be sized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizingFailure {
    /// A policy logged before settings were in the log names settings by a
    /// digest this node has no file for.
    EstimatorUnknown { digest: String },
    /// The inputs cannot be sized (see `reservoir_core::size_reservation`).
    Invalid(String),
}

/// The one interface between the write path and sizing: the shard calls it
/// with the policy it is about to decide against, in the same trip.
pub trait Sizer: Send + Sync {
    fn size(
        &self,
        policy: &Policy,
        counted_input_tokens: u64,
        max_tokens: Option<u64>,
    ) -> Result<reservoir_core::Sizing, SizingFailure>;
}

/// Sizing from the policy's estimator settings and what the projections have
/// learnt of the route (drift, output digests), as far as they have followed
/// the log when the reserve is decided.
#[derive(Clone)]
pub struct ProjectionSizer {
    pub estimators: EstimatorStore,
    pub queries: crate::queries::QueryHandle,
}

impl Sizer for ProjectionSizer {
    fn size(
        &self,
        policy: &Policy,
        counted_input_tokens: u64,
        max_tokens: Option<u64>,
    ) -> Result<reservoir_core::Sizing, SizingFailure> {
        let config = estimator_of(policy, &self.estimators)?;
        let (drift, own, sibling) = crate::queries::sizing_inputs(
            &self.queries,
            &policy.route,
            config.sibling_route.as_deref(),
            config.quantile_ppm,
        );
        reservoir_core::size_reservation(
            &config,
            counted_input_tokens,
            drift_ppm(drift),
            max_tokens,
            own,
            sibling,
        )
        .map_err(|e| SizingFailure::Invalid(e.to_string()))
    }
}
