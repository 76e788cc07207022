//! The operator (generations published and rolled back, each change
//! retried as it was until answered) and the sweeper's collection.

use super::*;

/// An operator change of a subject/route, retried as it was until answered.
#[derive(Clone, Copy, Debug)]
pub(super) enum Change {
    Publish { generation: u64 },
    Rollback { generation: u64 },
}

/// The operator's view of one tenant's route.
pub(super) struct Line {
    pub(super) tenant: usize,
    pub(super) route: Route,
    /// The active generation, as last acknowledged.
    pub(super) generation: u64,
    /// The highest generation ever asked for.
    pub(super) asked: u64,
    pub(super) pending: Option<Change>,
}

impl World {
    /// The sweeper's collection, in a fixed order: the shard answers its
    /// refills in hash-map order, so they are sorted by partition here
    /// (expiries keep the shard's order, by due time).
    pub(super) async fn collect_due(
        &mut self,
        refill: bool,
    ) -> Vec<(usize, PartitionKey, Command)> {
        let now_ms = self.now();
        let mut all = Vec::new();
        for shard in 0..self.node.writers.shards() {
            let due = match self
                .node
                .writers
                .call(shard, Request::CollectDue { now_ms, refill })
                .await
            {
                Ok(Answer::Due(due)) => due,
                _ => continue,
            };
            let (mut refills, others): (Vec<_>, Vec<_>) = due
                .into_iter()
                .partition(|(_, c)| matches!(c, Command::Refill));
            refills.sort_by(|a, b| a.0.cmp(&b.0));
            all.extend(
                others
                    .into_iter()
                    .chain(refills)
                    .map(|(key, command)| (shard, key, command)),
            );
        }
        all
    }

    pub(super) fn operator_request(&mut self, quiet: bool) -> Option<(Origin, usize, Request)> {
        let pending = self.lines.iter().position(|l| l.pending.is_some());
        let i = match pending {
            Some(i) => i,
            None if !quiet && self.rng.chance(40) => {
                let i = self.rng.index(self.lines.len());
                let generation = self.lines[i].asked + 1;
                self.lines[i].asked = generation;
                let change = match self.lines[i].route == Route::Chat && self.rng.chance(300) {
                    true => Change::Rollback { generation },
                    false => Change::Publish { generation },
                };
                self.lines[i].pending = Some(change);
                i
            }
            None => return None,
        };
        let line = &self.lines[i];
        let tenant = TENANTS[line.tenant];
        let route = line.route;
        let request = match line.pending.expect("pending") {
            Change::Publish { generation } => Request::Publish {
                accounting_epoch: route.named_epoch(),
                policy: workload::policy(tenant, route, generation, generation % 3),
            },
            Change::Rollback { generation } => Request::Rollback {
                subject: tenant.name.to_string(),
                route: route.name().to_string(),
                generation: Some(generation),
            },
        };
        let shard = self.node.writers.shard_of(tenant.name, route.name());
        Some((Origin::Operator(i), shard, request))
    }

    pub(super) fn deliver_to_operator(&mut self, i: usize, reply: Reply, lost: bool) {
        let line = &self.lines[i];
        let what = format!(
            "operator {:?} {}/{}",
            line.pending,
            TENANTS[line.tenant].name,
            line.route.name()
        );
        let outcome = if lost {
            "LOST".to_string()
        } else {
            outcome_of(&reply)
        };
        self.note(format!("  {what} -> {outcome}"));
        if lost {
            return;
        }
        match reply {
            Ok(Answer::Published { key, .. }) => {
                let line = &mut self.lines[i];
                line.generation = key.policy_generation;
                line.pending = None;
                self.count("generation published");
            }
            Err(Failure::Unavailable(_)) => {}
            // A rollback with nothing to roll back to, or raced by an epoch roll.
            Err(Failure::Conflict { .. }) => self.lines[i].pending = None,
            Err(Failure::Internal(msg)) => {
                self.findings
                    .push(finding(Gate::WriterBroke, format!("{what}: {msg}")));
            }
            other => self.findings.push(finding(
                Gate::UnexpectedAnswer,
                format!("{what}: {other:?}"),
            )),
        }
    }
}

impl World {
    /// Every generation the operator was told is published is in the ledger.
    pub(super) fn check_lines(&self, live: &Partitions, out: &mut Vec<Finding>) {
        for line in &self.lines {
            let (subject, route) = (TENANTS[line.tenant].name, line.route.name());
            let held = live.keys().any(|k| {
                k.subject == subject && k.route == route && k.policy_generation == line.generation
            });
            if !held {
                out.push(finding(
                    Gate::ModelDisagrees,
                    format!(
                        "{subject}/{route}: told generation {} is published, the ledger has no partition of it",
                        line.generation
                    ),
                ));
            }
        }
    }
}
