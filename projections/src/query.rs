//! Queries over the projection database: balances, reservations, route
//! estimates, efficiency, refusals, findings, and the diagnosis of a tenant who
//! is refused below their contract. Plain functions; the HTTP layer is mounted
//! by the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reservoir_core::{PartitionKey, ReservationId, RouteEstimate};
use reservoir_log::Position;
use rocksdb::{ColumnFamily, DBIteratorWithThreadMode, IteratorMode, Snapshot, DB};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

use crate::diagnosis::{diagnose, Diagnosis, DiagnosisInputs};
use crate::model::{
    Cursor, EfficiencyHistogram, Finding, InputDrift, PartitionBalance, Refusal, ReservationRecord,
    Rollup, ShadowRecord,
};
use crate::sketch::{merged, RollingDigest};
use crate::store::{self, decode, first_with_prefix, get, scan_prefix, scan_range, Read};
use crate::ProjectionError;

/// A route's output-token estimate from the merged digests of every source
/// log partition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteEstimateView {
    pub route: String,
    pub model: String,
    /// Samples in the window (what the quantiles describe).
    pub samples: u64,
    pub lifetime_samples: u64,
    pub p50_units: Option<u64>,
    pub p75_units: Option<u64>,
    pub p90_units: Option<u64>,
    pub p99_units: Option<u64>,
    /// `samples >= min_samples`: the route's own distribution can be trusted.
    pub warm: bool,
}

/// Read access to a projection database, following a projector's progress when
/// it runs in the same process.
#[derive(Clone)]
pub struct Projections {
    db: Arc<DB>,
    positions: Option<watch::Receiver<Vec<u64>>>,
    /// Tells that projector a reader is waiting (it stops lingering).
    hurry: Option<Arc<Notify>>,
}

impl Projections {
    pub(crate) fn new(
        db: Arc<DB>,
        positions: watch::Receiver<Vec<u64>>,
        hurry: Arc<Notify>,
    ) -> Self {
        Self {
            db,
            positions: Some(positions),
            hurry: Some(hurry),
        }
    }

    /// Queries over a database no projector in this process writes (polls it).
    pub fn detached(db: Arc<DB>) -> Self {
        Self {
            db,
            positions: None,
            hurry: None,
        }
    }

    pub fn db(&self) -> &DB {
        &self.db
    }

    /// Next offset the projection will consume in `log_partition`.
    pub fn consumed(&self, log_partition: u32) -> Result<u64, ProjectionError> {
        get(&*self.db, store::CURSORS, &store::cursor_key(log_partition))
            .map(|cursor: Option<Cursor>| cursor.unwrap_or_default().next_offset)
    }

    /// Waits until the projection has consumed the entry at `position` (so an
    /// answer read afterwards is no older than that write), or `timeout` passes.
    pub async fn wait_for_position(
        &self,
        position: Position,
        timeout: Duration,
    ) -> Result<(), ProjectionError> {
        let started = Instant::now();
        let mut positions = self.positions.clone();
        loop {
            if self.consumed(position.log_partition)? > position.offset {
                return Ok(());
            }
            let waited = started.elapsed();
            if waited >= timeout {
                return Err(ProjectionError::Timeout {
                    position,
                    waited_ms: waited.as_millis() as u64,
                });
            }
            // Wake on the projector's signal when there is one; poll regardless,
            // so a projector in another process is followed too.
            if let Some(hurry) = &self.hurry {
                hurry.notify_one();
            }
            let nap = (timeout - waited).min(Duration::from_millis(20));
            match positions.as_mut() {
                Some(rx) => {
                    if let Ok(Err(_)) = tokio::time::timeout(nap, rx.changed()).await {
                        positions = None;
                    }
                }
                None => tokio::time::sleep(nap).await,
            }
        }
    }

    /// A consistent view of the projection as it is now: every read through
    /// it answers from the same projector step (a RocksDB snapshot), so a
    /// roll-up and its partitions, an index entry and its record, or an
    /// answer and the `projected_to` it names, never come from two steps.
    pub fn at(&self) -> At<'_> {
        At::of(&self.db)
    }
}

/// The projection at one moment; see [`Projections::at`].
pub struct At<'a> {
    db: &'a DB,
    snapshot: Snapshot<'a>,
}

impl Read for At<'_> {
    fn db(&self) -> &DB {
        self.db
    }
    fn get_cf(&self, cf: &ColumnFamily, key: &[u8]) -> Result<Option<Vec<u8>>, rocksdb::Error> {
        self.snapshot.get_cf(cf, key)
    }
    fn iterator_cf<'b>(
        &'b self,
        cf: &ColumnFamily,
        mode: IteratorMode,
    ) -> DBIteratorWithThreadMode<'b, DB> {
        self.snapshot.iterator_cf(cf, mode)
    }
}

impl<'a> At<'a> {
    pub fn of(db: &'a DB) -> Self {
        Self {
            db,
            snapshot: db.snapshot(),
        }
    }

