//! Accounting epochs that roll by themselves. A policy whose `epoch_length`
//! is hourly, daily or monthly lives in one partition per epoch, named by the
//! epoch (`2026-11-03T14`, `2026-11-03`, `2026-11`) in the partition key's
//! `accounting_epoch`. The writer names the epoch a publish opens from the
//! time it assigns, and once that time has passed the active partition's
//! epoch it rolls: it opens the next epoch's partition under the same policy
//! and generation, closes the ended one and moves its capacity and debt
//! across ([`super::moves`]), all in one batch and so in one append.
//!
//! A roll happens at the first writer time at or after the boundary at which
//! a reserve, a publish or a rollback touches the subject/route, or a sweep
//! runs (every sweep interval), whichever is first: refill earned until then
//! is credited to the ended epoch and moves with its capacity. Reservations
//! made in the ended epoch finish there; what they give back drains onward.
//! Replay needs none of this: the roll is its events.

use reservoir_core::{decide, Command, Partition, PartitionKey, Policy};

use super::pipeline::{Batch, Shard, Undo};
use super::protocol::Failure;

impl Shard {
    /// The key a publish of `policy` opens: the epoch it names, or for a
    /// policy whose epochs roll the epoch holding the writer's time (a named
    /// one must be that epoch).
    pub(super) fn publish_key(
        &self,
        policy: &Policy,
        named: Option<String>,
    ) -> Result<PartitionKey, Failure> {
        let sr = (policy.subject.clone(), policy.route.clone());
        let now = match self.state.active.get(&sr) {
            Some(active) => self.now_for(active),
            None => self.clock.now_ms(),
        };
        let epoch = match (policy.epoch_length.epoch_of(now), named) {
            (None, Some(named)) => named,
            (None, None) => {
                return Err(Failure::Invalid {
                    code: "invalid_input",
                    detail: "accounting_epoch is required unless policy.epoch_length is hourly, daily or monthly".into(),
                })
            }
            (Some(current), None) => current.name,
            (Some(current), Some(named)) if named == current.name => named,
            (Some(current), Some(named)) => {
                return Err(Failure::Invalid {
                    code: "accounting_epoch_not_current",
                    detail: format!(
                        "the policy's {} epochs roll by themselves: the current one is {} (give that, or leave accounting_epoch out), not {named}",
                        policy.epoch_length.name(),
                        current.name
                    ),
                })
            }
        };
        PartitionKey::new(sr.0, sr.1, epoch, policy.generation).map_err(|e| Failure::Invalid {
            code: "invalid_input",
            detail: e.to_string(),
        })
    }

    /// Rolls the subject/route's active partition into the epoch holding the
    /// writer's time, if its policy's epochs roll and that epoch is not the
    /// active one's.
    pub(super) fn roll_epoch(&mut self, batch: &mut Batch, sr: &(String, String)) {
        let Some(active) = self.state.active.get(sr) else {
            return;
        };
        let policy = match self.state.partitions[active].partition.policy.as_ref() {
            Some(policy) if !policy.epoch_length.is_none() => policy.clone(),
            _ => return,
        };
        let active = active.clone();
        let now = self.now_for(&active);
        let Some(epoch) = policy.epoch_length.epoch_of(now) else {
            return;
        };
        if epoch.name == active.accounting_epoch {
            return;
        }
        let next = PartitionKey {
            accounting_epoch: epoch.name,
            ..active.clone()
        };
        if self.state.partitions.contains_key(&next) {
            tracing::error!(%active, %next, "epoch roll: the next epoch's partition exists already");
            return;
        }
        if let Err(failure) = self.open_next(batch, next.clone(), policy, Some(active.clone())) {
            // A bug: under the same policy every dimension moves, so
            // neither the close nor the moves can be refused.
            tracing::error!(%active, %next, ?failure, "epoch roll not decided");
        } else {
            tracing::info!(from = %active, to = %next, "accounting epoch rolled");
        }
    }

    /// Rolls every subject/route of this shard whose epoch has ended (the
    /// sweeper's call, so idle subjects roll too).
    pub(super) fn roll_epochs(&mut self, batch: &mut Batch) {
        let mut ended: Vec<(String, String)> = self
            .state
            .active
            .iter()
            .filter(|(_, key)| {
                let Some(policy) = self.state.partitions[*key].partition.policy.as_ref() else {
                    return false;
                };
                policy
                    .epoch_length
                    .epoch_of(self.now_for(key))
                    .is_some_and(|e| e.name != key.accounting_epoch)
            })
            .map(|(sr, _)| sr.clone())
            .collect();
        ended.sort();
        for sr in ended {
            self.roll_epoch(batch, &sr);
        }
    }

    /// Opens `key` under `policy` as the subject/route's active partition:
    /// the first one with its opening units, a later one (`previous` is the
    /// active one) empty, with `previous` closed and its capacity and debt
    /// moved in. Returns the index of the opening record in `batch`.
    pub(super) fn open_next(
        &mut self,
        batch: &mut Batch,
        key: PartitionKey,
        policy: Policy,
        previous: Option<PartitionKey>,
    ) -> Result<usize, Failure> {
        let now = match &previous {
            Some(old) => self.now_for(old).max(self.now_for(&key)),
            None => self.now_for(&key),
        };
        let command = match previous {
            None => Command::OpenPartition {
                key: key.clone(),
                policy,
            },
            Some(_) => Command::OpenSuccessor {
                key: key.clone(),
                policy,
            },
        };
        let events = decide(&Partition::default(), &command, now).map_err(|rejection| {
            Failure::Rejected {
                rejection,
                policy_generation: Some(key.policy_generation),
                capacity_unit: None,
                limits: None,
            }
        })?;
        let record = self.commit_speculatively(batch, &key, events);
        let sr = (key.subject.clone(), key.route.clone());
        batch.undo.push(Undo::Active(sr.clone(), previous.clone()));
        self.state.active.insert(sr, key.clone());
        if let Some(old) = previous {
            self.supersede(batch, &old, &key)?;
        }
        Ok(record)
    }
}
