//! One request against the shard's state: what each kind of request decides,
//! reads or answers. Commands go through `reservoir_core::decide`; their events
//! are applied speculatively (`pipeline`) and answered once durable. Reads are
//! answered from state, after the batch that last changed what they read.

use crate::ratelimit::RateLimits;
use reservoir_core::{
    decide, decide_retired, refusal_event, Command, EventBody, PartitionKey, Policy, Rejection,
    RequestDigest, Reservation, ReservationId, TimestampMs,
};

use super::pipeline::{Batch, Pending, PositionFrom, Shard, Undo};
use super::protocol::{Amount, Answer, Failure, PartitionStatus, Request};
use super::retired::Retired;
use super::shard_of;

/// A record that left the partition's memory, and where its last event is.
pub(super) struct RetiredRecord {
    reservation: Reservation,
    position: PositionFrom,
}

impl From<Retired> for RetiredRecord {
    fn from(r: Retired) -> Self {
        RetiredRecord {
            position: PositionFrom::Known(r.position()),
            reservation: r.reservation,
        }
    }
}

impl Shard {
    /// This shard's committed state for a snapshot, unless the log is in
    /// doubt or failed: a failed append's batch was undone here although its
    /// records may have landed, so a snapshot now would pair a cut after them
    /// with a state without them, and a restart from it would skip them
    /// (found by reservoir-sim, seed 6859 of a 6,000-interleaving run).
    pub(super) fn snapshot(&self) -> Result<Answer, Failure> {
        let trouble = self
            .in_doubt
            .borrow()
            .clone()
            .or_else(|| self.fatal.borrow().clone());
        if let Some(reason) = trouble {
            return Err(Failure::Unavailable(format!(
                "no snapshot until the writers are rebuilt from the log ({reason})"
            )));
        }
        Ok(Answer::Snapshot(Box::new(self.state.clone())))
    }
    pub(super) fn decide_one(&mut self, batch: &mut Batch, request: Request) -> Pending {
        match request {
            Request::Publish {
                accounting_epoch,
                policy,
            } => {
                self.roll_epoch(batch, &(policy.subject.clone(), policy.route.clone()));
                match self.publish_key(&policy, accounting_epoch) {
                    Ok(key) => self.publish(batch, key, policy),
                    Err(failure) => Pending::Ready(Err(failure)),
                }
            }
            Request::Rollback {
                subject,
                route,
                generation,
            } => {
                self.roll_epoch(batch, &(subject.clone(), route.clone()));
                self.rollback(batch, subject, route, generation)
            }
            Request::GetPolicy { subject, route } => Pending::Ready(
                self.active_policy(&subject, &route)
                    .map(|(key, policy)| Answer::Policy {
                        key: key.clone(),
                        policy: Box::new(policy.clone()),
                    })
                    .ok_or(Failure::NoPolicy),
            ),
            Request::Reserve {
                subject,
                route,
                id,
                digest,
                amount,
            } => self.reserve(batch, subject, route, id, digest, amount),
            Request::Act { key, command } => self.act(batch, key, command, None),
            Request::Settle {
                key,
                id,
                operation_id,
                actual_units,
                usage,
            } => self.settle(batch, key, id, operation_id, actual_units, usage),
            Request::Get { key, id } => self.get(batch, &key, &id),
            Request::Snapshot => Pending::Ready(self.snapshot()),
            Request::Partitions => Pending::Ready(Ok(Answer::Partitions(
                self.state
                    .partitions
                    .iter()
                    .map(|(key, ps)| PartitionStatus {
                        key: key.clone(),
                        partition: ps.partition.without_reservations(),
                        reservations: ps.partition.reservations.len(),
                        invariants: ps.partition.check_invariants(),
                    })
                    .collect(),
            ))),
            Request::CollectDue { now_ms, refill } => {
                self.roll_epochs(batch);
                self.publish_shard_gauges(now_ms);
                Pending::Ready(Ok(Answer::Due(self.collect_due(now_ms, refill))))
            }
            Request::IssueShard(req) => self.issue_shard(batch, *req),
            Request::ReconcileShard(req) => self.reconcile_shard(batch, *req),
            Request::ListShards { subject, route } => Pending::Ready(Ok(Answer::Shards {
                shards: self.list_shards(&subject, route.as_deref()),
                now_ms: self.clock.now_ms(),
            })),
        }
    }

    /// The active partition of a subject/route and its policy.
    fn active_policy(&self, subject: &str, route: &str) -> Option<(&PartitionKey, &Policy)> {
        let key = self
            .state
            .active
            .get(&(subject.to_string(), route.to_string()))?;
        let policy = self.state.partitions.get(key)?.partition.policy.as_ref()?;
        Some((key, policy))
    }

