//! Capacity and debt that cross partitions: the writer's side of a generation
//! switch, a rollback and the draining of closed partitions.
//!
//! A move is a `MovedOut` on the partition it leaves and a `MovedIn` on the
//! one it reaches, decided in the same batch, so both halves reach the log in
//! one append. Should a log ever hold only the first half (a log that lost the
//! tail of an append, or the `RESERVOIR_FAILPOINT_MOVE_HALVES` test failpoint,
//! which stops the writer between them), the first batch after recovery
//! completes it from the `MovedOut` alone ([`Shard::complete_half_moves`]):
//! what arrives is a function of what left, so the result is the same on any
//! node.
//!
//! A generation switch or an epoch roll is more than one move: the
//! successor's opening, the superseded partition's refill and close, then
//! the move. A log that keeps only the start of such a batch (Kafka
//! produces a batch's records one by one: an append that fails part way, or
//! that a newer claim lands in the middle of, keeps a prefix) leaves the
//! superseded partition open beside the active one, or closed with its
//! debt. The same first batch after recovery finishes it
//! ([`Shard::complete_supersessions`]): closes what is open and moves its
//! capacity and debt on. The refill it would have earned up to the switch
//! is not granted (what is missing is never made up in its favour).
//!
//! What moves: in every dimension the closed partition's `available`, up to
//! the next partition's room below its burst, and all of its debt. Capacity
//! beyond the room stays in the closed partition's `available`, still in its
//! equation and in the cross-partition sum, and is never admitted again
//! (closed); debt always moves whole, so it freezes the active partition.
//! Dimensions are matched by name: a dimension the next policy does not limit
//! keeps its capacity where it is, and a publish that would drop a dimension
//! still owing debt is refused.

use reservoir_core::{
    decide, Command, DimensionAmounts, EventBody, MoveId, Partition, PartitionKey, Policy,
    Rejection, Units,
};
use sha2::{Digest, Sha256};

use super::pipeline::{Batch, Shard};
use super::protocol::Failure;

/// Environment variable of the test failpoints: with `pause`, a publish
/// logs only the first half of its move; with `open-only`, only its
/// successor's opening (the superseded partition neither closed nor moved,
/// as a torn Kafka append can leave it). Either way the shard stops after
/// that batch is durable (until the process is killed). Never set outside
/// tests.
pub const FAILPOINT_MOVE_HALVES: &str = "RESERVOIR_FAILPOINT_MOVE_HALVES";

/// Where the test failpoint stops a publish, if it is armed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Failpoint {
    BetweenHalves,
    AfterOpening,
}

pub(super) fn failpoint() -> Option<Failpoint> {
    match std::env::var(FAILPOINT_MOVE_HALVES).as_deref() {
        Ok("pause") => Some(Failpoint::BetweenHalves),
        Ok("open-only") => Some(Failpoint::AfterOpening),
        _ => None,
    }
}

