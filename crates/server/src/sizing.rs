//! Reservation sizing in the command path: a reserve without `units` is sized
//! by `reservoir_core::size_reservation` as counted input × the route's drift
//! multiplier + an output estimate (`max_tokens`, else the route's default
//! `max_tokens`, else the route's digest at the estimator quantile clamped to
//! `[floor, ceiling]`, else — cold — a sibling route's warm estimate or the
//! ceiling). Drift and digests come from the projections ([`crate::queries`]),
//! as far as they have followed the log when the reserve arrives.
//!
//! The estimator settings travel with the policy: `POST /v1/policies` may carry
//! an `estimator` object; its canonical JSON's sha256 becomes the policy's
//! `estimator_digest` (recorded in the log with the policy), and the object
//! itself is kept content-addressed in `<data-dir>/estimators/<hex>.json`, so a
//! restart finds the settings of every policy it recovers. A policy without an
//! estimator sizes with [`default_estimator`]. Settings are local to a node:
//! on Kafka with several nodes, publish through each node (or share the
//! directory).
//!
//! The request digest of a sized reserve covers its sizing inputs (counted
//! input and `max_tokens`), not the units they produced, so a retry with the
//! same id finds the original reservation even after the estimate moved.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use reservoir_core::sizing::PPM;
use reservoir_core::{Dimension, EstimatorConfig, Policy, RequestDigest};
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
        }
    }

    /// `sha256:` and the hex sha256 of the canonical JSON (fields in
    /// declaration order, no whitespace).
    pub fn digest(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("estimator serializes");
        format!("{DIGEST_PREFIX}{}", hex::encode(Sha256::digest(&canonical)))
    }
}

/// Settings of a policy that names no estimator: p90 of the route's output,
/// floor 1, and as the ceiling the largest reservation of the dimension that
/// limits output (`output_tokens`, else `tokens`, else the primary one): a
/// cold route reserves everything one request may take.
pub fn default_estimator(policy: &Policy) -> EstimatorBody {
    let output_limit = [Dimension::OutputTokens, Dimension::Tokens]
        .into_iter()
        .find_map(|d| policy.dimension_index(d))
        .map_or(policy.max_reservation_units, |i| {
            policy.limit(i).max_reservation_units
        });
    EstimatorBody {
        quantile_ppm: 900_000,
        floor_units: 1,
        ceiling_units: output_limit.max(1),
        min_samples: 100,
        default_max_tokens: None,
        sibling_route: None,
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

/// Estimator settings by digest: in memory, backed by
/// `<data-dir>/estimators/<hex>.json`.
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

    /// Stores `body` durably (write, sync, rename) under its digest.
    pub fn put(&self, body: &EstimatorBody) -> Result<String, String> {
        let digest = body.digest();
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(dir) = inner.dir.clone() {
            let path = Self::file(&dir, &digest).expect("own digest");
            if !path.exists() {
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                let tmp = path.with_extension("tmp");
                let bytes = serde_json::to_vec_pretty(body).map_err(|e| e.to_string())?;
                {
                    use std::io::Write;
                    let mut f = std::fs::File::create(&tmp).map_err(|e| e.to_string())?;
                    f.write_all(&bytes).map_err(|e| e.to_string())?;
                    f.sync_all().map_err(|e| e.to_string())?;
                }
                std::fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
            }
        }
        inner.cache.insert(digest.clone(), body.clone());
        Ok(digest)
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
    /// The policy names estimator settings this node does not have.
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
        let estimator = if policy.estimator_digest.is_empty() {
            default_estimator(policy)
        } else {
            self.estimators
                .get(&policy.estimator_digest)
                .ok_or_else(|| SizingFailure::EstimatorUnknown {
                    digest: policy.estimator_digest.clone(),
                })?
        };
        let config = estimator.config();
        let (drift, own, sibling) = crate::queries::sizing_inputs(
            &self.queries,
            &policy.route,
            estimator.sibling_route.as_deref(),
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
