//! Cross-partition checks of the replay: every capacity move is a pair (the
//! same move id leaving one partition and arriving in another of the same
//! subject/route, with the same units and debt over all dimensions), and the
//! sums over all generations and epochs of a subject/route agree: everything
//! moved out of its partitions arrived in them.

use std::collections::BTreeMap;

use reservoir_core::{DimensionAmounts, Event, EventBody, MoveId, PartitionKey, Units};
use reservoir_log::Position;

use crate::engine::Finding;

/// One half of a move as the log holds it.
#[derive(Clone, Debug)]
struct Half {
    position: Position,
    event_index: u32,
    sequence: u64,
    key: PartitionKey,
    /// The other partition the event names.
    counterpart: PartitionKey,
    /// Units and debt summed over every dimension.
    units: u128,
    debt_units: u128,
}

/// A move's key: (subject, route, move id).
type MoveKey = (String, String, MoveId);

/// The halves seen so far: (left, arrived).
#[derive(Default)]
pub struct Moves {
    halves: BTreeMap<MoveKey, (Option<Half>, Option<Half>)>,
}

fn totals(units: Units, debt_units: Units, further: &[DimensionAmounts]) -> (u128, u128) {
    further.iter().fold(
        (u128::from(units), u128::from(debt_units)),
        |(u, d), a| match *a {
            DimensionAmounts::Moved { units, debt_units } => {
                (u + u128::from(units), d + u128::from(debt_units))
            }
            _ => (u, d),
        },
    )
}

impl Moves {
    /// Notes an applied event (only moves matter).
    pub fn note(&mut self, position: Position, key: &PartitionKey, index: u32, event: &Event) {
        let (id, counterpart, units, debt_units, out) = match &event.body {
            EventBody::MovedOut {
                move_id,
                to,
                units,
                debt_units,
            } => (move_id, to, *units, *debt_units, true),
            EventBody::MovedIn {
                move_id,
                from,
                units,
                debt_units,
            } => (move_id, from, *units, *debt_units, false),
            _ => return,
        };
        let (units, debt_units) = totals(units, debt_units, &event.further);
        let half = Half {
            position,
            event_index: index,
            sequence: event.sequence,
            key: key.clone(),
            counterpart: counterpart.clone(),
            units,
            debt_units,
        };
        let entry = self
            .halves
            .entry((key.subject.clone(), key.route.clone(), id.clone()))
            .or_default();
        match out {
            true => entry.0 = Some(half),
            false => entry.1 = Some(half),
        }
    }

    /// What does not pair, each located at the half that is there (the
    /// arriving one when both are and differ).
    pub fn findings(&self) -> Vec<Finding> {
        let finding = |h: &Half, kind, detail: String| Finding {
            log_partition: h.position.log_partition,
            offset: h.position.offset,
            partition: Some(h.key.to_string()),
            event_index: Some(h.event_index),
            sequence: Some(h.sequence),
            kind,
            detail,
        };
        let mut out = Vec::new();
        for ((_, _, id), halves) in &self.halves {
            match halves {
                (Some(o), None) => out.push(finding(
                    o,
                    "move_unpaired",
                    format!("move {id} left for {} but never arrived", o.counterpart),
                )),
                (None, Some(i)) => out.push(finding(
                    i,
                    "move_unpaired",
                    format!("move {id} arrived from {} but never left it", i.counterpart),
                )),
                (Some(o), Some(i)) => {
                    let same = o.units == i.units
                        && o.debt_units == i.debt_units
                        && o.counterpart == i.key
                        && i.counterpart == o.key;
                    if !same {
                        out.push(finding(
                            i,
                            "move_mismatch",
                            format!(
                                "move {id}: left {} with {} units and {} debt, arrived in {} from {} with {} units and {} debt",
                                o.key, o.units, o.debt_units, i.key, i.counterpart, i.units, i.debt_units
                            ),
                        ));
                    }
                }
                (None, None) => {}
            }
        }
        out
    }

    /// Per subject/route: (Σ units out, Σ units in, Σ debt out, Σ debt in)
    /// over all of its partitions.
    pub fn sums(&self) -> BTreeMap<(String, String), [u128; 4]> {
        let mut sums: BTreeMap<(String, String), [u128; 4]> = BTreeMap::new();
        for ((subject, route, _), (o, i)) in &self.halves {
            let s = sums.entry((subject.clone(), route.clone())).or_default();
            if let Some(o) = o {
                s[0] += o.units;
                s[2] += o.debt_units;
            }
            if let Some(i) = i {
                s[1] += i.units;
                s[3] += i.debt_units;
            }
        }
        sums
    }
}
