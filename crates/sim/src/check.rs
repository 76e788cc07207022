//! The checker, run after every step of a run. It looks at three things:
//! - the log, followed record by record into a mirror of every partition
//!   (core's `try_apply`, under the log's one validity rule), with gates that
//!   only the order of events can show: a reserve admitted while its
//!   subject/route owed debt, a second debit or a second refund for one id;
//! - the writers' live state (every shard's committed partitions);
//! - the two against each other (and, in `run`, against what recovery
//!   rebuilds and what the gateways were told).
//!
//! Conservation is core's own check (`Partition::check_invariants`) and the
//! move pairs are core's own `check_moves`: the checker re-derives neither.

use std::collections::{BTreeMap, BTreeSet};

use reservoir_core::{
    check_moves, try_apply, ApplyError, DimensionAmounts, EventBody, MoveHalf, Partition,
    PartitionKey, ReservationId,
};
use reservoir_log::fence::{valid_records, Validity};
use reservoir_log::EventReader;

use crate::node::SimLog;

/// What the checker can find. Each is a gate of the release table: its
/// count must be 0 over every interleaving.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Gate {
    /// A partition's books do not balance (core's `check_invariants`), live
    /// or in the mirror built from the log.
    Conservation,
    /// The halves of the capacity moves of a subject/route do not pair
    /// (core's `check_moves`, in every dimension).
    MovePairs,
    /// An event would take a term below zero (`available` is a `u64`, so
    /// this is where a negative balance would show: `ApplyError::Arithmetic`).
    AvailableNegative,
    /// A reserve held capacity while a partition of its subject/route owed debt.
    AdmissionWithDebt,
    /// A second `Reserved` for one reservation id.
    SecondDebit,
    /// A second refunding end (`Released`, `Expired`, `Settled`) for one id.
    DuplicateRefund,
    /// A closed partition still owes debt: it was not carried to the next one.
    DebtLeftBehind,
    /// `available + reserved` above a dimension's burst (the policy's bucket
    /// size, which refills, moves and refunds never exceed).
    AboveBurst,
    /// The log holds an event the mirror cannot apply (not a balance error).
    LogUnreplayable,
    /// The writers' live state differs from the log's.
    LogDisagrees,
    /// What recovery rebuilds from the log differs from the live state.
    RecoveryDisagrees,
    /// Recovery refused the log.
    RecoveryFailed,
    /// A gateway was told something the ledger does not hold (a lost
    /// acknowledged step, a refused id that holds a record, other units).
    ModelDisagrees,
    /// A call still UNKNOWN when the run ended, after a quiet drain.
    UnknownUnresolved,
    /// A writer task panicked (a broken invariant) or answered `Internal`.
    WriterBroke,
    /// An answer no correct ledger gives to what the gateway asked.
    UnexpectedAnswer,
    /// The run panicked outside a writer task (an assertion of core's on
    /// the mirror, or of the simulator's own); the seed replays it.
    Panicked,
    /// A gateway's shard book does not balance
    /// (`allocated = available + reserved + spent + retired`), or differs
    /// from what its open calls hold.
    ShardBooks,
    /// A shard consumed (spent, unknown or held) more than its allocation
    /// across the books that held it, or was installed by a second gateway
    /// or by its gateway's next process.
    ShardDoubleSpent,
    /// One shard reminted twice (into two partitions of its subject/route).
    DuplicateRemint,
    /// A reconcile reminted more than the shard's calls left unused (an
    /// unknown call's hold counted as unused), did not record use beyond
    /// the allocation as debt, or a stale process's reconcile was taken.
    RemintUnbacked,
    /// The projector, followed step by step through crashes and restarts,
    /// differs from a rebuild from the whole log (a key or value of its
    /// database), from the ledger (a partition it projected), or found an
    /// event it could not apply (`run`'s `projection`).
    ProjectionDisagrees,
    /// The client gateway's start scheduler gave two tenants that both
    /// waited throughout a stretch starts further from their weights than
    /// its fairness budget (`run`'s `client_gateway::fairness`).
    SchedulerOverBudget,
    /// `reservoir-replay verify` (the audit tool's engine and comparison)
    /// found something in the log, or differs from the followed projector's
    /// database (`run`'s `replay`).
    ReplayDisagrees,
}

