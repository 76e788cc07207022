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
//! `projection_behind` with `Retry-After` instead. Bad parameters are 400
//! `invalid_query`.
//!
//! The projector reads every log partition through the fence rule, so the same
//! code serves the embedded log, the memory log and a single node on Kafka. If
//! it fails (a log read error, a poisoned step) it is reopened from its
//! committed state after a short pause; if its database cannot be opened the
//! writers are unaffected and the queries answer 503 `projections_unavailable`.

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
use reservoir_projections::{store, ProjectionError, Projections, Projector, ProjectorConfig};
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
pub fn spawn<L: EventReader>(log: Arc<L>, data_dir: &FsPath, handle: QueryHandle) -> ProjectorTask {
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
                Ok(runtime) => runtime.block_on(follow(log, path, handle, stop_rx)),
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
                match Projector::open(log.clone(), opened, ProjectorConfig::default()) {
                    Ok(projector) => {
                        handle.set(Some(Live {
                            projections: projector.projections(),
                            log_partitions: log.log_partitions(),
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
    Router::new()
        .route("/v1/tenants/{tenant}/balances", get(tenant_balances))
        .route("/v1/tenants/{tenant}/efficiency", get(tenant_efficiency))
        .route("/v1/tenants/{tenant}/diagnosis", get(tenant_diagnosis))
        .route("/v1/routes/{route}/balances", get(route_balances))
        .route("/v1/routes/{route}/estimate", get(route_estimate))
        .route("/v1/routes/{route}/efficiency", get(route_efficiency))
        .route("/v1/projections/reservations/{id}", get(reservation))
}

// ---------------------------------------------------------------- parameters

type Params = Result<Query<BTreeMap<String, String>>, QueryRejection>;

fn bad_query(detail: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", detail)
}

fn store_failure(e: ProjectionError) -> ApiError {
    match e {
        ProjectionError::Timeout { .. } => unreachable!("handled by wait"),
        e if e.transient() => ApiError::unavailable(e.to_string()),
        e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    }
}

fn path_value(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(raw) =
        path.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()))?;
    if raw.is_empty() || raw.contains('|') {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "identifiers are non-empty and never contain `|`",
        ));
    }
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
struct Consistency {
    min_position: Option<Position>,
    wait_ms: u64,
    rest: BTreeMap<String, String>,
}

fn consistency(params: Params, extra: &[&str]) -> Result<Consistency, ApiError> {
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
async fn projection(queries: &QueryHandle, c: &Consistency) -> Result<Live, ApiError> {
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
            return Err(bad_query(format!(
                "min_position names log partition {} of {}",
                position.log_partition, live.log_partitions
            )));
        }
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

fn projected_to(live: &Live) -> Result<Vec<u64>, ApiError> {
    (0..live.log_partitions)
        .map(|lp| live.projections.consumed(lp).map_err(store_failure))
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

/// The opening every query handler shares: the path's identifier (non-empty,
/// no `|`), the consistency parameters and the endpoint's own (`E`; anything
/// else is a 400), and the projection once it reached `min_position` (or a
/// 503 with Retry-After when it did not in `wait_ms`).
pub struct Projected<E = NoExtra> {
    pub value: String,
    live: Live,
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

// ---------------------------------------------------------------- views

/// One ledger partition's balance as projected.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct PartitionBalanceView {
    pub partition_key: PartitionKeyView,
    pub ledger: LedgerView,
    pub debt_units: u64,
    /// Admission is suspended while debt is outstanding.
    pub frozen: bool,
    pub closed: bool,
    pub quarantined: bool,
    pub open_reservations: u64,
    pub refusals: u64,
    pub last_sequence: u64,
    pub opened_at_ms: u64,
    pub last_at_ms: u64,
    /// Opening plus refill over the partition's life (utilization denominator).
    pub offered_units: u64,
}

impl From<&PartitionBalance> for PartitionBalanceView {
    fn from(b: &PartitionBalance) -> Self {
        PartitionBalanceView {
            partition_key: (&b.key).into(),
            ledger: (&b.ledger).into(),
            debt_units: b.debt_units,
            frozen: b.frozen,
            closed: b.closed,
            quarantined: b.quarantined,
            open_reservations: b.open_reservations,
            refusals: b.refusals,
            last_sequence: b.last_sequence,
            opened_at_ms: b.opened_at_ms,
            last_at_ms: b.last_at_ms,
            offered_units: b.offered_units,
        }
    }
}

/// Balances summed over partitions.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct RollupView {
    pub partitions: u64,
    pub frozen_partitions: u64,
    pub closed_partitions: u64,
    pub quarantined_partitions: u64,
    pub open_reservations: u64,
    pub refusals: u64,
    pub debt_units: u64,
    pub offered_units: u64,
    /// Spent ÷ offered, per mille.
    pub utilization_permille: u64,
    pub ledger: LedgerView,
}

impl From<&Rollup> for RollupView {
    fn from(r: &Rollup) -> Self {
        RollupView {
            partitions: r.partitions,
            frozen_partitions: r.frozen_partitions,
            closed_partitions: r.closed_partitions,
            quarantined_partitions: r.quarantined_partitions,
            open_reservations: r.open_reservations,
            refusals: r.refusals,
            debt_units: r.debt_units,
            offered_units: r.offered_units,
            utilization_permille: r.utilization_permille(),
            ledger: (&r.ledger).into(),
        }
    }
}

/// `GET /v1/tenants/{tenant}/balances` and `GET /v1/routes/{route}/balances`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct BalancesView {
    /// The tenant or the route.
    pub name: String,
    pub total: RollupView,
    pub partitions: Vec<PartitionBalanceView>,
    /// Next offset the projection will consume, per log partition.
    pub projected_to: Vec<u64>,
}

/// Counted vs provider-reported input tokens of a route.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct InputDriftView {
    pub samples: u64,
    pub counted_input_units: u64,
    pub reported_input_units: u64,
    /// Reported ÷ counted in parts per million, never below 1,000,000.
    pub multiplier_ppm: Option<u64>,
}

/// `GET /v1/routes/{route}/estimate`: settled output tokens of the route.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct EstimateView {
    pub route: String,
    /// The model asked for, or `*` for every model of the route merged.
    pub model: String,
    /// Samples in the rolling window (what the quantiles describe).
    pub samples: u64,
    pub lifetime_samples: u64,
    pub p50_units: Option<u64>,
    pub p75_units: Option<u64>,
    pub p90_units: Option<u64>,
    pub p99_units: Option<u64>,
    pub min_samples: u64,
    /// `warm` (samples ≥ min_samples) or `cold`.
    pub temperature: String,
    pub warm: bool,
    pub input_drift: Option<InputDriftView>,
    pub projected_to: Vec<u64>,
}

