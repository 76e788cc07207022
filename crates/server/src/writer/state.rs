//! What a shard holds between batches: its ledger partitions, which partition
//! is active for each subject/route, the log position of the last event of
//! every reservation in memory, and the due list the sweepers read. Recovery
//! builds it from the log (or a snapshot); only the shard task changes it
//! afterwards. Everything here follows the records in memory (open ones and
//! finished ones inside the idempotency window): what leaves memory leaves
//! every map here too ([`ShardState::forget`]), and lives on in the
//! idempotency index (`super::retired`).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use reservoir_core::{EventBody, Partition, PartitionKey, Reservation, ReservationId, TimestampMs};
use reservoir_log::Position;

/// The writer's maps keyed by reservation ids and partition keys, hashed
/// with foldhash (seeded per map, so ids a client picks cannot aim at one
/// bucket) instead of SipHash: SipHash was 3 % of the instructions of a
/// request (bench-results/request-cost.md).
pub type FastMap<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// Global reservation id → the partition that holds it in memory (ids are
/// unique across the server; one that left memory is in the idempotency
/// index). Written only by shard tasks, speculatively during a batch.
pub type Index = Arc<RwLock<FastMap<ReservationId, PartitionKey>>>;

/// Kinds of due work the sweeper looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DueKind {
    LeaseExpiry,
    ExecutionLimit,
}

/// One ledger partition as the writer holds it.
#[derive(Clone, Debug, Default)]
pub struct PartitionState {
    pub partition: Partition,
    /// Position of the last committed event of each reservation.
    pub positions: FastMap<ReservationId, Position>,
    /// Position of the record that opened the partition.
    pub opened_at: Option<Position>,
}

/// State of one shard: its partitions and the bookkeeping around them.
#[derive(Clone, Debug, Default)]
pub struct ShardState {
    pub partitions: FastMap<PartitionKey, PartitionState>,
    /// Active partition for each (subject, route): the last one published.
    pub active: HashMap<(String, String), PartitionKey>,
    /// (due at, kind, partition, reservation); entries are checked lazily when due.
    pub due: BTreeSet<(TimestampMs, DueKind, PartitionKey, ReservationId)>,
}

impl ShardState {
    /// A record that left memory: drops its position and due entries. Returns
    /// the position of its last event.
    pub fn forget(&mut self, key: &PartitionKey, r: &Reservation) -> Option<Position> {
        self.forget_due(key, &r.id, r.expires_at_ms, r.execution_deadline_ms);
        self.partitions.get_mut(key)?.positions.remove(&r.id)
    }

    /// Removes the sweeper entries of a reservation that moved on for good.
    fn forget_due(
        &mut self,
        key: &PartitionKey,
        id: &ReservationId,
        expires_at_ms: TimestampMs,
        deadline_ms: Option<TimestampMs>,
    ) {
        let mut entry = (expires_at_ms, DueKind::LeaseExpiry, key.clone(), id.clone());
        self.due.remove(&entry);
        if let Some(deadline) = deadline_ms {
            (entry.0, entry.1) = (deadline, DueKind::ExecutionLimit);
            self.due.remove(&entry);
        }
    }

    /// Records what a committed event means for the sweepers and the index.
    pub fn note_committed(&mut self, key: &PartitionKey, body: &EventBody, position: Position) {
        if let Some(id) = body.reservation_id() {
            if !matches!(body, EventBody::AdmissionRefused { .. }) {
                if let Some(ps) = self.partitions.get_mut(key) {
                    ps.positions.insert(id.clone(), position);
                }
            }
        }
        match body {
            EventBody::Reserved {
                id, expires_at_ms, ..
            } => {
                self.due.insert((
                    *expires_at_ms,
                    DueKind::LeaseExpiry,
                    key.clone(),
                    id.clone(),
                ));
            }
            EventBody::Started {
                id,
                execution_deadline_ms,
                ..
            } => {
                self.due.insert((
                    *execution_deadline_ms,
                    DueKind::ExecutionLimit,
                    key.clone(),
                    id.clone(),
                ));
            }
            // Finished: nothing is due any more (the due list follows open
            // reservations, not history).
            EventBody::Settled { id, .. }
            | EventBody::Released { id, .. }
            | EventBody::Expired { id, .. } => {
                let times = self
                    .partitions
                    .get(key)
                    .and_then(|ps| ps.partition.reservation(id))
                    .map(|r| (r.expires_at_ms, r.execution_deadline_ms));
                if let Some((expires_at_ms, deadline_ms)) = times {
                    self.forget_due(key, id, expires_at_ms, deadline_ms);
                }
            }
            EventBody::PartitionOpened { key: k, .. } => {
                if let Some(ps) = self.partitions.get_mut(k) {
                    ps.opened_at = Some(position);
                }
                self.active
                    .insert((k.subject.clone(), k.route.clone()), k.clone());
            }
            _ => {}
        }
    }
}
