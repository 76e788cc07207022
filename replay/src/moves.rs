//! Cross-partition checks of the replay: every capacity move is a pair (the
//! same move id leaving one partition and arriving in another of the same
//! subject/route, with the same units and debt in every dimension, matched
//! by name as the writer matches them: `moved_by_dimension`), and the
//! sums over all generations and epochs of a subject/route agree: everything
//! moved out of its partitions arrived in them.

use std::collections::BTreeMap;

use reservoir_core::{
    moved_by_dimension, Dimension, DimensionAmounts, Event, EventBody, MoveId, PartitionKey,
    Policy, Units,
};
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
    /// Units and debt summed over every dimension (for the sums).
    units: u128,
    debt_units: u128,
    /// What it carried in each dimension (what pairs).
    amounts: Vec<(Dimension, Units, Units)>,
}

fn shown(amounts: &[(Dimension, Units, Units)]) -> String {
    let parts: Vec<String> = amounts
        .iter()
        .map(|(d, units, debt)| format!("{} {units} units, {debt} debt", d.name()))
        .collect();
    match parts.is_empty() {
        true => "nothing".to_string(),
        false => parts.join("; "),
    }
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
    pub fn note(
        &mut self,
        position: Position,
        key: &PartitionKey,
        policy: Option<&Policy>,
        index: u32,
        event: &Event,
    ) {
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
        let amounts = policy.map_or_else(Vec::new, |p| {
            moved_by_dimension(p, units, debt_units, &event.further)
        });
        let (units, debt_units) = totals(units, debt_units, &event.further);
        let half = Half {
            amounts,
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
                    let same =
                        o.amounts == i.amounts && o.counterpart == i.key && i.counterpart == o.key;
                    if !same {
                        out.push(finding(
                            i,
                            "move_mismatch",
                            format!(
                                "move {id}: left {} with {}, arrived in {} from {} with {}",
                                o.key,
                                shown(&o.amounts),
                                i.key,
                                i.counterpart,
                                shown(&i.amounts)
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

#[cfg(test)]
mod tests {
    use reservoir_core::{CapacityUnit, DimensionLimit};

    use super::*;

    fn event(body: EventBody, further: &[(Units, Units)]) -> Event {
        Event {
            further: further
                .iter()
                .map(|&(units, debt_units)| DimensionAmounts::Moved { units, debt_units })
                .collect(),
            sequence: 1,
            at_ms: 1,
            body,
        }
    }

    /// The halves of one move out of generation 1 into generation 2, the
    /// arrival under `to` with `further` amounts; the findings.
    fn pair(to: &Policy, body_in: (Units, Units), further_in: &[(Units, Units)]) -> Vec<Finding> {
        let from = Policy::example_three_dimensions("t", "r", 1);
        let (k1, k2) = (
            PartitionKey::new("t", "r", "e", 1).unwrap(),
            PartitionKey::new("t", "r", "e", 2).unwrap(),
        );
        let id = MoveId::new("mv-1").unwrap();
        let at = |offset| Position {
            log_partition: 0,
            offset,
        };
        let mut moves = Moves::default();
        let out = EventBody::MovedOut {
            move_id: id.clone(),
            to: k2.clone(),
            units: 5,
            debt_units: 0,
        };
        moves.note(at(1), &k1, Some(&from), 0, &event(out, &[(3, 0), (2, 1)]));
        let inn = EventBody::MovedIn {
            move_id: id,
            from: k1,
            units: body_in.0,
            debt_units: body_in.1,
        };
        moves.note(at(2), &k2, Some(to), 0, &event(inn, further_in));
        moves.findings()
    }

    #[test]
    fn a_move_pairs_dimension_by_dimension_by_name() {
        let same = Policy::example_three_dimensions("t", "r", 2);
        assert!(pair(&same, (5, 0), &[(3, 0), (2, 1)]).is_empty());
        // Input and output swapped: the sums agree, the dimensions do not.
        let swapped = pair(&same, (5, 0), &[(2, 1), (3, 0)]);
        assert_eq!(swapped.len(), 1, "{swapped:?}");
        assert_eq!(swapped[0].kind, "move_mismatch");
        // A new primary (tokens), the old one (requests) a further
        // dimension: the same amounts under other indexes pair.
        let requests = same.limit(0);
        let mut reordered = Policy {
            capacity_unit: CapacityUnit::Tokens,
            dimensions: vec![
                DimensionLimit {
                    dimension: Dimension::Requests,
                    ..requests
                },
                same.limit(1),
                same.limit(2),
            ],
            ..same
        };
        reordered.generation = 2;
        assert!(pair(&reordered, (0, 0), &[(5, 0), (3, 0), (2, 1)]).is_empty());
    }
}
