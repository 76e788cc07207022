//! The read side inside `reservoir serve`: a [`Projector`] over the same log the
//! writers append to, in its own RocksDB (`<data-dir>/projections`), following
//! the log tail in a background task, and the HTTP queries over its
//! [`Projections`]. The same code runs in every cluster node (over the whole
//! topic, see [`crate::cluster`]) and in `reservoir project`
//! ([`crate::project`]), where no local writer knows every reservation id.
//!
//! Every query accepts `?min_position=LP:OFFSET` (or a bare `OFFSET`, meaning
//! log partition 0): the `log_position` of a write's answer. The query waits
//! until the projection has consumed that entry, so the answer is no older than
//! the write; after `?wait_ms=` (default 2000, at most 10000) it answers 503
//! `projection_behind` with `Retry-After` instead. A position the log does not
//! hold (at or past its end: no write ever answered it) is 409
//! `position_beyond_log` at once, not after a wait no projector can end. Bad
//! parameters are 400 `invalid_query`.
//!
//! The projector reads every log partition through the fence rule, so the same
//! code serves the embedded log, the memory log and a single node on Kafka. If
//! it fails (a log read error, a poisoned step) it is reopened from its
//! committed state after a short pause; if its database cannot be opened the
//! writers are unaffected and the queries answer 503 `projections_unavailable`.
//!
//! The module's rooms: this file holds the query handle and the projector
//! task; `params` the shared opening of every query (the [`Projected`]
//! extractor); `views` what the queries answer; `handlers` the endpoints.

mod handlers;
mod params;
mod shadow;
mod views;

pub use handlers::*;
use params::*;
pub use params::{parse_position, EstimateParams, ExtraParams, NoExtra, Projected};
pub use shadow::*;
pub use views::*;

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRef, FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use reservoir_core::ReservationId;
use reservoir_log::{EventReader, Position};
use reservoir_projections::model::{EfficiencyHistogram, PartitionBalance, Rollup};
use reservoir_projections::{store, At, ProjectionError, Projections, Projector, ProjectorConfig};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use utoipa::{OpenApi, ToSchema};

use crate::problem::{ApiError, Problem};
use crate::views::{LedgerView, PartitionKeyView};

/// Default and maximum of `?wait_ms=`.
pub const DEFAULT_WAIT_MS: u64 = 2_000;
pub const MAX_WAIT_MS: u64 = 10_000;
/// Default `?min_samples=` of an estimate (warm at or above it).
pub const DEFAULT_MIN_SAMPLES: u64 = 100;
/// Directory of the projection database under `--data-dir`.
pub const PROJECTIONS_DIR: &str = "projections";

/// The current query side, shared by the handlers and the projector task.
#[derive(Clone, Default)]
pub struct QueryHandle {
    inner: Arc<RwLock<Published>>,
}

/// What a handle shows: its own projector's projection, or another handle's
/// (a cluster node's partition routers all read the node's one projector).
#[derive(Clone)]
enum Published {
    Own(Option<Live>),
    Shared(QueryHandle),
}

impl Default for Published {
    fn default() -> Self {
        Published::Own(None)
    }
}

#[derive(Clone)]
struct Live {
    projections: Projections,
    log_partitions: u32,
    /// Whether the projector's log holds an entry at a position within a
    /// timeout ([`EventReader::wait_for`]): a `min_position` it does not
    /// hold names no entry that was ever written.
    log_has: LogHas,
}

