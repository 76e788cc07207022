//! The read models a step folds events into besides the partitions — output
//! token digests, efficiency histograms, input drift, tenant and route
//! roll-ups — kept in memory between steps.
//!
//! The projector is the only writer of its database, so what it wrote last is
//! what it holds here, and a step reads a model from the database only the
//! first time it touches it. Reading and decoding each touched model again
//! every step cost the server about 10,000 instructions per request of the
//! benchmark's cycle, a sixth of the projector (bench-results/request-cost.md).
//! A step writes every model it touched, as before, so the database and a
//! rebuild hold the same bytes. A failed step poisons the projector, and a
//! reopened one starts with empty models, loaded from what was committed.
//!
//! Each kind holds at most [`MODELS_CACHED_MAX`] models (histograms are per
//! route and per tenant, roll-ups too), digests at most
//! [`DIGESTS_CACHED_MAX`] (one is up to ~10 KB: 600 centroids; there is one
//! per route, reported model name and log partition); past that a kind is
//! emptied after the step's commit and refilled from the database, so the
//! models take at most about 20 MB of the server's memory.

use serde::de::DeserializeOwned;

use super::*;

/// Histograms, drifts or roll-ups kept between steps at most (a few hundred
/// bytes each).
pub const MODELS_CACHED_MAX: usize = 16_384;
/// Output-token digests kept between steps at most.
pub const DIGESTS_CACHED_MAX: usize = 1_024;

type Slot = (&'static str, String);

#[derive(Default)]
pub(super) struct Models {
    digests: HashMap<String, RollingDigest>,
    histograms: HashMap<Slot, EfficiencyHistogram>,
    drifts: HashMap<String, InputDrift>,
    rollups: HashMap<Slot, Rollup>,
    /// What the step in progress changed (written by `write_touched`).
    touched_digests: BTreeSet<String>,
    touched_histograms: BTreeSet<Slot>,
    touched_drifts: BTreeSet<String>,
    touched_rollups: BTreeSet<Slot>,
}

impl Models {
    pub(super) fn digest(
        &mut self,
        db: &DB,
        key: String,
    ) -> Result<&mut RollingDigest, ProjectionError> {
        if !self.digests.contains_key(&key) {
            let stored = match get_raw(db, store::DIGESTS, &key)? {
                None => RollingDigest::default(),
                Some(bytes) => {
                    RollingDigest::decode(&bytes).map_err(|reason| ProjectionError::Corrupt {
                        cf: store::DIGESTS,
                        key: key.clone(),
                        reason,
                    })?
                }
            };
            self.digests.insert(key.clone(), stored);
        }
        self.touched_digests.insert(key.clone());
        Ok(self.digests.get_mut(&key).expect("just inserted"))
    }

    pub(super) fn drift(
        &mut self,
        db: &DB,
        route: &str,
    ) -> Result<&mut InputDrift, ProjectionError> {
        if !self.drifts.contains_key(route) {
            let stored = get(db, store::INPUT_DRIFT, route)?.unwrap_or_default();
            self.drifts.insert(route.to_string(), stored);
        }
        self.touched_drifts.insert(route.to_string());
        Ok(self.drifts.get_mut(route).expect("just inserted"))
    }

    pub(super) fn histogram(
        &mut self,
        db: &DB,
        cf: &'static str,
        key: &str,
    ) -> Result<&mut EfficiencyHistogram, ProjectionError> {
        by_slot(
            &mut self.histograms,
            &mut self.touched_histograms,
            db,
            cf,
            key,
        )
    }

    /// A tenant's (`TENANT_BALANCES`) or a route's (`ROUTE_BALANCES`) roll-up.
    pub(super) fn rollup(
        &mut self,
        db: &DB,
        cf: &'static str,
        key: &str,
    ) -> Result<&mut Rollup, ProjectionError> {
        by_slot(&mut self.rollups, &mut self.touched_rollups, db, cf, key)
    }

    /// Puts every model the step touched into `work`, and the touched route
    /// roll-ups into `work.routes` (published once committed).
    pub(super) fn write_touched(&mut self, work: &mut Work) {
        for (cf, key) in std::mem::take(&mut self.touched_rollups) {
            let rollup = &self.rollups[&(cf, key.clone())];
            work.put(cf, key.clone(), encode(rollup));
            if cf == store::ROUTE_BALANCES {
                work.routes.push((key, rollup.clone()));
            }
        }
        for key in std::mem::take(&mut self.touched_digests) {
            let encoded = self.digests[&key].encode();
            work.put(store::DIGESTS, key, encoded);
        }
        for (cf, key) in std::mem::take(&mut self.touched_histograms) {
            let encoded = encode(&self.histograms[&(cf, key.clone())]);
            work.put(cf, key, encoded);
        }
        for route in std::mem::take(&mut self.touched_drifts) {
            let encoded = encode(&self.drifts[&route]);
            work.put(store::INPUT_DRIFT, route, encoded);
        }
    }

    /// Empties a kind that grew past its bound ([`DIGESTS_CACHED_MAX`] or
    /// [`MODELS_CACHED_MAX`]; after a commit: the database holds all of it).
    pub(super) fn bound(&mut self) {
        if self.digests.len() > DIGESTS_CACHED_MAX {
            self.digests.clear();
        }
        if self.histograms.len() > MODELS_CACHED_MAX {
            self.histograms.clear();
        }
        if self.drifts.len() > MODELS_CACHED_MAX {
            self.drifts.clear();
        }
        if self.rollups.len() > MODELS_CACHED_MAX {
            self.rollups.clear();
        }
    }
}

/// The model in `cf` under `key`: the one kept in `models`, or the stored one
/// (a default when there is none) loaded into it; marked touched either way.
fn by_slot<'m, T: DeserializeOwned + Default>(
    models: &'m mut HashMap<Slot, T>,
    touched: &mut BTreeSet<Slot>,
    db: &DB,
    cf: &'static str,
    key: &str,
) -> Result<&'m mut T, ProjectionError> {
    let slot = (cf, key.to_string());
    if !models.contains_key(&slot) {
        let stored = get(db, cf, key)?.unwrap_or_default();
        models.insert(slot.clone(), stored);
    }
    let model = models.get_mut(&slot).expect("just inserted");
    touched.insert(slot);
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_past_its_bound_is_emptied_and_one_within_it_kept() {
        let mut models = Models::default();
        for i in 0..DIGESTS_CACHED_MAX {
            models
                .digests
                .insert(format!("d{i}"), RollingDigest::default());
        }
        for i in 0..=MODELS_CACHED_MAX {
            models
                .rollups
                .insert(("r", format!("{i}")), Rollup::default());
        }
        models.bound();
        assert_eq!(
            models.digests.len(),
            DIGESTS_CACHED_MAX,
            "at the bound: kept"
        );
        assert!(models.rollups.is_empty(), "past it: emptied");
        models
            .digests
            .insert("one more".into(), RollingDigest::default());
        models.bound();
        assert!(models.digests.is_empty());
    }
}
