//! The conservation terms of one partition and the checks over them.
//!
//! ```text
//! opening + minted + reminted + movedIn + overdraftIssued
//!     = available + reserved + spent + retiredForEmergency + overdraftRepaid + movedOut
//! debt = overdraftIssued + debtMovedIn − overdraftRepaid − debtMovedOut  (never negative)
//! ```
//! The contract's equation is the first line with `reminted`, `movedIn` and `movedOut`
//! at zero: those three carry capacity between partitions (shard remint under a new
//! generation, epoch roll-over, generation switch) and are checked pairwise across
//! partitions by [`check_moves`]. Moving debt moves an obligation, not units, so it
//! shows only in the debt line.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::types::Units;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    // Sources.
    pub opening_units: Units,
    pub minted_units: Units,
    pub reminted_units: Units,
    pub moved_in_units: Units,
    pub overdraft_issued_units: Units,
    // Destinations.
    pub available_units: Units,
    pub reserved_units: Units,
    pub spent_units: Units,
    pub retired_for_emergency_units: Units,
    pub overdraft_repaid_units: Units,
    pub moved_out_units: Units,
    // Debt carried between partitions.
    pub debt_moved_in_units: Units,
    pub debt_moved_out_units: Units,
}

/// A broken invariant. Live, this is a crash; in replay, a finding with a position.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConservationError {
    #[error("conservation broken: sources {sources} != destinations {destinations}")]
    Unbalanced { sources: u128, destinations: u128 },
    #[error("debt would be negative: issued {issued} + moved in {moved_in} < repaid {repaid} + moved out {moved_out}")]
    NegativeDebt {
        issued: Units,
        moved_in: Units,
        repaid: Units,
        moved_out: Units,
    },
    #[error("reserved {ledger} != sum of held units over open reservations {records}")]
    ReservedMismatch { ledger: Units, records: u128 },
}

/// Which side of the books a term is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    /// Left-hand side of the conservation equation: where units come from.
    Source,
    /// Right-hand side: where units are.
    Destination,
    /// Debt carried between partitions: in neither sum, only in the debt line.
    Debt,
}

/// One term of a [`Ledger`]. [`Term::ALL`] is the one list of the terms: views,
/// roll-ups and audits iterate it instead of naming the fields again, so a new
/// term cannot be left out of one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Term {
    Opening,
    Minted,
    Reminted,
    MovedIn,
    OverdraftIssued,
    Available,
    Reserved,
    Spent,
    RetiredForEmergency,
    OverdraftRepaid,
    MovedOut,
    DebtMovedIn,
    DebtMovedOut,
}

impl Term {
    /// Every term, in `Ledger` field order: sources, destinations, debt.
    pub const ALL: [Term; 13] = [
        Term::Opening,
        Term::Minted,
        Term::Reminted,
        Term::MovedIn,
        Term::OverdraftIssued,
        Term::Available,
        Term::Reserved,
        Term::Spent,
        Term::RetiredForEmergency,
        Term::OverdraftRepaid,
        Term::MovedOut,
        Term::DebtMovedIn,
        Term::DebtMovedOut,
    ];