/// Reservation efficiency (settled ÷ reserved) of a route or a tenant.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct EfficiencyView {
    /// `route` or `tenant`.
    pub scope: String,
    pub name: String,
    pub samples: u64,
    pub settled_units: u64,
    pub reserved_units: u64,
    /// Total settled ÷ total reserved, per mille.
    pub overall_permille: Option<u64>,
    pub p10_permille: Option<u64>,
    pub p50_permille: Option<u64>,
    pub p90_permille: Option<u64>,
    /// Bucket `i` counts settles with efficiency in `[i·w, (i+1)·w)` per mille;
    /// the last bucket holds everything above.
    pub bucket_width_permille: u64,
    pub buckets: Vec<u64>,
    pub projected_to: Vec<u64>,
}

fn efficiency_view(
    scope: &str,
    name: String,
    h: &EfficiencyHistogram,
    at: Vec<u64>,
) -> EfficiencyView {
    EfficiencyView {
        scope: scope.to_string(),
        name,
        samples: h.samples,
        settled_units: h.settled_units,
        reserved_units: h.reserved_units,
        overall_permille: h.overall_permille(),
        p10_permille: h.quantile_permille(100),
        p50_permille: h.quantile_permille(500),
        p90_permille: h.quantile_permille(900),
        bucket_width_permille: reservoir_projections::model::EFFICIENCY_BUCKET_PERMILLE,
        buckets: h.buckets.clone(),
        projected_to: at,
    }
}

/// `GET /v1/tenants/{tenant}/diagnosis`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct DiagnosisView {
    pub tenant: String,
    /// `healthy`, `over_reservation`, `burst_capacity`, `limit_too_low` or `inconclusive`.
    pub verdict: String,
    pub refusals: u64,
    pub settled_samples: u64,
    pub efficiency_p50_permille: Option<u64>,
    /// Coefficient of variation of the gaps between refusals (low: uniform, high: clustered).
    pub refusal_gap_cv_permille: Option<u64>,
    pub empty_bucket_share_permille: Option<u64>,
    pub utilization_permille: u64,
    pub explanation: String,
    pub projected_to: Vec<u64>,
}

/// `GET /v1/projections/reservations/{id}`: the projected record.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ReservationRecordView {
    pub id: String,
    pub partition_key: PartitionKeyView,
    /// `RESERVED`, `STARTED`, `SETTLED`, `SETTLED_WITH_DEBT`, `RELEASED`, `EXPIRED`, `USAGE_UNKNOWN`, …
    pub state: String,
    pub reserved_units: u64,
    pub held_units: u64,
    pub actual_units: Option<u64>,
    pub overdraft_units: u64,
    pub operation_id: Option<String>,
    pub reserved_at_ms: u64,
    pub expires_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub execution_deadline_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub projected_to: Vec<u64>,
}