    /// Next offset the projection had consumed in `log_partition` at this
    /// moment: what the answers read through this view reflect.
    pub fn consumed(&self, log_partition: u32) -> Result<u64, ProjectionError> {
        let cursor: Cursor =
            get(self, store::CURSORS, &store::cursor_key(log_partition))?.unwrap_or_default();
        Ok(cursor.next_offset)
    }

    pub fn partition_balance(
        &self,
        key: &PartitionKey,
    ) -> Result<Option<PartitionBalance>, ProjectionError> {
        get(self, store::BALANCES, &store::partition_key(key))
    }

    /// Balances of every partition of a tenant, in key order.
    pub fn tenant_partitions(
        &self,
        tenant: &str,
    ) -> Result<Vec<PartitionBalance>, ProjectionError> {
        scan_prefix(self, store::BALANCES, &format!("{tenant}|"))?
            .iter()
            .map(|(k, v)| decode(store::BALANCES, k, v))
            .collect()
    }

    /// Every partition balance in the projection.
    pub fn all_balances(&self) -> Result<Vec<PartitionBalance>, ProjectionError> {
        scan_prefix(self, store::BALANCES, "")?
            .iter()
            .map(|(k, v)| decode(store::BALANCES, k, v))
            .collect()
    }

    pub fn tenant_balance(&self, tenant: &str) -> Result<Option<Rollup>, ProjectionError> {
        get(self, store::TENANT_BALANCES, tenant)
    }

    pub fn route_balance(&self, route: &str) -> Result<Option<Rollup>, ProjectionError> {
        get(self, store::ROUTE_BALANCES, route)
    }

    pub fn reservation(
        &self,
        key: &PartitionKey,
        id: &str,
    ) -> Result<Option<ReservationRecord>, ProjectionError> {
        get(self, store::RESERVATIONS, &store::reservation_key(key, id))
    }

    /// A reservation's record by id alone, through the [`store::RESERVATION_IDS`]
    /// index (one seek and one read, whatever the number of reservations). If
    /// two partitions ever held the same id, the first in key order answers.
    pub fn reservation_by_id(
        &self,
        id: &str,
    ) -> Result<Option<ReservationRecord>, ProjectionError> {
        if ReservationId::new(id).is_err() {
            return Ok(None);
        }
        let prefix = store::reservation_id_prefix(id);
        let Some((k, v)) = first_with_prefix(self, store::RESERVATION_IDS, &prefix)? else {
            return Ok(None);
        };
        let key: PartitionKey = decode(store::RESERVATION_IDS, &k, &v)?;
        // Both are written in one batch, so an entry without its record is a
        // broken store, not a race.
        self.reservation(&key, id)?
            .map(Some)
            .ok_or_else(|| ProjectionError::Corrupt {
                cf: store::RESERVATION_IDS,
                key: String::from_utf8_lossy(&k).into_owned(),
                reason: "indexed reservation has no record".to_string(),
            })
    }

    /// Before when the retention rule has deleted every record of a finished
    /// reservation (`None`: nothing pruned; see `ProjectorConfig::retention`).
    pub fn pruned_before_ms(&self) -> Result<Option<u64>, ProjectionError> {
        get(self, store::RETENTION, store::PRUNED_BEFORE)
    }

    /// The digests of `route` for `model`, or of every model of the route.
    fn route_digests(
        &self,
        route: &str,
        model: Option<&str>,
    ) -> Result<Vec<RollingDigest>, ProjectionError> {
        let prefix = match model {
            Some(model) => store::digest_prefix(route, model),
            None => store::route_digest_prefix(route),
        };
        // Key order is (model, log partition) order: the merge order is fixed.
        scan_prefix(self, store::DIGESTS, &prefix)?
            .into_iter()
            .map(|(k, v)| {
                RollingDigest::decode(&v).map_err(|reason| ProjectionError::Corrupt {
                    cf: store::DIGESTS,
                    key: String::from_utf8_lossy(&k).into_owned(),
                    reason,
                })
            })
            .collect()
    }

    /// The route's estimate: p50/p75/p90/p99 of settled output, sample counts,
    /// and warm or cold against `min_samples`. `model: None` merges every model
    /// of the route (reported as model `*`).
    pub fn route_estimate(
        &self,
        route: &str,
        model: Option<&str>,
        min_samples: u64,
    ) -> Result<RouteEstimateView, ProjectionError> {
        let sources = self.route_digests(route, model)?;
        let samples = sources.iter().map(RollingDigest::window_samples).sum();
        let digest = merged(&sources);
        let q = |q: f64| {
            digest
                .as_ref()
                .map(|d| d.estimate_quantile(q).round() as u64)
        };
        Ok(RouteEstimateView {
            route: route.to_string(),
            model: model.unwrap_or("*").to_string(),
            samples,
            lifetime_samples: sources.iter().map(RollingDigest::lifetime_samples).sum(),
            p50_units: q(0.50),
            p75_units: q(0.75),
            p90_units: q(0.90),
            p99_units: q(0.99),
            warm: samples >= min_samples && samples > 0,
        })
    }

