//! `Term::ALL` is the one list of the ledger's terms: every other list (JSON
//! views, roll-ups, audits) is built from it, so it must name every `Ledger`
//! field exactly once, under the field's own name, on the right side.

use std::collections::BTreeSet;

use reservoir_core::ledger::{Side, Term};
use reservoir_core::Ledger;

/// A ledger whose every term holds a different value (the term's position + 1).
fn distinct() -> Ledger {
    let mut l = Ledger::default();
    for (i, t) in Term::ALL.into_iter().enumerate() {
        *l.get_mut(t) = i as u64 + 1;
    }
    l
}

#[test]
fn every_term_appears_exactly_once() {
    let terms: BTreeSet<Term> = Term::ALL.into_iter().collect();
    assert_eq!(terms.len(), Term::ALL.len(), "a term is listed twice");
    let names: BTreeSet<&str> = Term::ALL.into_iter().map(Term::name).collect();
    assert_eq!(names.len(), Term::ALL.len(), "two terms share a name");
    for t in Term::ALL {
        assert_eq!(Term::from_name(t.name()), Some(t));
        assert_eq!(t.to_string(), t.name());
    }
    assert_eq!(Term::from_name("opening"), None);
}

#[test]
fn the_list_is_the_ledgers_fields_by_their_serialized_names() {
    // Every field of `Ledger` (as serde sees it) is a term of that name with
    // that value: a field missing from `Term::ALL` would show here with 0.
    let l = distinct();
    let json = serde_json::to_value(l).unwrap();
    let fields = json.as_object().unwrap();
    assert_eq!(fields.len(), Term::ALL.len());
    for (t, units) in l.terms() {
        assert_eq!(fields[t.name()], units, "{t}");
    }
    // `get`, `get_mut` and `terms_mut` reach the same field for each term.
    let mut copy = Ledger::default();
    for (t, slot) in copy.terms_mut() {
        *slot = l.get(t);
    }
    assert_eq!(copy, l);
}

#[test]
fn sources_destinations_and_debt_cover_all_13() {
    let sides: Vec<(Side, Vec<&str>)> = [Side::Source, Side::Destination, Side::Debt]
        .into_iter()
        .map(|side| {
            let names = Term::ALL
                .into_iter()
                .filter(|t| t.side() == side)
                .map(Term::name)
                .collect();
            (side, names)
        })
        .collect();
    #[rustfmt::skip]
    let expected = [
        (Side::Source, vec!["opening_units", "minted_units", "reminted_units", "moved_in_units", "overdraft_issued_units"]),
        (Side::Destination, vec!["available_units", "reserved_units", "spent_units", "retired_for_emergency_units", "overdraft_repaid_units", "moved_out_units"]),
        (Side::Debt, vec!["debt_moved_in_units", "debt_moved_out_units"]),
    ];
    assert_eq!(sides, expected);
    assert_eq!(sides.iter().map(|(_, n)| n.len()).sum::<usize>(), 13);

    // The sums iterate the same sides.
    let l = distinct();
    assert_eq!(l.sources(), 1 + 2 + 3 + 4 + 5);
    assert_eq!(l.destinations(), 6 + 7 + 8 + 9 + 10 + 11);
    assert_eq!(l.side_sum(Side::Debt), 12 + 13);
    // The hand-written fast sums agree with the list, term by term: each term
    // alone counts on its own side only.
    for term in Term::ALL {
        let mut one = Ledger::default();
        *one.get_mut(term) = 1;
        assert_eq!(one.sources(), one.side_sum(Side::Source), "{term}");
        assert_eq!(
            one.destinations(),
            one.side_sum(Side::Destination),
            "{term}"
        );
    }
}
