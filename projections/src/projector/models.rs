//! The read models a step folds events into besides the partitions — output
//! token digests, efficiency histograms, input drift, tenant and route
//! roll-ups — kept in memory between steps.
//!
//! The projector is the only writer of its database, so what it wrote last is
//! what it holds here, and a step reads a model from the database only the
//! first time it touches it. Reading and decoding each touched model again
//! every step cost the server about 12,500 instructions per request of the
//! benchmark's cycle (callgrind: `apply_record` and `Work::finish` together,
//! 46.8k before, 34.3k after; bench-results/request-cost.md).
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
use serde::Serialize;

use super::*;

/// Histograms, drifts or roll-ups kept between steps at most (a few hundred
/// bytes each).
pub const MODELS_CACHED_MAX: usize = 16_384;
/// Output-token digests kept between steps at most.
pub const DIGESTS_CACHED_MAX: usize = 1_024;

/// A model's column family and key: where it is stored, and its put.
type Slot = (&'static str, String);

#[derive(Default)]
pub(super) struct Models {
    digests: FastMap<Slot, RollingDigest>,
    histograms: FastMap<Slot, EfficiencyHistogram>,
    drifts: FastMap<Slot, InputDrift>,
    rollups: FastMap<Slot, Rollup>,
    /// What the step in progress changed (written by `write_touched`).
    touched_digests: BTreeSet<Slot>,
    touched_histograms: BTreeSet<Slot>,
    touched_drifts: BTreeSet<Slot>,
    touched_rollups: BTreeSet<Slot>,
}

impl Models {
    pub(super) fn digest(
        &mut self,
        db: &DB,
        key: String,
    ) -> Result<&mut RollingDigest, ProjectionError> {
        let slot = (store::DIGESTS, key);
        by_slot(&mut self.digests, &mut self.touched_digests, slot, |key| {
            let Some(bytes) = get_raw(db, store::DIGESTS, key)? else {
                return Ok(RollingDigest::default());
            };
            RollingDigest::decode(&bytes).map_err(|reason| ProjectionError::Corrupt {
                cf: store::DIGESTS,
                key: key.to_string(),
                reason,
            })
        })
    }

    pub(super) fn drift(
        &mut self,
        db: &DB,
        route: &str,
    ) -> Result<&mut InputDrift, ProjectionError> {
        let slot = (store::INPUT_DRIFT, route.to_string());
        by_slot(
            &mut self.drifts,
            &mut self.touched_drifts,
            slot,
            stored(db, store::INPUT_DRIFT),
        )
    }

    pub(super) fn histogram(
        &mut self,
        db: &DB,
        cf: &'static str,
        key: &str,
    ) -> Result<&mut EfficiencyHistogram, ProjectionError> {
        let slot = (cf, key.to_string());
        by_slot(
            &mut self.histograms,
            &mut self.touched_histograms,
            slot,
            stored(db, cf),
        )
    }

    /// A tenant's (`TENANT_BALANCES`) or a route's (`ROUTE_BALANCES`) roll-up.
    pub(super) fn rollup(
        &mut self,
        db: &DB,
        cf: &'static str,
        key: &str,
    ) -> Result<&mut Rollup, ProjectionError> {
        let slot = (cf, key.to_string());
        by_slot(
            &mut self.rollups,
            &mut self.touched_rollups,
            slot,
            stored(db, cf),
        )
    }

    /// Puts every model the step touched, and the touched route roll-ups
    /// into `routes` (published once committed).
    pub(super) fn write_touched(
        &mut self,
        puts: &mut BTreeMap<Slot, Vec<u8>>,
        routes: &mut Vec<(String, Rollup)>,
    ) {
        for slot in std::mem::take(&mut self.touched_rollups) {
            let rollup = &self.rollups[&slot];
            if slot.0 == store::ROUTE_BALANCES {
                routes.push((slot.1.clone(), rollup.clone()));
            }
            puts.insert(slot, encode(rollup));
        }
        for slot in std::mem::take(&mut self.touched_digests) {
            let encoded = self.digests[&slot].encode();
            puts.insert(slot, encoded);
        }
        put_each(&self.histograms, &mut self.touched_histograms, puts);
        put_each(&self.drifts, &mut self.touched_drifts, puts);
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

/// The model at `slot`: the one kept in `models`, or the one `load` reads
/// for its key, kept from then on; marked touched either way.
fn by_slot<'m, T>(
    models: &'m mut FastMap<Slot, T>,
    touched: &mut BTreeSet<Slot>,
    slot: Slot,
    load: impl FnOnce(&str) -> Result<T, ProjectionError>,
) -> Result<&'m mut T, ProjectionError> {
    if !models.contains_key(&slot) {
        let stored = load(&slot.1)?;
        models.insert(slot.clone(), stored);
    }
    let model = models.get_mut(&slot).expect("just inserted");
    touched.insert(slot);
    Ok(model)
}

/// Loads a JSON model from `cf`, a default when none is stored.
fn stored<'d, T: DeserializeOwned + Default>(
    db: &'d DB,
    cf: &'static str,
) -> impl FnOnce(&str) -> Result<T, ProjectionError> + 'd {
    move |key| Ok(get(db, cf, key)?.unwrap_or_default())
}

/// Puts each touched model of one kind as JSON.
fn put_each<T: Serialize>(
    models: &FastMap<Slot, T>,
    touched: &mut BTreeSet<Slot>,
    puts: &mut BTreeMap<Slot, Vec<u8>>,
) {
    for slot in std::mem::take(touched) {
        let encoded = encode(&models[&slot]);
        puts.insert(slot, encoded);
    }
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
                .insert((store::DIGESTS, format!("d{i}")), RollingDigest::default());
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
        models.digests.insert(
            (store::DIGESTS, "one more".into()),
            RollingDigest::default(),
        );
        models.bound();
        assert!(models.digests.is_empty());
    }
}