    /// The writer's `now` for a partition: the clock, never behind the
    /// partition's last event (so time recorded in the log never goes back).
    pub(super) fn now_for(&self, key: &PartitionKey) -> TimestampMs {
        let last = self
            .state
            .partitions
            .get(key)
            .map(|ps| ps.partition.last_at_ms)
            .unwrap_or(0);
        self.clock.now_ms().max(last)
    }

    pub(super) fn rejected(&self, key: &PartitionKey, rejection: Rejection) -> Failure {
        let policy = self
            .state
            .partitions
            .get(key)
            .and_then(|ps| ps.partition.policy.as_ref());
        let limits = match rejection.is_admission_refusal() {
            true => self
                .state
                .partitions
                .get(key)
                .and_then(|ps| RateLimits::of(&ps.partition))
                .map(Box::new),
            false => None,
        };
        Failure::Rejected {
            rejection,
            policy_generation: policy.map(|p| p.generation),
            capacity_unit: policy.map(|p| p.capacity_unit),
            limits,
        }
    }

    /// A settle, its amounts in every dimension from what the caller reported.
    fn settle(
        &mut self,
        batch: &mut Batch,
        key: PartitionKey,
        id: ReservationId,
        operation_id: Option<reservoir_core::OperationId>,
        actual_units: Option<u64>,
        usage: Option<reservoir_core::Usage>,
    ) -> Pending {
        let Some(policy) = self
            .state
            .partitions
            .get(&key)
            .and_then(|ps| ps.partition.policy.as_ref())
        else {
            return Pending::Ready(Err(Failure::NoPolicy));
        };
        let (actual_units, further_actual_units) = match policy
            .used_units(actual_units, usage.as_ref())
        {
            Ok(units) => units,
            Err(e) => return Pending::Ready(Err(self.rejected(&key, Rejection::InvalidInput(e)))),
        };
        let command = Command::Settle {
            id,
            operation_id,
            actual_units,
            usage,
            further_actual_units,
        };
        self.act(batch, key, command, None)
    }

    /// A reserve: against the partition that already holds the id (a retry),
    /// else the subject/route's active one, sized there if it names no units.
    fn reserve(
        &mut self,
        batch: &mut Batch,
        subject: String,
        route: String,
        id: ReservationId,
        digest: RequestDigest,
        amount: Amount,
    ) -> Pending {
        let sr = (subject, route);
        self.roll_epoch(batch, &sr);
        let located = self.index.read().expect("index lock").get(&id).cloned();
        let (key, retired) = match located {
            Some(key) => (key, None),
            // Not in memory: a new id, or one that left memory (on disk).
            None => match self.retired.get(&id) {
                Err(err) => return Pending::Ready(Err(Failure::Unavailable(err))),
                Ok(Some(r)) => (r.key.clone(), Some(RetiredRecord::from(r))),
                Ok(None) => match self.state.active.get(&sr) {
                    Some(key) => (key.clone(), None),
                    None => return Pending::Ready(Err(Failure::NoPolicy)),
                },
            },
        };
        if shard_of(&key.subject, &key.route, self.shards) != self.id {
            // The id is held by another subject/route: the digests cannot match.
            return Pending::Ready(Err(
                self.rejected(&key, Rejection::ExistsWithDifferentDigest { id })
            ));
        }
        let (units, further_units, sizing) = match amount {
            // Explicit units name the primary dimension only: a policy with
            // further dimensions refuses them (`DimensionCount`) and is sized.
            Amount::Units(units) => (units, Vec::new(), None),
            Amount::Sized {
                counted_input_tokens,
                max_tokens,
            } => {
                let partition = self.state.partitions.get(&key).map(|ps| &ps.partition);
                let existing = partition
                    .and_then(|p| p.reservation(&id))
                    .or(retired.as_ref().map(|r| &r.reservation));
                match (existing, partition.and_then(|p| p.policy.as_ref())) {
                    // A retry: the digest (over the sizing inputs) decides, and
                    // the record keeps the units it was sized with back then.
                    (Some(existing), _) => (
                        existing.reserved_units,
                        existing.further.iter().map(|d| d.reserved_units).collect(),
                        existing.sizing,
                    ),
                    (None, Some(policy)) => {
                        match self.sizer.size(policy, counted_input_tokens, max_tokens) {
                            Ok(sizing) => {
                                let (units, further) = policy.sized_units(&sizing);
                                (units, further, Some(sizing))
                            }
                            Err(failure) => return Pending::Ready(Err(Failure::Sizing(failure))),
                        }
                    }
                    (None, None) => return Pending::Ready(Err(Failure::NoPolicy)),
                }
            }
        };
        self.act(
            batch,
            key,
            Command::Reserve {
                id,
                digest,
                units,
                sizing,
                further_units,
            },
            retired,
        )
    }