fn json_text<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------- handlers

/// Balances of a tenant: the roll-up over its partitions and each partition.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/balances",
    params(("tenant" = String, Path), MinPosition, WaitMs),
    responses(
        (status = 200, body = BalancesView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No partition of this tenant in the projection", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn tenant_balances(
    Projected {
        value: tenant,
        live,
        ..
    }: Projected,
) -> Result<Response, ApiError> {
    let p = &live.projections;
    let total = p.tenant_balance(&tenant).map_err(store_failure)?;
    let partitions = p.tenant_partitions(&tenant).map_err(store_failure)?;
    balances(&live, tenant, "tenant", total, partitions)
}

/// Balances of a route: the roll-up over its partitions (every tenant) and each partition.
#[utoipa::path(get, path = "/v1/routes/{route}/balances",
    params(("route" = String, Path, description = "percent-encode any `/`"), MinPosition, WaitMs),
    responses(
        (status = 200, body = BalancesView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No partition of this route in the projection", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn route_balances(
    Projected {
        value: route, live, ..
    }: Projected,
) -> Result<Response, ApiError> {
    let p = &live.projections;
    let total = p.route_balance(&route).map_err(store_failure)?;
    let partitions = p
        .all_balances()
        .map_err(store_failure)?
        .into_iter()
        .filter(|b| b.key.route == route)
        .collect();
    balances(&live, route, "route", total, partitions)
}

fn balances(
    live: &Live,
    name: String,
    scope: &str,
    total: Option<Rollup>,
    partitions: Vec<PartitionBalance>,
) -> Result<Response, ApiError> {
    let Some(total) = total else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no partition of {scope} {name} in the projection"),
        ));
    };
    Ok(Json(BalancesView {
        name,
        total: (&total).into(),
        partitions: partitions.iter().map(Into::into).collect(),
        projected_to: projected_to(live)?,
    })
    .into_response())
}

