//! The client gateway's start scheduler, judged against its fairness budget.
//!
//! The gateway runs at most one or two provider calls at once (drawn per
//! process): its calls, once RESERVED, wait for their turn in the client
//! crate's [`StartScheduler`](reservoir_client::StartScheduler), weighted by
//! the tenants' weights. After every stretch of its tasks running (the world
//! yields to them, then reads), the scheduler's per-tenant readings
//! ([`TenantShare`]) are taken. Two readings at which two tenants both have
//! requests waiting, with neither's backlog begun again in between
//! (`backlogs` unchanged), bracket a stretch in which both waited
//! throughout; the starts each got in it must keep the budget
//! ([`FairnessGap`]: starts per weight within two starts of the lighter
//! tenant). Gate `scheduler_over_budget` fires when one does not.
//!
//! A stretch is measured from the first reading at which both waited, so
//! every reading checks the whole stretch so far. A new process brings a
//! new scheduler, and every stretch ends with the old one.

use reservoir_client::{FairnessGap, TenantShare};

use crate::report::StartFigures;

use super::*;

/// What a client gateway keeps between two readings of its scheduler.
#[derive(Default)]
pub(in crate::run) struct FairnessWatch {
    /// Per pair of tenants both waiting at the last reading: their starts
    /// when that stretch began.
    since: BTreeMap<(usize, usize), (u64, u64)>,
    /// Each tenant's backlog count at the last reading.
    last_backlogs: [u64; TENANTS.len()],
    /// Starts per tenant of the processes before this one.
    earlier_starts: [u64; TENANTS.len()],
    pub(in crate::run) figures: StartFigures,
}

impl FairnessWatch {
    /// The process ended: its scheduler's starts are kept, its stretches end.
    pub(super) fn restart(&mut self) {
        for (earlier, now) in self.earlier_starts.iter_mut().zip(&self.figures.starts) {
            *earlier = *now;
        }
        self.since.clear();
        self.last_backlogs = Default::default();
    }
}

/// One tenant's reading of the scheduler (zeros for a tenant it has not seen).
#[derive(Clone, Copy, Default)]
struct Reading {
    backlogs: u64,
    starts: u64,
    waiting: usize,
}

impl World {
    /// Reads the scheduler of `self.clients[client]` after its tasks ran
    /// (see the module docs).
    pub(super) fn read_scheduler(&mut self, client: usize) {
        let side = &mut self.clients[client];
        let shares = side.scheduler.shares();
        let read = |i: usize| -> Option<&TenantShare> {
            shares.iter().find(|s| s.tenant == TENANTS[i].name)
        };
        let watch = &mut side.fairness;
        let now: [Reading; TENANTS.len()] = std::array::from_fn(|i| {
            read(i).map_or(Reading::default(), |s| Reading {
                backlogs: s.backlogs,
                starts: s.starts,
                waiting: s.waiting,
            })
        });
        for (i, reading) in now.iter().enumerate() {
            watch.figures.starts[i] = watch.earlier_starts[i] + reading.starts;
        }
        let waited_throughout =
            |i: usize| now[i].waiting > 0 && now[i].backlogs == watch.last_backlogs[i];
        watch
            .since
            .retain(|&(i, j), _| waited_throughout(i) && waited_throughout(j));
        let mut over = Vec::new();
        for (&(i, j), &(si, sj)) in &watch.since {
            let (di, dj) = (now[i].starts - si, now[j].starts - sj);
            let gap = FairnessGap::between(
                (TENANTS[i].weight as u32, di),
                (TENANTS[j].weight as u32, dj),
            );
            watch.figures.judged += 1;
            let per_mille = (gap.gap * 1000).div_ceil(gap.budget) as u64;
            for t in [i, j] {
                let worst = &mut watch.figures.worst_per_mille[t];
                *worst = (*worst).max(per_mille);
            }
            if !gap.within() {
                over.push(format!(
                    "{} {di} starts (weight {}) and {} {dj} starts (weight {}) while both waited: \
                     {:.3} of the budget",
                    TENANTS[i].name,
                    TENANTS[i].weight,
                    TENANTS[j].name,
                    TENANTS[j].weight,
                    gap.used()
                ));
            }
        }
        for i in 0..TENANTS.len() {
            for j in i + 1..TENANTS.len() {
                if now[i].waiting > 0 && now[j].waiting > 0 {
                    watch
                        .since
                        .entry((i, j))
                        .or_insert((now[i].starts, now[j].starts));
                }
            }
        }
        for (last, reading) in watch.last_backlogs.iter_mut().zip(&now) {
            *last = reading.backlogs;
        }
        for detail in over {
            self.findings
                .push(finding(Gate::SchedulerOverBudget, detail));
        }
    }
}