    /// The record of `id` if it left `key`'s memory: still waiting for its
    /// batch to land (`retiring`), or in the idempotency index (`disk`).
    fn retired_record(
        &self,
        batch: &Batch,
        key: &PartitionKey,
        id: &ReservationId,
        disk: bool,
    ) -> Result<Option<RetiredRecord>, Failure> {
        if let Some((k, r)) = self.retiring.get(id).filter(|(k, _)| k == key) {
            let position = self.position_of(batch, k, id).ok_or_else(|| {
                Failure::Internal(format!("no log position for retiring record {id}"))
            })?;
            return Ok(Some(RetiredRecord {
                reservation: r.clone(),
                position,
            }));
        }
        if !disk {
            return Ok(None);
        }
        match self.retired.get(id).map_err(Failure::Unavailable)? {
            Some(r) if r.key == *key => Ok(Some(r.into())),
            _ => Ok(None),
        }
    }

    fn get(&self, batch: &Batch, key: &PartitionKey, id: &ReservationId) -> Pending {
        let ps = self.state.partitions.get(key);
        let record = ps.and_then(|ps| ps.partition.reservation(id));
        if record.is_none() {
            return match self.retired_record(batch, key, id, true) {
                Err(failure) => Pending::Ready(Err(failure)),
                Ok(Some(r)) => Pending::Reservation {
                    key: key.clone(),
                    reservation: Box::new(r.reservation),
                    created: false,
                    position: r.position,
                },
                Ok(None) => Pending::Ready(Err(
                    self.rejected(key, Rejection::UnknownReservation { id: id.clone() })
                )),
            };
        }
        match (record, self.position_of(batch, key, id)) {
            (Some(r), Some(PositionFrom::Known(position))) => {
                Pending::Ready(Ok(Answer::Reservation {
                    key: key.clone(),
                    reservation: Box::new(r.clone()),
                    position,
                    created: false,
                    limits: None,
                }))
            }
            // Changed by the batch in flight: answered after it lands (or 503 with it).
            (Some(r), Some(position @ PositionFrom::Earlier { .. })) => Pending::Reservation {
                key: key.clone(),
                reservation: Box::new(r.clone()),
                created: false,
                position,
            },
            // Not yet durable (decided in this very batch) or unknown.
            _ => Pending::Ready(Err(
                self.rejected(key, Rejection::UnknownReservation { id: id.clone() })
            )),
        }
    }

    /// A publish: the first partition of a subject/route opens with its
    /// policy's `opening_units`; a later one (a higher generation) opens
    /// empty, the active one is closed for admission, and its capacity and
    /// debt move into the new one ([`super::moves`]), all in this batch.
    /// Generations only increase: a lower or equal one is refused.
    fn publish(&mut self, batch: &mut Batch, key: PartitionKey, policy: Policy) -> Pending {
        if let Some(current) = self.state.partitions.get(&key) {
            // A repeat: the same policy is the same answer; another one is refused.
            return match current.partition.policy.as_ref() == Some(&policy) {
                true => Pending::Published {
                    key,
                    created: false,
                    position: current.opened_at.map(PositionFrom::Known),
                },
                false => Pending::Ready(Err(Failure::Rejected {
                    rejection: Rejection::PartitionExistsWithDifferentPolicy,
                    policy_generation: Some(key.policy_generation),
                    capacity_unit: None,
                    limits: None,
                })),
            };
        }
        let sr = (key.subject.clone(), key.route.clone());
        let previous = self.state.active.get(&sr).cloned();
        if let Some(active) = &previous {
            if key.policy_generation <= active.policy_generation {
                return Pending::Ready(Err(Failure::Conflict {
                    code: "generation_not_higher",
                    detail: format!(
                        "generation {} is not above the active generation {}: generations only increase (publish a higher one, or roll back)",
                        key.policy_generation, active.policy_generation
                    ),
                }));
            }
        }
        if let Some(failure) = previous
            .as_ref()
            .and_then(|old| self.debt_left_behind(old, &policy))
        {
            return Pending::Ready(Err(failure));
        }
        let record = match self.open_next(batch, key.clone(), policy, previous) {
            Ok(record) => record,
            Err(failure) => return Pending::Ready(Err(failure)),
        };
        Pending::Published {
            key,
            created: true,
            position: Some(PositionFrom::Record(record)),
        }
    }