/// [`EventReader::wait_for`] of the log the projector follows, type-erased.
type LogHas = Arc<
    dyn Fn(
            u32,
            u64,
            Duration,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<bool, reservoir_log::LogError>> + Send>,
        > + Send
        + Sync,
>;

fn log_has<L: EventReader>(log: Arc<L>) -> LogHas {
    Arc::new(move |lp, offset, timeout| {
        let log = log.clone();
        Box::pin(async move { log.wait_for(lp, offset, timeout).await })
    })
}

impl QueryHandle {
    fn set(&self, live: Option<Live>) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = Published::Own(live);
    }

    /// From now on this handle shows whatever `source` shows (`source` must
    /// not itself end up showing this handle).
    pub fn share(&self, source: &QueryHandle) {
        assert!(
            !Arc::ptr_eq(&self.inner, &source.inner),
            "a query handle cannot show itself"
        );
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = Published::Shared(source.clone());
    }

    /// Whether a projection is open behind this handle.
    pub fn is_live(&self) -> bool {
        self.current().is_some()
    }

    fn current(&self) -> Option<Live> {
        let published = self.inner.read().unwrap_or_else(|e| e.into_inner()).clone();
        match published {
            Published::Own(live) => live,
            Published::Shared(source) => source.current(),
        }
    }

    fn live(&self) -> Result<Live, ApiError> {
        self.current().ok_or_else(|| {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "projections_unavailable",
                "the projection database is not open (yet)",
            );
            e.retry_after_s = Some(1);
            e
        })
    }
}

/// The running projector; [`ProjectorTask::stop`] ends it and closes the
/// projection database.
pub struct ProjectorTask {
    stop: watch::Sender<bool>,
    /// Closed when the projector thread has finished; `None` once waited for.
    done: Option<std::sync::mpsc::Receiver<()>>,
}

/// How long a dropped [`ProjectorTask`] waits for its thread to close the
/// projection database.
const STOP_ON_DROP_WAIT: Duration = Duration::from_secs(5);

impl ProjectorTask {
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(done) = self.done.take() {
            let _ = tokio::task::spawn_blocking(move || done.recv()).await;
        }
    }
}

/// Dropped without [`ProjectorTask::stop`] (the server's future was dropped,
/// e.g. by a runtime shutting down): the projector thread is told to stop and
/// given [`STOP_ON_DROP_WAIT`] to close its database, so the process does not
/// exit while that thread is inside RocksDB (seen as `pthread lock: Invalid
/// argument` aborts at the exit of a test binary).
impl Drop for ProjectorTask {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = self.stop.send(true);
            let _ = done.recv_timeout(STOP_ON_DROP_WAIT);
        }
    }
}

/// Niceness of the projector thread: the read side may lag a little under
/// load, a request must not wait behind a projector step.
pub const PROJECTOR_NICE: i32 = 10;

/// Starts following `log` into `<data_dir>/projections`, publishing the query
/// side in `handle`.
///
/// The projector runs on its own thread (with its own single-threaded
/// runtime) at a lower scheduling priority ([`PROJECTOR_NICE`]), not on the
/// runtime that serves requests: one step folds up to thousands of events, and
/// on a tokio worker it would hold up every request queued behind it.
pub fn spawn<L: EventReader>(
    log: Arc<L>,
    data_dir: &FsPath,
    retention: Option<std::time::Duration>,
    handle: QueryHandle,
) -> ProjectorTask {
    let (stop, stop_rx) = watch::channel(false);
    let (done_tx, done) = std::sync::mpsc::channel::<()>();
    let path = data_dir.join(PROJECTIONS_DIR);
    let spawned = std::thread::Builder::new()
        .name("reservoir-projector".into())
        .spawn(move || {
            lower_priority(PROJECTOR_NICE);
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(follow(log, path, retention, handle, stop_rx)),
                Err(err) => tracing::error!(%err, "projector runtime; queries stay unavailable"),
            }
            drop(done_tx);
        });
    if let Err(err) = spawned {
        // `done_tx` was dropped with the closure: `stop` returns at once.
        tracing::error!(%err, "projector thread; queries stay unavailable");
    }
    ProjectorTask {
        stop,
        done: Some(done),
    }
}