    /// The `Ledger` field's name, which is also its key in every JSON view
    /// (`opening_units`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Term::Opening => "opening_units",
            Term::Minted => "minted_units",
            Term::Reminted => "reminted_units",
            Term::MovedIn => "moved_in_units",
            Term::OverdraftIssued => "overdraft_issued_units",
            Term::Available => "available_units",
            Term::Reserved => "reserved_units",
            Term::Spent => "spent_units",
            Term::RetiredForEmergency => "retired_for_emergency_units",
            Term::OverdraftRepaid => "overdraft_repaid_units",
            Term::MovedOut => "moved_out_units",
            Term::DebtMovedIn => "debt_moved_in_units",
            Term::DebtMovedOut => "debt_moved_out_units",
        }
    }

    pub const fn side(self) -> Side {
        match self {
            Term::Opening
            | Term::Minted
            | Term::Reminted
            | Term::MovedIn
            | Term::OverdraftIssued => Side::Source,
            Term::Available
            | Term::Reserved
            | Term::Spent
            | Term::RetiredForEmergency
            | Term::OverdraftRepaid
            | Term::MovedOut => Side::Destination,
            Term::DebtMovedIn | Term::DebtMovedOut => Side::Debt,
        }
    }

    /// The term named `name` (see [`Term::name`]).
    pub fn from_name(name: &str) -> Option<Term> {
        Term::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Ledger {
    pub fn get(&self, term: Term) -> Units {
        match term {
            Term::Opening => self.opening_units,
            Term::Minted => self.minted_units,
            Term::Reminted => self.reminted_units,
            Term::MovedIn => self.moved_in_units,
            Term::OverdraftIssued => self.overdraft_issued_units,
            Term::Available => self.available_units,
            Term::Reserved => self.reserved_units,
            Term::Spent => self.spent_units,
            Term::RetiredForEmergency => self.retired_for_emergency_units,
            Term::OverdraftRepaid => self.overdraft_repaid_units,
            Term::MovedOut => self.moved_out_units,
            Term::DebtMovedIn => self.debt_moved_in_units,
            Term::DebtMovedOut => self.debt_moved_out_units,
        }
    }

    pub fn get_mut(&mut self, term: Term) -> &mut Units {
        match term {
            Term::Opening => &mut self.opening_units,
            Term::Minted => &mut self.minted_units,
            Term::Reminted => &mut self.reminted_units,
            Term::MovedIn => &mut self.moved_in_units,
            Term::OverdraftIssued => &mut self.overdraft_issued_units,
            Term::Available => &mut self.available_units,
            Term::Reserved => &mut self.reserved_units,
            Term::Spent => &mut self.spent_units,
            Term::RetiredForEmergency => &mut self.retired_for_emergency_units,
            Term::OverdraftRepaid => &mut self.overdraft_repaid_units,
            Term::MovedOut => &mut self.moved_out_units,
            Term::DebtMovedIn => &mut self.debt_moved_in_units,
            Term::DebtMovedOut => &mut self.debt_moved_out_units,
        }
    }

    /// Every term with its value, in [`Term::ALL`] order.
    pub fn terms(&self) -> impl Iterator<Item = (Term, Units)> + '_ {
        Term::ALL.into_iter().map(|t| (t, self.get(t)))
    }

    /// Every term with a mutable reference to its value, in [`Term::ALL`] order
    /// (to sum ledgers: `for (t, u) in total.terms_mut() { *u += other.get(t) }`).
    pub fn terms_mut(&mut self) -> [(Term, &mut Units); 13] {
        // Destructured without `..`: a field added to `Ledger` without a
        // `Term` is a compile error here.
        let Ledger {
            opening_units,
            minted_units,
            reminted_units,
            moved_in_units,
            overdraft_issued_units,
            available_units,
            reserved_units,
            spent_units,
            retired_for_emergency_units,
            overdraft_repaid_units,
            moved_out_units,
            debt_moved_in_units,
            debt_moved_out_units,
        } = self;
        [
            (Term::Opening, opening_units),
            (Term::Minted, minted_units),
            (Term::Reminted, reminted_units),
            (Term::MovedIn, moved_in_units),
            (Term::OverdraftIssued, overdraft_issued_units),
            (Term::Available, available_units),
            (Term::Reserved, reserved_units),
            (Term::Spent, spent_units),
            (Term::RetiredForEmergency, retired_for_emergency_units),
            (Term::OverdraftRepaid, overdraft_repaid_units),
            (Term::MovedOut, moved_out_units),
            (Term::DebtMovedIn, debt_moved_in_units),
            (Term::DebtMovedOut, debt_moved_out_units),
        ]
    }

    /// Sum of one side's terms, in u128 so it cannot overflow.
    pub fn side_sum(&self, side: Side) -> u128 {
        self.terms()
            .filter(|(t, _)| t.side() == side)
            .map(|(_, u)| u128::from(u))
            .sum()
    }

    /// Left-hand side of the equation, in u128 so the check itself cannot overflow.
    ///
    /// Spelled out rather than `side_sum(Side::Source)`: this runs several
    /// times per event on the write path. The destructuring names every field,
    /// so a new term cannot be added without placing it here, and a test
    /// checks both sides against [`Ledger::side_sum`] over [`Term::ALL`].
    pub fn sources(&self) -> u128 {
        let Ledger {
            opening_units,
            minted_units,
            reminted_units,
            moved_in_units,
            overdraft_issued_units,
            available_units: _,
            reserved_units: _,
            spent_units: _,
            retired_for_emergency_units: _,
            overdraft_repaid_units: _,
            moved_out_units: _,
            debt_moved_in_units: _,
            debt_moved_out_units: _,
        } = *self;
        u128::from(opening_units)
            + u128::from(minted_units)
            + u128::from(reminted_units)
            + u128::from(moved_in_units)
            + u128::from(overdraft_issued_units)
    }

    /// Right-hand side of the equation (see [`Ledger::sources`]).
    pub fn destinations(&self) -> u128 {
        let Ledger {
            opening_units: _,
            minted_units: _,
            reminted_units: _,
            moved_in_units: _,
            overdraft_issued_units: _,
            available_units,
            reserved_units,
            spent_units,
            retired_for_emergency_units,
            overdraft_repaid_units,
            moved_out_units,
            debt_moved_in_units: _,
            debt_moved_out_units: _,
        } = *self;
        u128::from(available_units)
            + u128::from(reserved_units)
            + u128::from(spent_units)
            + u128::from(retired_for_emergency_units)
            + u128::from(overdraft_repaid_units)
            + u128::from(moved_out_units)
    }

    /// Outstanding debt; `None` only if the terms are inconsistent.
    pub fn debt_units(&self) -> Option<Units> {
        self.overdraft_issued_units
            .checked_add(self.debt_moved_in_units)?
            .checked_sub(
                self.overdraft_repaid_units
                    .checked_add(self.debt_moved_out_units)?,
            )
    }

    /// The conservation equation and `debt >= 0`. (`available >= 0` holds by type:
    /// every subtraction from it is checked.)
    pub fn check(&self) -> Result<(), ConservationError> {
        let (sources, destinations) = (self.sources(), self.destinations());
        if sources != destinations {
            return Err(ConservationError::Unbalanced {
                sources,
                destinations,
            });
        }
        if self.debt_units().is_none() {
            return Err(ConservationError::NegativeDebt {
                issued: self.overdraft_issued_units,
                moved_in: self.debt_moved_in_units,
                repaid: self.overdraft_repaid_units,
                moved_out: self.debt_moved_out_units,
            });
        }
        Ok(())
    }
}

