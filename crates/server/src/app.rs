//! The composition root: what every handler shares. The writers appear once
//! recovery finished (and are replaced when they are rebuilt after the log was
//! in doubt); the query side, the estimator settings and the metrics handle live
//! for the whole process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::problem::ApiError;
use crate::queries::QueryHandle;
use crate::sizing::{EstimatorStore, ProjectionSizer};
use crate::writer::Writers;

/// Shared by every handler. The writers appear once recovery finished.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    /// Replaced when the writers are rebuilt after the log was in doubt.
    writers: std::sync::RwLock<Option<Writers>>,
    ready: AtomicBool,
    metrics: PrometheusHandle,
    /// Estimator settings of the policies (see [`crate::sizing`]).
    estimators: EstimatorStore,
    /// The projections' query side (see [`crate::queries`]).
    queries: QueryHandle,
    /// The emergency-shard key and reconcile grace, set at start
    /// (`None`: shards are not served by this process).
    shards: std::sync::OnceLock<ShardSettings>,
}

/// What the shard handlers need besides the writers.
#[derive(Clone, Debug)]
pub struct ShardSettings {
    pub signer: Arc<crate::shards::ShardSigner>,
    pub reconcile_grace_ms: u64,
}

impl ShardSettings {
    /// The signing key `config` names (`--shard-key-file`), else the data
    /// directory's (generated on first start), and the reconcile grace.
    pub fn load(config: &crate::config::Config) -> Result<Self, String> {
        Ok(ShardSettings {
            signer: Arc::new(crate::shards::ShardSigner::load_or_create(
                &config.data_dir,
                config.shard_key_file.as_deref(),
            )?),
            reconcile_grace_ms: u64::try_from(config.shard_reconcile_grace.as_millis())
                .unwrap_or(u64::MAX),
        })
    }
}

impl AppState {
    pub fn new(metrics: PrometheusHandle) -> Self {
        AppState {
            inner: Arc::new(Inner {
                writers: std::sync::RwLock::new(None),
                ready: AtomicBool::new(false),
                metrics,
                queries: Default::default(),
                estimators: Default::default(),
                shards: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Called when recovery is done (again after a rebuild): from now on `/readyz` is 200.
    pub fn set_ready(&self, writers: Writers) {
        *self
            .inner
            .writers
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(writers);
        self.inner.ready.store(true, Ordering::Release);
    }

    pub fn estimators(&self) -> &EstimatorStore {
        &self.inner.estimators
    }

    pub fn queries(&self) -> &QueryHandle {
        &self.inner.queries
    }

    /// What the writers size reserves with: this process's estimator settings
    /// and projections.
    pub fn sizer(&self) -> Arc<ProjectionSizer> {
        Arc::new(ProjectionSizer {
            estimators: self.inner.estimators.clone(),
            queries: self.inner.queries.clone(),
        })
    }

    /// Set once at start; a second call keeps the first.
    pub fn set_shards(&self, settings: ShardSettings) {
        let _ = self.inner.shards.set(settings);
    }

    pub fn shards(&self) -> Result<&ShardSettings, ApiError> {
        // Only a cluster node without `--shard-key-file` serves the shard
        // routes without settings: a shard must verify on whichever node
        // owns its partition after a rebalance, which needs one signing key
        // shared by every node.
        self.inner.shards.get().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "shards_not_in_cluster_mode",
                "this cluster serves no emergency shards: every node needs --shard-key-file, naming one key shared by all of them",
            )
        })
    }

    pub fn metrics(&self) -> &PrometheusHandle {
        &self.inner.metrics
    }

    /// Not ready, and the writers' handle dropped: once the shard tasks end,
    /// nothing holds the idempotency index open, so a restart in the same
    /// process can open it again.
    pub fn set_not_ready(&self) {
        self.inner.ready.store(false, Ordering::Release);
        *self
            .inner
            .writers
            .write()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub fn writers(&self) -> Result<Writers, ApiError> {
        match (
            self.inner.ready.load(Ordering::Acquire),
            self.inner
                .writers
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref(),
        ) {
            (true, Some(w)) => Ok(w.clone()),
            _ => Err(not_ready()),
        }
    }
}

/// The query handlers take only the query side (`crate::queries::Projected`).
impl axum::extract::FromRef<AppState> for QueryHandle {
    fn from_ref(state: &AppState) -> QueryHandle {
        state.queries().clone()
    }
}

fn not_ready() -> ApiError {
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_ready",
        "recovering the ledger from the log",
    );
    e.retry_after_s = Some(1);
    e
}
