//! Savepoints: taking back events that were applied speculatively.
//!
//! The writer applies a batch's events before the log has acknowledged them,
//! so later commands in the batch see earlier ones. When the append fails, each
//! touched partition must return exactly to where it was. A [`Savepoint`] holds
//! the pre-images: the partition's scalars (everything but its reservation map)
//! when it was taken, and each reservation record the first time an event
//! applied through it names that record. [`Savepoint::rollback`] puts them back.
//!
//! Going forward is still only [`apply`]: a savepoint never edits a field on
//! its own, it only restores what was there before its own applies.

use std::collections::BTreeSet;

use crate::event::Event;
use crate::partition::{apply, Partition};
use crate::reservation::Reservation;
use crate::types::ReservationId;

/// The state of one partition before a run of [`Savepoint::apply`] calls.
#[derive(Debug)]
pub struct Savepoint {
    scalars: Partition,
    /// Pre-images of the records the applied events named, in first-touch order
    /// (`None`: the record did not exist).
    records: Vec<(ReservationId, Option<Reservation>)>,
    touched: BTreeSet<ReservationId>,
}

impl Savepoint {
    /// Remembers `p` as it is now. Costs a copy of the partition without its
    /// reservation map, which can be large.
    pub fn new(p: &Partition) -> Savepoint {
        Savepoint {
            scalars: p.without_reservations(),
            records: Vec::new(),
            touched: BTreeSet::new(),
        }
    }

    /// [`apply`], remembering the pre-image of the record the event names.
    pub fn apply(&mut self, p: &mut Partition, event: &Event) {
        if let Some(id) = event.body.reservation_id() {
            if self.touched.insert(id.clone()) {
                self.records
                    .push((id.clone(), p.reservations.get(id).cloned()));
            }
        }
        apply(p, event);
    }

    /// Returns `p` to the state this savepoint was taken in, undoing every
    /// event applied through it (and nothing else may have changed `p` since).
    pub fn rollback(self, p: &mut Partition) {
        for (id, before) in self.records.into_iter().rev() {
            match before {
                Some(record) => p.reservations.insert(id, record),
                None => p.reservations.remove(&id),
            };
        }
        let reservations = std::mem::take(&mut p.reservations);
        *p = self.scalars;
        p.reservations = reservations;
    }
}