/// One half of a capacity move, as recorded in a partition's ledger history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveHalf {
    pub move_id: crate::types::MoveId,
    pub units: Units,
    pub debt_units: Units,
}

/// Cross-partition check: every move out has exactly one matching move in, with
/// the same units and debt, and nothing arrives that never left.
pub fn check_moves(outs: &[MoveHalf], ins: &[MoveHalf]) -> Result<(), String> {
    use std::collections::BTreeMap;
    let index = |halves: &[MoveHalf]| -> Result<BTreeMap<_, _>, String> {
        let mut map = BTreeMap::new();
        for h in halves {
            if map
                .insert(h.move_id.clone(), (h.units, h.debt_units))
                .is_some()
            {
                return Err(format!("move {} recorded twice on one side", h.move_id));
            }
        }
        Ok(map)
    };
    let (outs, ins) = (index(outs)?, index(ins)?);
    for (id, out) in &outs {
        match ins.get(id) {
            Some(inn) if inn == out => {}
            Some(inn) => return Err(format!("move {id}: out {out:?} != in {inn:?}")),
            None => return Err(format!("move {id}: left a partition but never arrived")),
        }
    }
    if let Some(id) = ins.keys().find(|id| !outs.contains_key(*id)) {
        return Err(format!("move {id}: arrived but never left a partition"));
    }
    Ok(())
}

/// `emergencyShard.v1` local books, kept by the gateway that holds the shard:
/// `allocated = localAvailable + localReserved + localSpent + localRetired`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLedger {
    pub allocated_units: Units,
    pub local_available_units: Units,
    pub local_reserved_units: Units,
    pub local_spent_units: Units,
    pub local_retired_units: Units,
}

impl ShardLedger {
    pub fn check(&self) -> Result<(), ConservationError> {
        let destinations: u128 = [
            self.local_available_units,
            self.local_reserved_units,
            self.local_spent_units,
            self.local_retired_units,
        ]
        .iter()
        .map(|&u| u128::from(u))
        .sum();
        let sources = u128::from(self.allocated_units);
        if sources != destinations {
            return Err(ConservationError::Unbalanced {
                sources,
                destinations,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbalanced_and_negative_debt_are_caught() {
        let mut l = Ledger {
            opening_units: 10,
            available_units: 10,
            ..Default::default()
        };
        assert_eq!(l.check(), Ok(()));
        l.available_units = 9;
        assert_eq!(
            l.check(),
            Err(ConservationError::Unbalanced {
                sources: 10,
                destinations: 9
            })
        );
        // Repaid more than was ever issued, balanced by a fake mint: still caught.
        let l = Ledger {
            minted_units: 5,
            overdraft_repaid_units: 5,
            ..Default::default()
        };
        assert!(matches!(
            l.check(),
            Err(ConservationError::NegativeDebt { .. })
        ));
    }

    #[test]
    fn moves_must_pair_exactly() {
        let id = |s: &str| crate::types::MoveId::new(s).unwrap();
        let half = |s: &str, u, d| MoveHalf {
            move_id: id(s),
            units: u,
            debt_units: d,
        };
        assert_eq!(
            check_moves(&[half("m1", 5, 1)], &[half("m1", 5, 1)]),
            Ok(())
        );
        assert!(check_moves(&[half("m1", 5, 1)], &[half("m1", 4, 1)]).is_err());
        assert!(check_moves(&[half("m1", 5, 1)], &[]).is_err());
        assert!(check_moves(&[], &[half("m1", 5, 0)]).is_err());
    }
}