/// The id of the `n`th move out of `from` into `to`: derived from the
/// keys, so a move decided again after recovery gets the same id.
fn move_id(from: &PartitionKey, to: &PartitionKey, n: usize) -> MoveId {
    let digest = Sha256::digest(format!("{from}\n{to}\n{n}").as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    MoveId::new(format!(
        "mv-g{}-g{}-{n}-{hex}",
        from.policy_generation, to.policy_generation
    ))
    .expect("a move id is short and plain")
}

/// Index in `policy` of the dimension named as `from`'s dimension `i`.
fn same_dimension(from: &Policy, i: usize, to: &Policy) -> Option<usize> {
    let name = from.limit(i).dimension;
    (0..to.dimension_count()).find(|&j| to.limit(j).dimension == name)
}

/// Room below the burst of `p`'s dimension `j`.
fn room_units(p: &Partition, policy: &Policy, j: usize) -> Units {
    let l = p.ledger_of(j);
    policy
        .limit(j)
        .burst_units
        .saturating_sub(l.available_units.saturating_add(l.reserved_units))
}

/// The `MoveIn` that receives what a `MovedOut` (`units`, `debt_units` and
/// its further `Moved` amounts, in `from`'s dimensions) took.
fn arrival(
    move_id: MoveId,
    from_key: &PartitionKey,
    from: &Policy,
    to: &Policy,
    moved: &[(Units, Units)],
) -> Command {
    let mut amounts = vec![(0, 0); to.dimension_count()];
    for (i, &amount) in moved.iter().enumerate() {
        if let Some(j) = same_dimension(from, i, to) {
            amounts[j] = amount;
        }
    }
    let further = amounts[1..]
        .iter()
        .map(|&(units, debt_units)| DimensionAmounts::Moved { units, debt_units })
        .collect();
    Command::MoveIn {
        move_id,
        from: from_key.clone(),
        units: amounts[0].0,
        debt_units: amounts[0].1,
        further,
    }
}

/// The (units, debt) per dimension a move out recorded.
fn moved_amounts(
    units: Units,
    debt_units: Units,
    further: &[DimensionAmounts],
) -> Vec<(Units, Units)> {
    std::iter::once((units, debt_units))
        .chain(further.iter().map(|a| match *a {
            DimensionAmounts::Moved { units, debt_units } => (units, debt_units),
            _ => (0, 0),
        }))
        .collect()
}

/// The refusal of a publish that drops a dimension still owing debt.
fn dropped_debt(to: &PartitionKey) -> Failure {
    Failure::Rejected {
        rejection: Rejection::InvalidInput(reservoir_core::InvalidInput::Policy {
            field: "dimensions (a dimension owing debt cannot be dropped)",
        }),
        policy_generation: Some(to.policy_generation),
        capacity_unit: None,
        limits: None,
    }
}

impl Shard {
    /// The refusal of replacing `from` by a partition under `next`, when
    /// `next` drops a dimension `from` still owes debt in: checked before
    /// anything is opened or closed, since the debt could never move.
    pub(super) fn debt_left_behind(&self, from: &PartitionKey, next: &Policy) -> Option<Failure> {
        let from_policy = self.policy_of(from)?;
        let source = &self.state.partitions[from].partition;
        (0..from_policy.dimension_count())
            .any(|i| {
                same_dimension(from_policy, i, next).is_none()
                    && source.ledger_of(i).debt_units().unwrap_or(0) > 0
            })
            .then(|| {
                dropped_debt(&PartitionKey {
                    policy_generation: next.generation,
                    ..from.clone()
                })
            })
    }

    pub(super) fn policy_of(&self, key: &PartitionKey) -> Option<&Policy> {
        self.state.partitions.get(key)?.partition.policy.as_ref()
    }

    /// Moves what `from` can give onward into `to` (see the module docs),
    /// both halves in `batch`. Nothing when there is nothing to move. With
    /// `second_half` false (the failpoint) only the `MovedOut` is decided.
    pub(super) fn move_onward(
        &mut self,
        batch: &mut Batch,
        from: &PartitionKey,
        to: &PartitionKey,
        second_half: bool,
    ) -> Result<(), Failure> {
        let internal = |what: &str| Failure::Internal(format!("move {from} -> {to}: {what}"));
        let (Some(from_policy), Some(to_policy)) = (self.policy_of(from), self.policy_of(to))
        else {
            return Err(internal("a partition is not open"));
        };
        let (from_policy, to_policy) = (from_policy.clone(), to_policy.clone());
        let source = &self.state.partitions[from].partition;
        let target = &self.state.partitions[to].partition;
        let mut units = Vec::with_capacity(from_policy.dimension_count());
        let mut anything = false;
        for i in 0..from_policy.dimension_count() {
            let debt = source.ledger_of(i).debt_units().unwrap_or(0);
            let moved = match same_dimension(&from_policy, i, &to_policy) {
                Some(j) => source.movable_units(i, room_units(target, &to_policy, j)),
                None if debt > 0 => return Err(dropped_debt(to)),
                None => 0,
            };
            anything |= moved > 0 || debt > 0;
            units.push(moved);
        }
        if !anything {
            return Ok(());
        }
        let id = move_id(from, to, source.moves_out.len());
        let out = Command::MoveOut {
            move_id: id.clone(),
            to: to.clone(),
            units: units[0],
            further_units: units[1..].to_vec(),
        };
        let events = decide(source, &out, self.now_for(from))
            .map_err(|r| internal(&format!("move out refused: {r}")))?;
        let moved = match events.first().map(|e| (&e.body, &e.further)) {
            Some((
                EventBody::MovedOut {
                    units, debt_units, ..
                },
                further,
            )) => moved_amounts(*units, *debt_units, further),
            _ => return Err(internal("move out decided no MovedOut")),
        };
        self.commit_speculatively(batch, from, events);
        if second_half {
            let inn = arrival(id, from, &from_policy, &to_policy, &moved);
            let target = &self.state.partitions[to].partition;
            let events = decide(target, &inn, self.now_for(to))
                .map_err(|r| internal(&format!("move in refused: {r}")))?;
            self.commit_speculatively(batch, to, events);
        }
        Ok(())
    }

    /// After an event on a closed partition: whatever it gave back (a refund,
    /// a debt from a settle) moves on to the subject/route's active partition.
    pub(super) fn drain_onward(&mut self, batch: &mut Batch, key: &PartitionKey) {
        let closed = self
            .state
            .partitions
            .get(key)
            .is_some_and(|ps| ps.partition.closed);
        let active = self
            .state
            .active
            .get(&(key.subject.clone(), key.route.clone()))
            .cloned();
        if let (true, Some(active)) = (closed, active.filter(|a| a != key)) {
            if let Err(failure) = self.move_onward(batch, key, &active, true) {
                // The refund stays in the closed partition (in its books and in
                // the cross-partition sum) until the next event there moves it.
                tracing::warn!(%key, ?failure, "draining move not decided");
            }
        }
    }

    /// Finishes every supersession the log holds only the start of (see the
    /// module docs): a subject/route's partition that is not its active one
    /// yet is open, or is closed and still owes debt (which always moves
    /// whole, so only a lost tail leaves it). Closed, and what it can give
    /// moved into the active partition, in `batch`. Run once, before the
    /// first request a shard decides after recovery, after
    /// [`Shard::complete_half_moves`].
    pub(super) fn complete_supersessions(&mut self, batch: &mut Batch) {
        let mut torn: Vec<(PartitionKey, PartitionKey)> = self
            .state
            .partitions
            .iter()
            .filter_map(|(key, ps)| {
                let sr = (key.subject.clone(), key.route.clone());
                let active = self.state.active.get(&sr).filter(|a| *a != key)?;
                let p = &ps.partition;
                let owes = p.ledgers().any(|l| l.debt_units().unwrap_or(0) > 0);
                (p.policy.is_some() && (!p.closed || owes)).then(|| (key.clone(), active.clone()))
            })
            .collect();
        torn.sort();
        for (old, active) in torn {
            tracing::warn!(%old, %active, "finishing a supersession the log kept only the start of");
            let now = self.now_for(&old);
            match decide(&self.state.partitions[&old].partition, &Command::Close, now) {
                Ok(events) if !events.is_empty() => {
                    self.commit_speculatively(batch, &old, events);
                }
                Ok(_) => {}
                Err(rejection) => panic!("closing {old} after its successor opened: {rejection}"),
            }
            if let Err(failure) = self.move_onward(batch, &old, &active, true) {
                // As in `drain_onward`: it stays in the closed partition (in
                // its books and the cross-partition sum) until it can move.
                tracing::warn!(%old, ?failure, "move after a torn supersession not decided");
            }
        }
    }

    /// Completes every move whose `MovedOut` is in the log without its
    /// `MovedIn` (see the module docs), in `batch`. Run once, before the
    /// first request a shard decides after recovery.
    pub(super) fn complete_half_moves(&mut self, batch: &mut Batch) {
        let mut missing = Vec::new();
        for (key, ps) in &self.state.partitions {
            for (id, m) in &ps.partition.moves_out {
                let arrived = self
                    .state
                    .partitions
                    .get(&m.counterpart)
                    .map(|t| t.partition.moves_in.contains_key(id));
                if arrived == Some(false) {
                    missing.push((key.clone(), id.clone(), m.clone()));
                }
            }
        }
        missing.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        for (from, id, m) in missing {
            let (Some(from_policy), Some(to_policy)) =
                (self.policy_of(&from), self.policy_of(&m.counterpart))
            else {
                continue;
            };
            let moved = moved_amounts(m.units, m.debt_units, &m.further);
            let inn = arrival(id, &from, from_policy, to_policy, &moved);
            let to = m.counterpart;
            match decide(
                &self.state.partitions[&to].partition,
                &inn,
                self.now_for(&to),
            ) {
                Ok(events) if !events.is_empty() => {
                    tracing::warn!(%from, %to, "completing a move whose second half was not logged");
                    self.commit_speculatively(batch, &to, events);
                }
                Ok(_) => {}
                Err(rejection) => {
                    panic!("move {from} -> {to}: cannot complete its second half: {rejection}")
                }
            }
        }
    }
}