    /// The superseded partition: refilled up to now (the refill it earned is
    /// not lost), closed for admission, and its capacity and debt moved to
    /// `next`. Its reservations still finish there, and what they give back
    /// follows (`drain_onward`).
    pub(super) fn supersede(
        &mut self,
        batch: &mut Batch,
        old: &PartitionKey,
        next: &PartitionKey,
    ) -> Result<(), Failure> {
        let failpoint = super::moves::failpoint();
        if failpoint == Some(super::moves::Failpoint::AfterOpening) {
            batch.pause_after = true;
            return Ok(());
        }
        for command in [Command::Refill, Command::Close] {
            let now = self.now_for(old);
            let events = decide(&self.state.partitions[old].partition, &command, now)
                .map_err(|r| Failure::Internal(format!("superseding {old}: {r}")))?;
            if !events.is_empty() {
                self.commit_speculatively(batch, old, events);
            }
        }
        let paused = failpoint == Some(super::moves::Failpoint::BetweenHalves);
        if paused {
            batch.pause_after = true;
        }
        self.move_onward(batch, old, next, !paused)
    }

    /// A rollback: the generation below the active one runs again, as a new
    /// generation above every one so far (`generation`, by default the
    /// active one + 1), published like any other, so the rolled-back
    /// partition is closed and drains into it.
    pub(super) fn rollback(
        &mut self,
        batch: &mut Batch,
        subject: String,
        route: String,
        generation: Option<u64>,
    ) -> Pending {
        let Some(active) = self
            .state
            .active
            .get(&(subject.clone(), route.clone()))
            .cloned()
        else {
            return Pending::Ready(Err(Failure::NoPolicy));
        };
        let previous = self
            .latest_below(&active, active.policy_generation)
            .and_then(|(_, policy)| Some(policy?.clone()));
        if generation.is_none() && self.rolled_back_into(&active) {
            // The same rollback asked again (its answer lost): the active
            // generation already runs the policy below the one it replaced.
            // Rolling back once more would bring that one back; naming
            // `generation` does so on purpose.
            return self.publish_repeat(active);
        }
        let next = active.policy_generation.saturating_add(1);
        if generation.is_none() && next > reservoir_core::policy::MAX_GENERATION {
            // The active policy holds the highest generation there may be
            // (a rollback naming one gets the policy's own 422 instead).
            return Pending::Ready(Err(Failure::Conflict {
                code: "generation_exhausted",
                detail: format!(
                    "generation {} is the highest a policy may have: there is none above it to roll back into",
                    active.policy_generation
                ),
            }));
        }
        let generation = generation.unwrap_or(next);
        let Some(mut policy) = previous else {
            // A repeated rollback whose generation already runs is answered as done.
            return match self.state.active.get(&(subject, route)) {
                Some(k) if k.policy_generation == generation => self.publish_repeat(k.clone()),
                _ => Pending::Ready(Err(Failure::Conflict {
                    code: "no_previous_generation",
                    detail: format!(
                        "generation {} is the first of its subject and route: there is nothing to roll back to",
                        active.policy_generation
                    ),
                })),
            };
        };
        let key = PartitionKey {
            policy_generation: generation,
            ..active.clone()
        };
        if generation == active.policy_generation {
            // A retried rollback that already landed.
            return self.publish_repeat(key);
        }
        policy.generation = generation;
        self.publish(batch, key, policy)
    }

    /// Whether `active` runs the policy of the generation two below it (as
    /// a rollback from the generation between makes it), generation
    /// numbers aside.
    fn rolled_back_into(&self, active: &PartitionKey) -> bool {
        let unnumbered = |p: &reservoir_core::Policy| reservoir_core::Policy {
            generation: 0,
            ..p.clone()
        };
        let (Some((replaced, _)), Some(running)) = (
            self.latest_below(active, active.policy_generation),
            self.policy_of(active),
        ) else {
            return false;
        };
        self.latest_below(active, replaced)
            .and_then(|(_, restored)| restored)
            .is_some_and(|restored| unnumbered(restored) == unnumbered(running))
    }

