//! The aggregate: one ledger partition's state, and `apply`, the only code that
//! changes it.
//!
//! `apply` is written as *check, then commit*: it computes the new ledger in a
//! copy, validates every transition, amount and the conservation equation, and
//! only then mutates. So the live path can assert it never fails on events
//! `decide` produced, while replay of an untrusted log calls [`try_apply`] and
//! gets a typed finding instead of a crash or a half-applied event.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::dimension::{DimensionAmounts, DimensionHold, DimensionState};
use crate::effect::{check_refill_burst, next_further};
pub use crate::effect::{dimension_effect, ledger_effect, primary_amounts};
use crate::event::{Event, EventBody};
use crate::ledger::{ConservationError, Ledger};
use crate::policy::Policy;
use crate::reservation::{Reservation, ReservationState};
use crate::types::{MoveId, PartitionKey, ReservationId, ShardId, TimestampMs, Units};

/// Emergency shards issued by one partition (over its whole life: a
/// generation issues shards rarely; publish a new one to issue more).
pub const MAX_SHARDS_PER_PARTITION: usize = 4_096;

/// Capacity moves recorded by one partition, each direction (over its whole
/// life: one per generation switch or epoch roll-over in practice).
pub const MAX_MOVES_PER_PARTITION: usize = 4_096;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedShard {
    pub units: Units,
    pub gateway_id: String,
    pub boot_epoch: u64,
    pub expires_at_ms: TimestampMs,
    /// Writer time of the `ShardIssued` event.
    #[serde(default)]
    pub issued_at_ms: TimestampMs,
    #[serde(default)]
    pub fence_epoch: u64,
    #[serde(default)]
    pub signature: String,
}

/// A reconciled shard, as the partition it was reminted into records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemintedShard {
    pub source: PartitionKey,
    pub units: Units,
    #[serde(default)]
    pub issued_units: Units,
    #[serde(default)]
    pub spent_units: Units,
    #[serde(default)]
    pub unknown_units: Units,
    #[serde(default)]
    pub excess_units: Units,
    /// Writer time of the `ShardReminted` event.
    #[serde(default)]
    pub at_ms: TimestampMs,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// The other partition (destination of a move out, source of a move in).
    pub counterpart: PartitionKey,
    pub units: Units,
    pub debt_units: Units,
    /// What moved in each further dimension (all `DimensionAmounts::Moved`).
    #[serde(default)]
    pub further: Vec<DimensionAmounts>,
}

/// State of one ledger partition. `Default` is the partition before it was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub key: Option<PartitionKey>,
    pub policy: Option<Policy>,
    pub ledger: Ledger,
    /// The records in memory: every open reservation, and the finished ones
    /// still inside the idempotency window (see [`crate::retention`]).
    pub reservations: BTreeMap<ReservationId, Reservation>,
    /// Finished records in memory, in the order they finished (time, id).
    #[serde(default)]
    pub finished: VecDeque<(TimestampMs, ReservationId)>,
    /// Finished records that have left memory so far.
    #[serde(default)]
    pub evicted_reservations: u64,
    /// Reservations in a state that holds capacity.
    pub open_reservations: usize,
    pub refill_anchor_ms: TimestampMs,
    pub refill_remainder: u64,
    pub last_sequence: u64,
    pub last_at_ms: TimestampMs,
    pub closed: bool,
    pub refusals: u64,
    pub shards_issued: BTreeMap<ShardId, IssuedShard>,
    pub shards_reminted: BTreeMap<ShardId, RemintedShard>,
    pub moves_out: BTreeMap<MoveId, Move>,
    pub moves_in: BTreeMap<MoveId, Move>,
    /// The policy's further dimensions, in policy order (see
    /// [`crate::dimension`]); `ledger` and `refill_remainder` are the primary's.
    #[serde(default)]
    pub further: Vec<DimensionState>,
}