/// Lowers the calling thread's scheduling priority (Linux: nice is per thread).
fn lower_priority(nice: i32) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take no pointers; failure only
        // leaves the priority as it was.
        let rc = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, nice)
        };
        if rc != 0 {
            tracing::debug!(nice, "could not lower the projector's priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    }
}

/// Opens the projection database, discarding it when it is ahead of the log
/// (a projection of another log, e.g. an earlier in-memory log).
async fn open_db<L: EventReader>(
    log: &L,
    path: &PathBuf,
) -> Result<Arc<rocksdb::DB>, ProjectionError> {
    let db = store::open(path)?;
    let detached = Projections::detached(db.clone());
    for lp in 0..log.log_partitions() {
        let end = log.end_offset(lp).await?;
        if detached.consumed(lp)? > end {
            tracing::warn!(path = %path.display(), log_partition = lp, end, "projection is ahead of the log; rebuilding it");
            drop(detached);
            drop(db);
            std::fs::remove_dir_all(path).map_err(|e| ProjectionError::Store(e.to_string()))?;
            return store::open(path);
        }
    }
    Ok(db)
}

async fn follow<L: EventReader>(
    log: Arc<L>,
    path: PathBuf,
    retention: Option<std::time::Duration>,
    handle: QueryHandle,
    mut stop: watch::Receiver<bool>,
) {
    let mut db = None;
    while !*stop.borrow() {
        let opened = match db.clone() {
            Some(db) => Ok(db),
            None => open_db(&*log, &path).await,
        };
        let result = match opened {
            Ok(opened) => {
                db = Some(opened.clone());
                let config = ProjectorConfig {
                    retention,
                    ..ProjectorConfig::default()
                };
                match Projector::open(log.clone(), opened, config) {
                    Ok(projector) => {
                        handle.set(Some(Live {
                            projections: projector.projections(),
                            log_partitions: log.log_partitions(),
                            log_has: log_has(log.clone()),
                        }));
                        projector.run(stop.clone()).await
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => break,
            Err(err) => {
                tracing::warn!(%err, path = %path.display(), "projector stopped; reopening");
                metrics::counter!("reservoir_projector_restarts_total").increment(1);
                if pause(&mut stop, Duration::from_millis(250)).await {
                    break;
                }
            }
        }
    }
    handle.set(None);
}

/// The routes of this module (merged into [`crate::api::router`]), on any
/// router state the query handle can be taken from.
pub fn routes<S>() -> Router<S>
where
    QueryHandle: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    use crate::auth::{require, OPERATOR, SUBJECT_READ, TENANT_READ};
    // A route's numbers sum every tenant's: operators only.
    Router::new()
        .route(
            "/v1/tenants/{tenant}/balances",
            require(TENANT_READ, get(tenant_balances)),
        )
        .route(
            "/v1/tenants/{tenant}/efficiency",
            require(TENANT_READ, get(tenant_efficiency)),
        )
        .route(
            "/v1/tenants/{tenant}/diagnosis",
            require(TENANT_READ, get(tenant_diagnosis)),
        )
        .route(
            "/v1/routes/{route}/balances",
            require(OPERATOR, get(route_balances)),
        )
        .route(
            "/v1/routes/{route}/estimate",
            require(OPERATOR, get(route_estimate)),
        )
        .route(
            "/v1/routes/{route}/efficiency",
            require(OPERATOR, get(route_efficiency)),
        )
        .route(
            "/v1/routes/{route}/shadow",
            require(OPERATOR, get(route_shadow)),
        )
        .route(
            "/v1/tenants/{tenant}/shadow",
            require(TENANT_READ, get(tenant_shadow)),
        )
        .route(
            "/v1/projections/reservations/{id}",
            require(SUBJECT_READ, get(reservation)),
        )
}

/// What reservation sizing reads from the projections, as far as they have
/// followed the log: the route's input drift multiplier (ppm), its own output
/// estimate and its sibling's, at `quantile_ppm`. Nothing while the
/// projections are not open (a cold route then reserves its ceiling).
pub fn sizing_inputs(
    queries: &QueryHandle,
    route: &str,
    sibling: Option<&str>,
    quantile_ppm: u64,
) -> (
    Option<u64>,
    Option<reservoir_core::RouteEstimate>,
    Option<reservoir_core::RouteEstimate>,
) {
    let Ok(live) = queries.live() else {
        return (None, None, None);
    };
    let p = live.projections.at();
    let estimate = |route: &str| {
        p.route_estimate_at(route, None, quantile_ppm)
            .unwrap_or_else(|err| {
                tracing::warn!(%err, route, "no route estimate for sizing");
                None
            })
    };
    let drift = p
        .input_drift(route)
        .ok()
        .flatten()
        .and_then(|d| d.multiplier_ppm());
    (drift, estimate(route), sibling.and_then(estimate))
}