    /// The route's estimate at `quantile_ppm`, in the shape reservation sizing
    /// (`reservoir_core::size_reservation`) takes. `None` without samples;
    /// `model: None` merges every model of the route.
    pub fn route_estimate_at(
        &self,
        route: &str,
        model: Option<&str>,
        quantile_ppm: u64,
    ) -> Result<Option<RouteEstimate>, ProjectionError> {
        let sources = self.route_digests(route, model)?;
        let samples = sources.iter().map(RollingDigest::window_samples).sum();
        Ok(merged(&sources).map(|d| RouteEstimate {
            samples,
            quantile_units: d.estimate_quantile(quantile_ppm as f64 / 1e6).round() as u64,
        }))
    }

    pub fn efficiency_by_route(&self, route: &str) -> Result<EfficiencyHistogram, ProjectionError> {
        Ok(get(self, store::EFFICIENCY_BY_ROUTE, route)?.unwrap_or_default())
    }

    pub fn efficiency_by_tenant(
        &self,
        tenant: &str,
    ) -> Result<EfficiencyHistogram, ProjectionError> {
        Ok(get(self, store::EFFICIENCY_BY_TENANT, tenant)?.unwrap_or_default())
    }

    pub fn input_drift(&self, route: &str) -> Result<Option<InputDrift>, ProjectionError> {
        get(self, store::INPUT_DRIFT, route)
    }

    /// Shadow verdicts of a route (`scope` `route`) or a tenant (`tenant`)
    /// logged in `[from_ms, to_ms]`, in time order.
    pub fn shadow_verdicts(
        &self,
        scope: &str,
        owner: &str,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<ShadowRecord>, ProjectionError> {
        let prefix = store::shadow_prefix(scope, owner);
        let start = format!("{prefix}{from_ms:020}");
        let until = match to_ms.checked_add(1) {
            Some(after) => format!("{prefix}{after:020}"),
            None => format!("{prefix}~"),
        };
        scan_range(self, store::SHADOW, &prefix, &start, Some(&until))?
            .iter()
            .map(|(k, v)| decode(store::SHADOW, k, v))
            .collect()
    }

    /// A tenant's refusals in time order.
    pub fn refusals(&self, tenant: &str) -> Result<Vec<Refusal>, ProjectionError> {
        scan_prefix(self, store::REFUSALS, &format!("{tenant}|"))?
            .iter()
            .map(|(k, v)| decode(store::REFUSALS, k, v))
            .collect()
    }

    /// Events `try_apply` refused, in log order.
    pub fn findings(&self) -> Result<Vec<Finding>, ProjectionError> {
        scan_prefix(self, store::FINDINGS, "")?
            .iter()
            .map(|(k, v)| decode(store::FINDINGS, k, v))
            .collect()
    }

    /// Why a tenant is refused (see [`crate::diagnosis`]), over its
    /// partitions' primary dimensions.
    pub fn diagnosis(&self, tenant: &str) -> Result<Diagnosis, ProjectionError> {
        self.diagnosis_in(tenant, None)
    }

    /// The same in one dimension: a further dimension of the tenant's
    /// policies diagnoses on its own refusals, efficiency and utilization; a
    /// dimension that is only ever primary on the refusals that name it (or
    /// name none). `None`: the primary dimensions, every refusal.
    pub fn diagnosis_in(
        &self,
        tenant: &str,
        dimension: Option<reservoir_core::Dimension>,
    ) -> Result<Diagnosis, ProjectionError> {
        let rollup = self.tenant_balance(tenant)?;
        let further = dimension.and_then(|d| Some((d, rollup.as_ref()?.dimensions.get(&d)?)));
        let mut refusals = self.refusals(tenant)?;
        let inputs = match (dimension, further) {
            (_, Some((d, r))) => {
                refusals.retain(|f| f.dimension == Some(d));
                DiagnosisInputs {
                    refusals,
                    efficiency: self.efficiency_by_tenant(&store::dimension_key(tenant, d))?,
                    utilization_permille: match r.offered_units {
                        0 => 0,
                        offered => {
                            (u128::from(r.ledger.spent_units) * 1000 / u128::from(offered)) as u64
                        }
                    },
                }
            }
            (d, None) => {
                if let Some(d) = d {
                    refusals.retain(|f| f.dimension.is_none_or(|x| x == d));
                }
                DiagnosisInputs {
                    refusals,
                    efficiency: self.efficiency_by_tenant(tenant)?,
                    utilization_permille: rollup.map_or(0, |r| r.utilization_permille()),
                }
            }
        };
        Ok(diagnose(tenant, &inputs))
    }
}