/// An event that cannot be applied to this state: live, a bug; in replay, a
/// corrupt or tampered log.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ApplyError {
    #[error("sequence gap: expected {expected}, found {found}")]
    SequenceGap { expected: u64, found: u64 },
    #[error("time went backwards: event at {at_ms} ms after {last_ms} ms")]
    TimeWentBackwards { at_ms: u64, last_ms: u64 },
    #[error("event before the partition was opened")]
    NotOpen,
    #[error("partition opened twice")]
    AlreadyOpen,
    #[error("event names unknown reservation {0}")]
    UnknownReservation(ReservationId),
    #[error("reservation {0} created twice")]
    DuplicateReservation(ReservationId),
    #[error("illegal transition {from:?} -> {to:?} for {id}")]
    IllegalTransition {
        id: ReservationId,
        from: ReservationState,
        to: ReservationState,
    },
    #[error("amounts do not add up: {0}")]
    Inconsistent(&'static str),
    #[error("a term would overflow or go below zero")]
    Arithmetic,
    #[error(transparent)]
    Conservation(#[from] ConservationError),
}

pub(crate) fn add(a: Units, b: Units) -> Result<Units, ApplyError> {
    a.checked_add(b).ok_or(ApplyError::Arithmetic)
}
pub(crate) fn sub(a: Units, b: Units) -> Result<Units, ApplyError> {
    a.checked_sub(b).ok_or(ApplyError::Arithmetic)
}

impl Partition {
    /// A closed partition with nothing left to give onward: nothing reserved
    /// and no debt in any dimension, and no emergency shard issued (shard
    /// reconciliation is recorded in the partition that remints, so one that
    /// issued shards is never reported drained here). Its `available` may be
    /// above zero only where the partition after it had no room below its
    /// burst for it (see `MovedOut`): closed, so never admitted again.
    pub fn drained(&self) -> bool {
        self.closed
            && self.open_reservations == 0
            && self.shards_issued.is_empty()
            && self
                .ledgers()
                .all(|l| l.reserved_units == 0 && l.debt_units() == Some(0))
    }

    /// What a move onward takes from this partition in dimension `i`: all of
    /// its `available`, limited to `room_units` (the next partition's room
    /// below its burst); the debt always moves whole.
    pub fn movable_units(&self, i: usize, room_units: Units) -> Units {
        self.ledger_of(i).available_units.min(room_units)
    }

    pub fn is_open(&self) -> bool {
        self.policy.is_some()
    }

    pub fn reservation(&self, id: &ReservationId) -> Option<&Reservation> {
        self.reservations.get(id)
    }

    /// A copy of everything but the reservation map and the finished queue
    /// (both can be large): for savepoints and status views.
    pub fn without_reservations(&self) -> Partition {
        // Destructured field by field: a field added to `Partition` must be
        // named here, so no copy can silently leave part of the state behind.
        let Partition {
            key,
            policy,
            ledger,
            reservations: _,
            finished: _,
            evicted_reservations,
            open_reservations,
            refill_anchor_ms,
            refill_remainder,
            last_sequence,
            last_at_ms,
            closed,
            refusals,
            shards_issued,
            shards_reminted,
            moves_out,
            moves_in,
            further,
        } = self;
        Partition {
            key: key.clone(),
            policy: policy.clone(),
            ledger: *ledger,
            reservations: BTreeMap::new(),
            finished: VecDeque::new(),
            evicted_reservations: *evicted_reservations,
            open_reservations: *open_reservations,
            refill_anchor_ms: *refill_anchor_ms,
            refill_remainder: *refill_remainder,
            last_sequence: *last_sequence,
            last_at_ms: *last_at_ms,
            closed: *closed,
            refusals: *refusals,
            shards_issued: shards_issued.clone(),
            shards_reminted: shards_reminted.clone(),
            moves_out: moves_out.clone(),
            moves_in: moves_in.clone(),
            further: further.clone(),
        }
    }

    /// Outstanding debt in the primary dimension (0 for a consistent ledger
    /// that has none).
    pub fn debt_units(&self) -> Units {
        self.ledger.debt_units().unwrap_or(0)
    }

    /// The ledger of dimension `i` (0 = primary). Panics past the last.
    pub fn ledger_of(&self, i: usize) -> &Ledger {
        match i {
            0 => &self.ledger,
            i => &self.further[i - 1].ledger,
        }
    }

    /// The carried refill remainder of dimension `i` (0 = primary).
    pub fn refill_remainder_of(&self, i: usize) -> u64 {
        match i {
            0 => self.refill_remainder,
            i => self.further[i - 1].refill_remainder,
        }
    }

    /// Every dimension's ledger, primary first.
    pub fn ledgers(&self) -> impl Iterator<Item = &Ledger> {
        std::iter::once(&self.ledger).chain(self.further.iter().map(|d| &d.ledger))
    }

    /// Conservation in every dimension (O(1) per dimension).
    pub fn check_ledgers(&self) -> Result<(), ConservationError> {
        self.ledgers().try_for_each(Ledger::check)
    }

    /// Full invariant check, including the O(n) sum over open reservations.
    /// Tests call it after every event; `apply` runs the O(1) part itself.
    ///
    /// Panics if the record bookkeeping is broken (an open count or a finished
    /// queue that does not match the records): a bug, never an input error.
    pub fn check_invariants(&self) -> Result<(), ConservationError> {
        self.check_ledgers()?;
        let open = self
            .reservations
            .values()
            .filter(|r| !r.state.is_terminal())
            .count();
        assert_eq!(open, self.open_reservations, "open reservation count");
        assert_eq!(
            self.finished.len(),
            self.reservations.len() - open,
            "finished queue length"
        );
        let mut last = 0;
        for (at, id) in &self.finished {
            let r = self.reservations.get(id).expect("queued record in memory");
            assert!(r.state.is_terminal() && r.finished_at_ms == Some(*at) && *at >= last);
            last = *at;
        }
        let held: u128 = self
            .reservations
            .values()
            .filter(|r| r.state.holds_capacity())
            .map(|r| u128::from(r.held_units))
            .sum();
        if held != u128::from(self.ledger.reserved_units) {
            return Err(ConservationError::ReservedMismatch {
                ledger: self.ledger.reserved_units,
                records: held,
            });
        }
        for (i, dimension) in self.further.iter().enumerate() {
            let held: u128 = self
                .reservations
                .values()
                .filter(|r| r.state.holds_capacity())
                .map(|r| u128::from(r.further[i].held_units))
                .sum();
            if held != u128::from(dimension.ledger.reserved_units) {
                return Err(ConservationError::ReservedMismatch {
                    ledger: dimension.ledger.reserved_units,
                    records: held,
                });
            }
        }
        Ok(())
    }

    /// Replays events from scratch into a fresh partition.
    pub fn replay<'a>(
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Partition, (u64, ApplyError)> {
        let mut p = Partition::default();
        for e in events {
            try_apply(&mut p, e).map_err(|err| (e.sequence, err))?;
        }
        Ok(p)
    }
}

/// Folds one event into state. Panics if the event is invalid for this state,
/// which for events produced by `decide` is a bug (TigerBeetle style: a broken
/// invariant crashes, it is never logged and ignored). Records whose
/// idempotency window passed leave memory and are dropped; the writer, which
/// keeps them on disk, calls [`apply_evicting`].
pub fn apply(partition: &mut Partition, event: &Event) {
    apply_evicting(partition, event, &mut Vec::new());
}

/// [`apply`], handing the records that left memory to `evicted` (oldest first).
pub fn apply_evicting(partition: &mut Partition, event: &Event, evicted: &mut Vec<Reservation>) {
    if let Err(err) = try_apply_evicting(partition, event, evicted) {
        panic!("apply failed on sequence {}: {err}", event.sequence);
    }
    // `try_apply` committed only a balanced ledger; checked again on this side
    // of the write, in the build we ship (O(1): the O(n) sum over open
    // reservations is `check_invariants`, which tests run after every event).
    assert_eq!(
        partition.check_ledgers(),
        Ok(()),
        "books unbalanced after sequence {}",
        event.sequence
    );
    assert_eq!(partition.last_sequence, event.sequence);
}

/// Folds one event into state, or reports why it cannot, leaving state untouched.
///
/// Check, then commit: the event is validated against the records, the new ledger
/// is computed in a copy ([`ledger_effect`]) and checked for conservation, and
/// only then is anything mutated. This is the writer's hot path, so a reservation
/// is looked up once per event and the check and the mutation share the lookup.
///
/// After the event, finished records whose window passed leave memory
/// ([`crate::retention`]); here they are dropped (see [`try_apply_evicting`]).
pub fn try_apply(p: &mut Partition, event: &Event) -> Result<(), ApplyError> {
    try_apply_evicting(p, event, &mut Vec::new())
}

/// [`try_apply`], handing the records that left memory to `evicted`. On an
/// error nothing changed and nothing was evicted.
pub fn try_apply_evicting(
    p: &mut Partition,
    event: &Event,
    evicted: &mut Vec<Reservation>,
) -> Result<(), ApplyError> {
    let expected = p
        .last_sequence
        .checked_add(1)
        .ok_or(ApplyError::Arithmetic)?;
    if event.sequence != expected {
        return Err(ApplyError::SequenceGap {
            expected,
            found: event.sequence,
        });
    }
    if event.at_ms < p.last_at_ms {
        return Err(ApplyError::TimeWentBackwards {
            at_ms: event.at_ms,
            last_ms: p.last_at_ms,
        });
    }
    if !p.is_open() && !matches!(event.body, EventBody::PartitionOpened { .. }) {
        return Err(ApplyError::NotOpen);
    }
    let body = &event.body;
    let further = next_further(p, event)?;
    let ledger = if let EventBody::Reserved { id, .. } = body {
        let Entry::Vacant(slot) = p.reservations.entry(id.clone()) else {
            return Err(ApplyError::DuplicateReservation(id.clone()));
        };
        let record = new_record(body, &event.further, event.at_ms)?;
        let ledger = next_ledger(&p.ledger, p.policy.as_ref(), body)?;
        let open = p
            .open_reservations
            .checked_add(1)
            .ok_or(ApplyError::Arithmetic)?;
        slot.insert(record);
        p.open_reservations = open;
        ledger
    } else if let Some(id) = moved_reservation(body) {
        let r = p
            .reservations
            .get_mut(id)
            .ok_or_else(|| ApplyError::UnknownReservation(id.clone()))?;
        let to = check_move(r, body, &event.further)?;
        let ledger = next_ledger(&p.ledger, p.policy.as_ref(), body)?;
        let open = if to.is_terminal() {
            // An open record is moving to a terminal state, so the count is >= 1.
            p.open_reservations
                .checked_sub(1)
                .ok_or(ApplyError::Arithmetic)?
        } else {
            p.open_reservations
        };
        move_record(r, body, &event.further, to, event.at_ms);
        p.open_reservations = open;
        if to.is_terminal() {
            p.finished.push_back((event.at_ms, id.clone()));
        }
        ledger
    } else {
        check_other(p, body)?;
        let ledger = next_ledger(&p.ledger, p.policy.as_ref(), body)?;
        commit_other(p, event);
        ledger
    };
    p.ledger = ledger;
    if let Some(further) = further {
        p.further = further;
    }
    p.last_sequence = event.sequence;
    p.last_at_ms = event.at_ms;
    crate::retention::evict_due(p, event.at_ms, evicted);
    Ok(())
}

/// The ledger after `body`, checked: every term in range, the conservation
/// equation, debt >= 0, and a refill never lifting the bucket above the burst.
fn next_ledger(
    ledger: &Ledger,
    policy: Option<&Policy>,
    body: &EventBody,
) -> Result<Ledger, ApplyError> {
    let mut l = *ledger;
    ledger_effect(&mut l, body)?;
    if let (
        EventBody::Refilled {
            minted_units,
            repaid_units,
            ..
        },
        Some(policy),
    ) = (body, policy)
    {
        check_refill_burst(&l, *minted_units, *repaid_units, policy.burst_units)?;
    }
    l.check()?;
    Ok(l)
}

/// The state a settlement ends in.
fn settled_state(with_debt: bool) -> ReservationState {
    if with_debt {
        ReservationState::SettledWithDebt
    } else {
        ReservationState::Settled
    }
}

/// The units a settlement releases from `reserved`, as the event states them:
/// `held = actual + refunded − from_available − overdraft`.
pub(crate) fn settled_held_units(
    actual_units: Units,
    refunded_units: Units,
    from_available_units: Units,
    overdraft_units: Units,
) -> Result<Units, ApplyError> {
    sub(
        add(actual_units, refunded_units)?,
        add(from_available_units, overdraft_units)?,
    )
}

/// The reservation an event moves to a new state (not the one a `Reserved` creates).
fn moved_reservation(body: &EventBody) -> Option<&ReservationId> {
    match body {
        EventBody::Started { id, .. }
        | EventBody::Settled { id, .. }
        | EventBody::Released { id, .. }
        | EventBody::Expired { id, .. }
        | EventBody::ExpiryBegan { id }
        | EventBody::UsageUnknown { id } => Some(id),
        _ => None,
    }
}

/// The record a `Reserved` event creates, after checking its amounts agree.
fn new_record(
    body: &EventBody,
    further: &[DimensionAmounts],
    at: TimestampMs,
) -> Result<Reservation, ApplyError> {
    let EventBody::Reserved {
        id,
        digest,
        reserved_units,
        held_units,
        expires_at_ms,
        shadow,
        shadow_dimension,
        sizing,
    } = body
    else {
        unreachable!("called for Reserved only");
    };
    let holds = |reserved: Units, held: Units| {
        if held > reserved || (shadow.is_none() && held != reserved) {
            return Err(ApplyError::Inconsistent(
                "held units differ from reserved units outside shadow mode",
            ));
        }
        Ok(DimensionHold {
            reserved_units: reserved,
            held_units: held,
            ..DimensionHold::default()
        })
    };
    holds(*reserved_units, *held_units)?;
    let further = further
        .iter()
        .map(|a| match a {
            DimensionAmounts::Reserved {
                reserved_units,
                held_units,
            } => holds(*reserved_units, *held_units),
            _ => unreachable!("shape checked by next_further"),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Reservation {
        id: id.clone(),
        digest: *digest,
        reserved_units: *reserved_units,
        held_units: *held_units,
        actual_units: None,
        overdraft_units: 0,
        operation_id: None,
        state: ReservationState::Reserved,
        reserved_at_ms: at,
        expires_at_ms: *expires_at_ms,
        started_at_ms: None,
        execution_deadline_ms: None,
        finished_at_ms: None,
        shadow: *shadow,
        shadow_dimension: *shadow_dimension,
        sizing: *sizing,
        further,
    })
}

/// Checks that `body` moves `r` along an allowed edge with amounts matching the
/// record, and returns the state it moves to.
fn check_move(
    r: &Reservation,
    body: &EventBody,
    further: &[DimensionAmounts],
) -> Result<ReservationState, ApplyError> {
    let to = match body {
        EventBody::Started { .. } => ReservationState::Started,
        EventBody::Settled {
            overdraft_units, ..
        } => {
            let further_overdraft = further.iter().any(|a| {
                matches!(a, DimensionAmounts::Settled { overdraft_units, .. } if *overdraft_units > 0)
            });
            settled_state(*overdraft_units > 0 || further_overdraft)
        }
        EventBody::Released { .. } => ReservationState::Released,
        EventBody::Expired { .. } => ReservationState::Expired,
        EventBody::ExpiryBegan { .. } => ReservationState::Expiring,
        EventBody::UsageUnknown { .. } => ReservationState::UsageUnknown,
        _ => unreachable!("not a reservation move"),
    };
    if !r.state.can_move_to(to) {
        return Err(ApplyError::IllegalTransition {
            id: r.id.clone(),
            from: r.state,
            to,
        });
    }
    match body {
        EventBody::Settled {
            actual_units,
            refunded_units,
            from_available_units,
            overdraft_units,
            overdraft_limit_breached: _,
            from_usage_unknown,
            ..
        } => {
            if *from_usage_unknown != (r.state == ReservationState::UsageUnknown) {
                return Err(ApplyError::Inconsistent(
                    "from_usage_unknown does not match the record",
                ));
            }
            check_settled(
                r.held_units,
                *actual_units,
                *refunded_units,
                *from_available_units,
                *overdraft_units,
            )?;
            for (hold, amounts) in r.further.iter().zip(further) {
                let DimensionAmounts::Settled {
                    actual_units,
                    refunded_units,
                    from_available_units,
                    overdraft_units,
                    ..
                } = amounts
                else {
                    unreachable!("shape checked by next_further");
                };
                check_settled(
                    hold.held_units,
                    *actual_units,
                    *refunded_units,
                    *from_available_units,
                    *overdraft_units,
                )?;
            }
        }
        EventBody::Released { refunded_units, .. } | EventBody::Expired { refunded_units, .. } => {
            let refunds = further.iter().map(|a| match a {
                DimensionAmounts::Refunded { refunded_units } => *refunded_units,
                _ => unreachable!("shape checked by next_further"),
            });
            let all_held = std::iter::once(*refunded_units)
                .chain(refunds)
                .eq(std::iter::once(r.held_units).chain(r.further.iter().map(|h| h.held_units)));
            if !all_held {
                return Err(ApplyError::Inconsistent(
                    "a release or expiry refunds exactly the held units",
                ));
            }
        }
        _ => {}
    }
    Ok(to)
}

/// A settlement's amounts against the units its record held, in one dimension.
fn check_settled(
    held_units: Units,
    actual_units: Units,
    refunded_units: Units,
    from_available_units: Units,
    overdraft_units: Units,
) -> Result<(), ApplyError> {
    let held = settled_held_units(
        actual_units,
        refunded_units,
        from_available_units,
        overdraft_units,
    );
    let refund_and_excess = refunded_units > 0 && (from_available_units > 0 || overdraft_units > 0);
    if held != Ok(held_units) || refund_and_excess {
        return Err(ApplyError::Inconsistent(
            "actual != held - refunded + from_available + overdraft",
        ));
    }
    Ok(())
}

fn move_record(
    r: &mut Reservation,
    body: &EventBody,
    further: &[DimensionAmounts],
    to: ReservationState,
    at: TimestampMs,
) {
    r.state = to;
    match body {
        EventBody::Started {
            operation_id,
            execution_deadline_ms,
            ..
        } => {
            r.operation_id = Some(operation_id.clone());
            r.started_at_ms = Some(at);
            r.execution_deadline_ms = Some(*execution_deadline_ms);
        }
        EventBody::Settled {
            actual_units,
            overdraft_units,
            ..
        } => {
            r.actual_units = Some(*actual_units);
            r.overdraft_units = *overdraft_units;
            r.finished_at_ms = Some(at);
            for (hold, amounts) in r.further.iter_mut().zip(further) {
                if let DimensionAmounts::Settled {
                    actual_units,
                    overdraft_units,
                    ..
                } = amounts
                {
                    hold.actual_units = Some(*actual_units);
                    hold.overdraft_units = *overdraft_units;
                }
            }
        }
        EventBody::Released { .. } | EventBody::Expired { .. } => r.finished_at_ms = Some(at),
        _ => {}
    }
}

/// Record checks for events that create or move no reservation.
fn check_other(p: &Partition, body: &EventBody) -> Result<(), ApplyError> {
    match body {
        EventBody::PartitionOpened {
            key,
            policy,
            opening_units,
        } => {
            if p.is_open() {
                return Err(ApplyError::AlreadyOpen);
            }
            // A successor opens with nothing (`Command::OpenSuccessor`).
            let opening_ok = *opening_units == policy.opening_units || *opening_units == 0;
            if !opening_ok || key.policy_generation != policy.generation {
                return Err(ApplyError::Inconsistent(
                    "opening units or generation differ from the policy",
                ));
            }
        }
        EventBody::ShardIssued { shard_id, .. } if p.shards_issued.contains_key(shard_id) => {
            return Err(ApplyError::Inconsistent("shard issued twice"));
        }
        EventBody::ShardReminted { shard_id, .. } if p.shards_reminted.contains_key(shard_id) => {
            return Err(ApplyError::Inconsistent("shard reminted twice"));
        }
        EventBody::MovedOut { move_id, .. } if p.moves_out.contains_key(move_id) => {
            return Err(ApplyError::Inconsistent("move out recorded twice"));
        }
        EventBody::MovedIn { move_id, .. } if p.moves_in.contains_key(move_id) => {
            return Err(ApplyError::Inconsistent("move in recorded twice"));
        }
        _ => {}
    }
    Ok(())
}

/// The mutation of everything but the ledger for events that create or move no
/// reservation. Runs only after every check passed.
fn commit_other(p: &mut Partition, event: &Event) {
    match &event.body {
        EventBody::PartitionOpened { key, policy, .. } => {
            p.key = Some(key.clone());
            p.policy = Some(policy.clone());
            p.refill_anchor_ms = event.at_ms;
        }
        EventBody::Refilled { remainder, .. } => {
            p.refill_anchor_ms = event.at_ms;
            p.refill_remainder = *remainder;
        }
        EventBody::AdmissionRefused { .. } => p.refusals += 1,
        EventBody::ShardIssued {
            shard_id,
            units,
            gateway_id,
            boot_epoch,
            expires_at_ms,
            fence_epoch,
            signature,
        } => {
            let shard = IssuedShard {
                units: *units,
                gateway_id: gateway_id.clone(),
                boot_epoch: *boot_epoch,
                expires_at_ms: *expires_at_ms,
                issued_at_ms: event.at_ms,
                fence_epoch: *fence_epoch,
                signature: signature.clone(),
            };
            p.shards_issued.insert(shard_id.clone(), shard);
        }
        EventBody::ShardReminted {
            shard_id,
            source,
            units,
            issued_units,
            spent_units,
            unknown_units,
            excess_units,
        } => {
            let rec = RemintedShard {
                source: source.clone(),
                units: *units,
                issued_units: *issued_units,
                spent_units: *spent_units,
                unknown_units: *unknown_units,
                excess_units: *excess_units,
                at_ms: event.at_ms,
            };
            p.shards_reminted.insert(shard_id.clone(), rec);
        }
        EventBody::Closed => p.closed = true,
        EventBody::MovedOut {
            move_id,
            to,
            units,
            debt_units,
        } => {
            let m = Move {
                counterpart: to.clone(),
                units: *units,
                debt_units: *debt_units,
                further: event.further.clone(),
            };
            p.moves_out.insert(move_id.clone(), m);
        }
        EventBody::MovedIn {
            move_id,
            from,
            units,
            debt_units,
        } => {
            let m = Move {
                counterpart: from.clone(),
                units: *units,
                debt_units: *debt_units,
                further: event.further.clone(),
            };
            p.moves_in.insert(move_id.clone(), m);
        }
        EventBody::Reserved { .. }
        | EventBody::Started { .. }
        | EventBody::Settled { .. }
        | EventBody::Released { .. }
        | EventBody::Expired { .. }
        | EventBody::ExpiryBegan { .. }
        | EventBody::UsageUnknown { .. } => {
            unreachable!("reservation events are committed by try_apply")
        }
    }
}