impl Gate {
    pub const ALL: [Gate; 24] = [
        Gate::Conservation,
        Gate::MovePairs,
        Gate::AvailableNegative,
        Gate::AdmissionWithDebt,
        Gate::SecondDebit,
        Gate::DuplicateRefund,
        Gate::DebtLeftBehind,
        Gate::AboveBurst,
        Gate::LogUnreplayable,
        Gate::LogDisagrees,
        Gate::RecoveryDisagrees,
        Gate::RecoveryFailed,
        Gate::ModelDisagrees,
        Gate::UnknownUnresolved,
        Gate::WriterBroke,
        Gate::UnexpectedAnswer,
        Gate::Panicked,
        Gate::ShardBooks,
        Gate::ShardDoubleSpent,
        Gate::DuplicateRemint,
        Gate::RemintUnbacked,
        Gate::ProjectionDisagrees,
        Gate::SchedulerOverBudget,
        Gate::ReplayDisagrees,
    ];

    /// The gate called `name` (as [`Gate::name`] spells it).
    pub fn from_name(name: &str) -> Option<Gate> {
        Gate::ALL.into_iter().find(|g| g.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Gate::Conservation => "conservation",
            Gate::MovePairs => "move_pairs",
            Gate::AvailableNegative => "available_negative",
            Gate::AdmissionWithDebt => "admission_with_debt",
            Gate::SecondDebit => "second_debit",
            Gate::DuplicateRefund => "duplicate_refund",
            Gate::DebtLeftBehind => "debt_left_behind",
            Gate::AboveBurst => "above_burst",
            Gate::LogUnreplayable => "log_unreplayable",
            Gate::LogDisagrees => "log_disagrees",
            Gate::RecoveryDisagrees => "recovery_disagrees",
            Gate::RecoveryFailed => "recovery_failed",
            Gate::ModelDisagrees => "model_disagrees",
            Gate::UnknownUnresolved => "unknown_unresolved",
            Gate::WriterBroke => "writer_broke",
            Gate::UnexpectedAnswer => "unexpected_answer",
            Gate::Panicked => "panicked",
            Gate::ShardBooks => "shard_books",
            Gate::ShardDoubleSpent => "shard_double_spent",
            Gate::DuplicateRemint => "duplicate_remint",
            Gate::RemintUnbacked => "remint_unbacked",
            Gate::ProjectionDisagrees => "projection_disagrees",
            Gate::SchedulerOverBudget => "scheduler_over_budget",
            Gate::ReplayDisagrees => "replay_disagrees",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Finding {
    pub gate: Gate,
    pub detail: String,
}

pub fn finding(gate: Gate, detail: impl Into<String>) -> Finding {
    Finding {
        gate,
        detail: detail.into(),
    }
}

pub type Partitions = BTreeMap<PartitionKey, Partition>;

/// The log, followed: every counting record applied to a mirror of its
/// partition, with the per-event gates checked before each event.
#[derive(Default)]
pub struct Mirror {
    next_offset: u64,
    validity: Validity,
    pub partitions: Partitions,
    /// Every reservation id the log debited, and where.
    reserved: BTreeMap<ReservationId, PartitionKey>,
    /// Every id whose hold the log ended (refunded what was left of it).
    ended: BTreeSet<ReservationId>,
    /// Partitions an event could not be applied to (reported once; their
    /// later events are not applied).
    broken: BTreeSet<PartitionKey>,
    /// Events applied, by type: what the run exercised.
    pub events: BTreeMap<&'static str, u64>,
}

impl Mirror {
    /// The partition the log debited `id` in, if it did.
    pub fn debited_in(&self, id: &ReservationId) -> Option<&PartitionKey> {
        self.reserved.get(id)
    }

    /// Reads the log from where the mirror stopped to its end.
    pub async fn follow(&mut self, log: &SimLog, out: &mut Vec<Finding>) {
        loop {
            let entries = log
                .read(0, self.next_offset, 4_096)
                .await
                .expect("the memory log reads");
            let Some((last, _)) = entries.last() else {
                return;
            };
            self.next_offset = last.offset + 1;
            for (position, record) in valid_records(&mut self.validity, entries) {
                self.apply_record(position.offset, &record, out);
            }
        }
    }

    fn apply_record(
        &mut self,
        offset: u64,
        record: &reservoir_log::Record,
        out: &mut Vec<Finding>,
    ) {
        let key = &record.key;
        if self.broken.contains(key) {
            return;
        }
        for event in &record.events {
            let last = self.partitions.get(key).map_or(0, |p| p.last_sequence);
            // As recovery does: an event at or below the last sequence is a duplicate.
            if event.sequence <= last {
                continue;
            }
            let at = || format!("log offset {offset}, {key} seq {}", event.sequence);
            if let EventBody::Reserved { id, held_units, .. } = &event.body {
                if let Some(first) = self.reserved.get(id) {
                    out.push(finding(
                        Gate::SecondDebit,
                        format!("{}: {id} reserved again (first in {first})", at()),
                    ));
                }
                let holds = *held_units > 0
                    || event.further.iter().any(|a| {
                        matches!(a, DimensionAmounts::Reserved { held_units, .. } if *held_units > 0)
                    });
                if holds {
                    if let Some((owing, debt)) = self.debt_of(&key.subject, &key.route) {
                        out.push(finding(
                            Gate::AdmissionWithDebt,
                            format!("{}: {id} admitted while {owing} owes {debt}", at()),
                        ));
                    }
                }
                self.reserved.insert(id.clone(), key.clone());
            }
            // Every end of a hold refunds what is left of it: at most one per id.
            if let EventBody::Released { id, .. }
            | EventBody::Expired { id, .. }
            | EventBody::Settled { id, .. } = &event.body
            {
                if !self.ended.insert(id.clone()) {
                    out.push(finding(
                        Gate::DuplicateRefund,
                        format!("{}: {id} ended (and refunded) again", at()),
                    ));
                }
            }
            *self.events.entry(event.body.type_name()).or_default() += 1;
            if let Some(path) = settle_path(event) {
                *self.events.entry(path).or_default() += 1;
            }
            let p = self.partitions.entry(key.clone()).or_default();
            if let Err(err) = try_apply(p, event) {
                let gate = match err {
                    ApplyError::Arithmetic => Gate::AvailableNegative,
                    ApplyError::Conservation(_) => Gate::Conservation,
                    _ => Gate::LogUnreplayable,
                };
                out.push(finding(gate, format!("{}: {err}", at())));
                self.broken.insert(key.clone());
                return;
            }
        }
        if let Some(p) = self.partitions.get(key) {
            if let Err(err) = p.check_invariants() {
                out.push(finding(
                    Gate::Conservation,
                    format!("log offset {offset}, {key}: {err}"),
                ));
                self.broken.insert(key.clone());
            }
        }
    }

    /// A partition of the subject/route that owes debt in some dimension.
    fn debt_of(&self, subject: &str, route: &str) -> Option<(PartitionKey, u64)> {
        self.partitions
            .iter()
            .filter(|(k, _)| k.subject == subject && k.route == route)
            .find_map(|(k, p)| {
                let debt = p.ledgers().map(|l| l.debt_units().unwrap_or(0)).max()?;
                (debt > 0).then(|| (k.clone(), debt))
            })
    }
}

/// Which way a settle went (in any dimension), for the coverage table.
fn settle_path(event: &reservoir_core::Event) -> Option<&'static str> {
    let EventBody::Settled {
        refunded_units,
        from_available_units,
        overdraft_units,
        from_usage_unknown,
        ..
    } = &event.body
    else {
        return None;
    };
    let mut amounts = vec![(*refunded_units, *from_available_units, *overdraft_units)];
    for a in &event.further {
        if let DimensionAmounts::Settled {
            refunded_units,
            from_available_units,
            overdraft_units,
            ..
        } = a
        {
            amounts.push((*refunded_units, *from_available_units, *overdraft_units));
        }
    }
    let any = |f: fn(&(u64, u64, u64)) -> bool| amounts.iter().any(f);
    Some(match () {
        _ if *from_usage_unknown => "settle: of a USAGE_UNKNOWN, by operation receipt",
        _ if any(|a| a.2 > 0) => "settle: above the reservation, into debt",
        _ if any(|a| a.1 > 0) => "settle: above the reservation, from available",
        _ if any(|a| a.0 > 0) => "settle: below the reservation",
        _ => "settle: exactly the reservation",
    })
}

/// The gates over one set of partitions (the live state or the mirror):
/// conservation, move pairs, debt left behind in a closed partition, the burst.
pub fn check_state(what: &str, parts: &Partitions, out: &mut Vec<Finding>) {
    let mut groups: BTreeMap<(&str, &str), Vec<&Partition>> = BTreeMap::new();
    for (key, p) in parts {
        groups
            .entry((&key.subject, &key.route))
            .or_default()
            .push(p);
        if let Err(err) = p.check_invariants() {
            out.push(finding(Gate::Conservation, format!("{what} {key}: {err}")));
        }
        if let Some(policy) = &p.policy {
            for (i, l) in p.ledgers().enumerate() {
                let burst = policy.limit(i).burst_units;
                let held = u128::from(l.available_units) + u128::from(l.reserved_units);
                if held > u128::from(burst) {
                    out.push(finding(
                        Gate::AboveBurst,
                        format!("{what} {key} dimension {i}: available + reserved {held} > burst {burst}"),
                    ));
                }
            }
        }
        if p.closed {
            let debt = p.ledgers().map(|l| l.debt_units().unwrap_or(0)).max();
            if let Some(debt @ 1..) = debt {
                out.push(finding(
                    Gate::DebtLeftBehind,
                    format!("{what} {key}: closed, still owes {debt}"),
                ));
            }
        }
    }
    for ((subject, route), group) in groups {
        let dimensions = group.iter().map(|p| p.further.len() + 1).max().unwrap_or(1);
        for d in 0..dimensions {
            let half = |id: &reservoir_core::MoveId, m: &reservoir_core::partition::Move| {
                let (units, debt_units) = match d {
                    0 => (m.units, m.debt_units),
                    d => match m.further.get(d - 1) {
                        Some(DimensionAmounts::Moved { units, debt_units }) => {
                            (*units, *debt_units)
                        }
                        _ => (0, 0),
                    },
                };
                MoveHalf {
                    move_id: id.clone(),
                    units,
                    debt_units,
                }
            };
            let outs: Vec<MoveHalf> = group
                .iter()
                .flat_map(|p| p.moves_out.iter().map(|(id, m)| half(id, m)))
                .collect();
            let ins: Vec<MoveHalf> = group
                .iter()
                .flat_map(|p| p.moves_in.iter().map(|(id, m)| half(id, m)))
                .collect();
            if let Err(err) = check_moves(&outs, &ins) {
                out.push(finding(
                    Gate::MovePairs,
                    format!("{what} {subject}/{route} dimension {d}: {err}"),
                ));
            }
        }
    }
}

/// Two views of the same partitions must be equal, field by field.
pub fn compare(
    gate: Gate,
    left: &str,
    a: &Partitions,
    right: &str,
    b: &Partitions,
    out: &mut Vec<Finding>,
) {
    let keys: BTreeSet<&PartitionKey> = a.keys().chain(b.keys()).collect();
    for key in keys {
        match (a.get(key), b.get(key)) {
            (Some(x), Some(y)) if x == y => {}
            (Some(x), Some(y)) => out.push(finding(
                gate,
                format!(
                    "{key}: {left} {} != {right} {}, differing in {}",
                    summary(x),
                    summary(y),
                    differing(x, y)
                ),
            )),
            (Some(_), None) => out.push(finding(gate, format!("{key}: only in {left}"))),
            (None, Some(_)) => out.push(finding(gate, format!("{key}: only in {right}"))),
            (None, None) => unreachable!("a key of one of them"),
        }
    }
}

/// The fields in which two partitions differ, with both values (cut short).
fn differing(a: &Partition, b: &Partition) -> String {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return "(not comparable as JSON)".to_string();
    };
    let cut = |v: Option<&serde_json::Value>| {
        v.map_or("-".to_string(), |v| {
            v.to_string().chars().take(200).collect()
        })
    };
    a.iter()
        .filter(|(name, x)| b.get(*name) != Some(*x))
        .map(|(name, x)| format!("{name} ({} / {})", cut(Some(x)), cut(b.get(name))))
        .collect::<Vec<_>>()
        .join(", ")
}

fn summary(p: &Partition) -> String {
    let ledgers: Vec<String> = p
        .ledgers()
        .map(|l| {
            format!(
                "avail {} res {} spent {} debt {:?}",
                l.available_units,
                l.reserved_units,
                l.spent_units,
                l.debt_units()
            )
        })
        .collect();
    format!(
        "[seq {} closed {} records {} | {}]",
        p.last_sequence,
        p.closed,
        p.reservations.len(),
        ledgers.join(" | ")
    )
}