    /// The generation below `generation` nearest it among `of`'s
    /// subject/route's partitions, and its policy (its latest epoch's).
    fn latest_below(
        &self,
        of: &PartitionKey,
        generation: u64,
    ) -> Option<(u64, Option<&reservoir_core::Policy>)> {
        self.state
            .partitions
            .iter()
            .filter(|(k, _)| {
                k.subject == of.subject && k.route == of.route && k.policy_generation < generation
            })
            .max_by_key(|(k, _)| (k.policy_generation, k.accounting_epoch.clone()))
            .map(|(k, ps)| (k.policy_generation, ps.partition.policy.as_ref()))
    }

    fn publish_repeat(&self, key: PartitionKey) -> Pending {
        let position = self
            .state
            .partitions
            .get(&key)
            .and_then(|ps| ps.opened_at)
            .map(PositionFrom::Known);
        Pending::Published {
            key,
            created: false,
            position,
        }
    }

    /// Decides `command` on `key`. `retired`: the record of the id the caller
    /// already found out of memory (a reserve's disk lookup); otherwise a
    /// command naming an id not in memory looks for it here.
    pub(super) fn act(
        &mut self,
        batch: &mut Batch,
        key: PartitionKey,
        command: Command,
        retired: Option<RetiredRecord>,
    ) -> Pending {
        let now = self.now_for(&key);
        let Some(ps) = self.state.partitions.get(&key) else {
            return Pending::Ready(Err(Failure::NoPolicy));
        };
        let retired = match (retired, command.reservation_id()) {
            (Some(r), _) => Some(r),
            (None, Some(id)) if ps.partition.reservation(id).is_none() => {
                // A reserve reached here only after its disk lookup missed.
                let disk = !matches!(command, Command::Reserve { .. });
                match self.retired_record(batch, &key, id, disk) {
                    Ok(r) => r,
                    Err(failure) => return Pending::Ready(Err(failure)),
                }
            }
            (None, _) => None,
        };
        if let Some(r) = retired {
            return match decide_retired(&ps.partition, &r.reservation, &command, now) {
                Ok(_) => Pending::Reservation {
                    key,
                    reservation: Box::new(r.reservation),
                    created: false,
                    position: r.position,
                },
                Err(rejection) => Pending::Ready(Err(self.rejected(&key, rejection))),
            };
        }
        let ps = &self.state.partitions[&key];
        match decide(&ps.partition, &command, now) {
            Ok(events) => {
                let created = events
                    .iter()
                    .any(|e| matches!(e.body, EventBody::Reserved { .. }));
                if created {
                    let id = command
                        .reservation_id()
                        .expect("reserve names an id")
                        .clone();
                    let mut index = self.index.write().expect("index lock");
                    match index.get(&id) {
                        Some(other) if *other != key => {
                            // Another shard took this id for another subject/route meanwhile.
                            drop(index);
                            return Pending::Ready(Err(
                                self.rejected(&key, Rejection::ExistsWithDifferentDigest { id })
                            ));
                        }
                        Some(_) => {}
                        None => {
                            index.insert(id.clone(), key.clone());
                            batch.undo.push(Undo::Index(id));
                        }
                    }
                }
                let record = if events.is_empty() {
                    None
                } else {
                    Some(self.commit_speculatively(batch, &key, events))
                };
                // The record as this command left it, read before a drain's
                // move: a closed partition that drains keeps only what
                // finished at its last event (`reservoir_core::retention`),
                // and the move may come a millisecond later.
                let r = command
                    .reservation_id()
                    .and_then(|id| self.state.partitions[&key].partition.reservation(id))
                    .cloned();
                if record.is_some() {
                    self.drain_onward(batch, &key);
                }
                let Some(id) = command.reservation_id() else {
                    return Pending::Ready(Ok(Answer::Done));
                };
                let Some(r) = r else {
                    return Pending::Ready(Err(
                        self.rejected(&key, Rejection::UnknownReservation { id: id.clone() })
                    ));
                };
                let position = match record {
                    Some(i) => PositionFrom::Record(i),
                    None => match self.position_of(batch, &key, id) {
                        Some(p) => p,
                        None => {
                            return Pending::Ready(Err(Failure::Internal(format!(
                                "no log position for {id}"
                            ))))
                        }
                    },
                };
                Pending::Reservation {
                    reservation: Box::new(r),
                    key,
                    created,
                    position,
                }
            }
            Err(rejection) => {
                let refusal = refusal_event(&ps.partition, &command, &rejection, now);
                let failure = self.rejected(&key, rejection);
                match refusal {
                    Some(event) => {
                        self.commit_speculatively(batch, &key, vec![event]);
                        Pending::Refused(failure)
                    }
                    None => Pending::Ready(Err(failure)),
                }
            }
        }
    }
}
