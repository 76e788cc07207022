//! Savepoints: taking back events that were applied speculatively.
//!
//! The writer applies a batch's events before the log has acknowledged them,
//! so later commands in the batch see earlier ones. When the append fails, each
//! touched partition must return exactly to where it was. A [`Savepoint`] holds
//! the pre-images: the partition's scalars (everything but its reservation map
//! and finished queue) when it was taken, each reservation record the first
//! time an event applied through it names or evicts that record, and what the
//! finished queue lost at its front and gained at its back.
//! [`Savepoint::rollback`] puts them back.
//!
//! Going forward is still only [`apply`]: a savepoint never edits a field on
//! its own, it only restores what was there before its own applies.

use std::collections::BTreeSet;

use crate::event::Event;
use crate::partition::{apply_evicting, Partition};
use crate::reservation::Reservation;
use crate::types::{ReservationId, TimestampMs};

/// The state of one partition before a run of [`Savepoint::apply`] calls.
#[derive(Debug)]
pub struct Savepoint {
    scalars: Partition,
    /// Pre-images of the records the applied events named, in first-touch order
    /// (`None`: the record did not exist).
    records: Vec<(ReservationId, Option<Reservation>)>,
    touched: BTreeSet<ReservationId>,
    /// Entries evicted from the front of the finished queue, in order.
    popped: Vec<(TimestampMs, ReservationId)>,
    /// Entries pushed at its back.
    pushed: usize,
}

impl Savepoint {
    /// Remembers `p` as it is now. Costs a copy of the partition without its
    /// reservation map, which can be large.
    pub fn new(p: &Partition) -> Savepoint {
        Savepoint {
            scalars: p.without_reservations(),
            records: Vec::new(),
            touched: BTreeSet::new(),
            popped: Vec::new(),
            pushed: 0,
        }
    }

    /// [`crate::apply`], remembering the pre-image of the record the event
    /// names and of every record it evicted. Returns the evicted records.
    pub fn apply(&mut self, p: &mut Partition, event: &Event) -> Vec<Reservation> {
        if let Some(id) = event.body.reservation_id() {
            if self.touched.insert(id.clone()) {
                self.records
                    .push((id.clone(), p.reservations.get(id).cloned()));
            }
        }
        let queued = p.finished.len();
        let mut evicted = Vec::new();
        apply_evicting(p, event, &mut evicted);
        self.pushed += p.finished.len() + evicted.len() - queued;
        for r in &evicted {
            let finished_at = r.finished_at_ms.expect("an evicted record finished");
            self.popped.push((finished_at, r.id.clone()));
            if self.touched.insert(r.id.clone()) {
                self.records.push((r.id.clone(), Some(r.clone())));
            }
        }
        evicted
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
        // The queue was popped at the front and pushed at the back: put the
        // popped entries back in front, then drop what was pushed.
        let mut finished = std::mem::take(&mut p.finished);
        for entry in self.popped.into_iter().rev() {
            finished.push_front(entry);
        }
        finished.truncate(finished.len() - self.pushed);
        let reservations = std::mem::take(&mut p.reservations);
        *p = self.scalars;
        p.reservations = reservations;
        p.finished = finished;
    }
}