/// A route's output-token estimate: p50/p75/p90/p99 of settled output tokens in
/// the rolling window, sample counts, warm or cold, and the input drift.
#[utoipa::path(get, path = "/v1/routes/{route}/estimate",
    params(("route" = String, Path, description = "percent-encode any `/`"),
        ("model" = Option<String>, Query, description = "one model's digest; absent: every model of the route merged"),
        ("min_samples" = Option<u64>, Query, description = "samples needed to be warm (default 100)"),
        MinPosition, WaitMs),
    responses(
        (status = 200, body = EstimateView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn route_estimate(
    Projected {
        value: route,
        live,
        rest,
        ..
    }: Projected<EstimateParams>,
) -> Result<Response, ApiError> {
    let model = match rest.get("model") {
        Some(m) if m.is_empty() || m.contains('|') => {
            return Err(bad_query("model is non-empty and never contains `|`"))
        }
        other => other.cloned(),
    };
    let min_samples = match rest.get("min_samples") {
        None => DEFAULT_MIN_SAMPLES,
        Some(raw) => raw
            .parse()
            .map_err(|_| bad_query(format!("min_samples `{raw}` is not an unsigned integer")))?,
    };
    let p = &live.projections;
    let e = p
        .route_estimate(&route, model.as_deref(), min_samples)
        .map_err(store_failure)?;
    let drift = p.input_drift(&route).map_err(store_failure)?;
    Ok(Json(EstimateView {
        route: e.route,
        model: e.model,
        samples: e.samples,
        lifetime_samples: e.lifetime_samples,
        p50_units: e.p50_units,
        p75_units: e.p75_units,
        p90_units: e.p90_units,
        p99_units: e.p99_units,
        min_samples,
        temperature: if e.warm { "warm" } else { "cold" }.to_string(),
        warm: e.warm,
        input_drift: drift.map(|d| InputDriftView {
            samples: d.samples,
            counted_input_units: d.counted_input_units,
            reported_input_units: d.reported_input_units,
            multiplier_ppm: d.multiplier_ppm(),
        }),
        projected_to: projected_to(&live)?,
    })
    .into_response())
}

/// Reservation efficiency (settled ÷ reserved) of a route.
#[utoipa::path(get, path = "/v1/routes/{route}/efficiency",
    params(("route" = String, Path, description = "percent-encode any `/`"), MinPosition, WaitMs),
    responses(
        (status = 200, body = EfficiencyView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn route_efficiency(
    Projected {
        value: route, live, ..
    }: Projected,
) -> Result<Response, ApiError> {
    let h = live
        .projections
        .efficiency_by_route(&route)
        .map_err(store_failure)?;
    let at = projected_to(&live)?;
    Ok(Json(efficiency_view("route", route, &h, at)).into_response())
}

/// Reservation efficiency (settled ÷ reserved) of a tenant.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/efficiency",
    params(("tenant" = String, Path), MinPosition, WaitMs),
    responses(
        (status = 200, body = EfficiencyView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn tenant_efficiency(
    Projected {
        value: tenant,
        live,
        ..
    }: Projected,
) -> Result<Response, ApiError> {
    let h = live
        .projections
        .efficiency_by_tenant(&tenant)
        .map_err(store_failure)?;
    let at = projected_to(&live)?;
    Ok(Json(efficiency_view("tenant", tenant, &h, at)).into_response())
}

/// Why a tenant is refused: over-reservation (low efficiency, uniform
/// refusals), burst capacity (clustered refusals into an empty bucket) or a
/// limit that is too low (efficient, spending near the limit).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/diagnosis",
    params(("tenant" = String, Path), MinPosition, WaitMs),
    responses(
        (status = 200, body = DiagnosisView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn tenant_diagnosis(
    Projected {
        value: tenant,
        live,
        ..
    }: Projected,
) -> Result<Response, ApiError> {
    let d = live.projections.diagnosis(&tenant).map_err(store_failure)?;
    Ok(Json(DiagnosisView {
        tenant: d.tenant,
        verdict: json_text(&d.verdict),
        refusals: d.refusals,
        settled_samples: d.settled_samples,
        efficiency_p50_permille: d.efficiency_p50_permille,
        refusal_gap_cv_permille: d.refusal_gap_cv_permille,
        empty_bucket_share_permille: d.empty_bucket_share_permille,
        utilization_permille: d.utilization_permille,
        explanation: d.explanation,
        projected_to: projected_to(&live)?,
    })
    .into_response())
}

/// A reservation's projected record (state, units, timestamps, operation id).
#[utoipa::path(get, path = "/v1/projections/reservations/{id}",
    params(("id" = String, Path), MinPosition, WaitMs),
    responses(
        (status = 200, body = ReservationRecordView),
        (status = 400, description = "Bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not in the projection", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The projection did not reach min_position in time; see Retry-After", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn reservation(
    Projected {
        value: raw, live, ..
    }: Projected,
) -> Result<Response, ApiError> {
    let id = ReservationId::new(&raw).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_id",
            e.to_string(),
        )
    })?;
    let unknown = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_reservation",
            format!("reservation {id} is not in the projection"),
        )
    };
    // By id alone, through the projections' id index: the same on a node
    // whose writers hold the id and on one that only projects the log.
    let record = live
        .projections
        .reservation_by_id(id.as_str())
        .map_err(store_failure)?
        .ok_or_else(unknown)?;
    let r = &record.reservation;
    Ok(Json(ReservationRecordView {
        id: r.id.to_string(),
        partition_key: (&record.key).into(),
        state: json_text(&r.state),
        reserved_units: r.reserved_units,
        held_units: r.held_units,
        actual_units: r.actual_units,
        overdraft_units: r.overdraft_units,
        operation_id: r.operation_id.as_ref().map(|o| o.to_string()),
        reserved_at_ms: r.reserved_at_ms,
        expires_at_ms: r.expires_at_ms,
        started_at_ms: r.started_at_ms,
        execution_deadline_ms: r.execution_deadline_ms,
        finished_at_ms: r.finished_at_ms,
        projected_to: projected_to(&live)?,
    })
    .into_response())
}

/// `?min_position=`: a write's `log_position` as `LP:OFFSET`, or a bare offset
/// in log partition 0.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MinPosition {
    /// Answer only once the projection includes this log position (`LP:OFFSET` or `OFFSET`).
    #[param(example = "0:42")]
    pub min_position: Option<String>,
}

/// `?wait_ms=`: how long to wait for `min_position`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitMs {
    /// Milliseconds to wait for `min_position` before a 503 (default 2000, at most 10000).
    pub wait_ms: Option<u64>,
}

#[derive(OpenApi)]
#[openapi(
    paths(
        tenant_balances,
        route_balances,
        route_estimate,
        route_efficiency,
        tenant_efficiency,
        tenant_diagnosis,
        reservation
    ),
    components(schemas(
        LedgerView,
        PartitionBalanceView,
        RollupView,
        BalancesView,
        InputDriftView,
        EstimateView,
        EfficiencyView,
        DiagnosisView,
        ReservationRecordView
    ))
)]
pub struct QueriesDoc;

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
    let p = &live.projections;
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
