//! Due work: which commands the sweepers should send now. The shard keeps a
//! due list (lease expiries, execution limits) ordered by time; entries are
//! checked lazily here and dropped once their reservation moved on. The core
//! re-checks every command it is sent (NotYetDue, WrongState) anyway.

use reservoir_core::{Command, PartitionKey, ReservationState, TimestampMs};

use super::pipeline::Shard;
use super::state::DueKind;

/// Commands one sweep sends per shard; the rest wait for the next sweep.
pub const MAX_DUE_PER_SWEEP: usize = 4_096;

impl Shard {
    /// Commands due at `now_ms` (the sweeper's clock), and with `refill` the
    /// partitions that have debt or room below their burst in any dimension.
    pub(super) fn collect_due(
        &mut self,
        now_ms: TimestampMs,
        refill: bool,
    ) -> Vec<(PartitionKey, Command)> {
        // Entries stay until the reservation has moved on, so a command lost to a
        // failed append is simply sent again by the next sweep.
        let mut out = Vec::new();
        let mut stale = Vec::new();
        for entry in self.state.due.iter() {
            let (due_at, kind, key, id) = entry;
            if *due_at > now_ms || out.len() >= MAX_DUE_PER_SWEEP {
                break;
            }
            let state = self
                .state
                .partitions
                .get(key)
                .and_then(|ps| ps.partition.reservation(id))
                .map(|r| r.state);
            match (kind, state) {
                (
                    DueKind::LeaseExpiry,
                    Some(ReservationState::Reserved | ReservationState::Expiring),
                ) => {
                    out.push((key.clone(), Command::Expire { id: id.clone() }));
                }
                (DueKind::ExecutionLimit, Some(ReservationState::Started)) => {
                    out.push((key.clone(), Command::MarkUsageUnknown { id: id.clone() }));
                }
                _ => stale.push(entry.clone()),
            }
        }
        for entry in stale {
            self.state.due.remove(&entry);
        }
        if refill {
            for (key, ps) in &self.state.partitions {
                let p = &ps.partition;
                let Some(policy) = &p.policy else { continue };
                // Any dimension: a token bucket refills (and its debt is
                // repaid) while the requests bucket beside it is full.
                let mut debt = false;
                let mut below_burst = false;
                for (i, l) in p.ledgers().enumerate() {
                    debt |= l.debt_units().unwrap_or(0) > 0;
                    below_burst |= l.available_units.saturating_add(l.reserved_units)
                        < policy.limit(i).burst_units;
                }
                if debt || (below_burst && !p.closed) {
                    out.push((key.clone(), Command::Refill));
                }
            }
        }
        out
    }
}
