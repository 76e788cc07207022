//! What a statement sums up: the totals over its rows, the balances at the
//! start and the end of its range, and those totals as name/value pairs for
//! the table and CSV formats (the JSON and HTML formats serialize
//! [`Summary`] itself).

use std::collections::BTreeMap;

use reservoir_core::{DimensionAmounts, Event, EventBody, Ledger};
use serde::Serialize;

/// Totals over the rows of the statement.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub events: u64,
    pub reservations: u64,
    pub reserved_units: u64,
    pub spent_units: u64,
    /// Returned by settlements and releases (expiries are counted apart).
    pub refunded_units: u64,
    pub expired_units: u64,
    pub minted_units: u64,
    pub overdraft_issued_units: u64,
    pub overdraft_repaid_units: u64,
    pub refusals: u64,
    /// Emergency shards issued, and the units retired for them.
    pub shards_issued: u64,
    pub shard_issued_units: u64,
    /// Shards reconciled, and what their reconciles recorded: spent on the
    /// gateway, held by calls of unknown usage (both stay retired), reminted,
    /// and reported beyond the allocation (recorded as debt).
    pub shards_reconciled: u64,
    pub shard_spent_units: u64,
    pub shard_unknown_units: u64,
    pub shard_reminted_units: u64,
    pub shard_excess_units: u64,
    pub conservation_failures: u64,
    pub findings: u64,
    /// Every term just before the first row of the range, summed over the
    /// tenant's partitions (a partition opened inside the range starts at 0).
    pub balances_at_start: Ledger,
    pub debt_units_at_start: u64,
    /// Every term at the end of the range, summed over the tenant's partitions.
    pub balances: Ledger,
    pub debt_units: u64,
    /// Every term just before the first row of the range, per partition.
    pub partitions_at_start: BTreeMap<String, Ledger>,
    /// Every term at the end of the range, per partition.
    pub partitions: BTreeMap<String, Ledger>,
}

impl Summary {
    /// Counts one event of the range, in the statement's dimension: the
    /// primary one (`further: None`) from the body, a further one from the
    /// event's amounts for it (shards carve the primary dimension only, so
    /// their units count there alone; the shards themselves count in both).
    pub(crate) fn count(&mut self, event: &Event, further: Option<usize>) {
        let s = self;
        s.events += 1;
        let Some(i) = further else {
            return s.count_primary(&event.body);
        };
        match (&event.body, event.further.get(i)) {
            (EventBody::Reserved { .. }, Some(&DimensionAmounts::Reserved { held_units, .. })) => {
                s.reservations += 1;
                s.reserved_units += held_units;
            }
            // A dimension of a policy published after the reservation: nothing held.
            (EventBody::Reserved { .. }, _) => s.reservations += 1,
            (
                EventBody::Settled { .. },
                Some(&DimensionAmounts::Settled {
                    actual_units,
                    refunded_units,
                    overdraft_units,
                    ..
                }),
            ) => {
                s.spent_units += actual_units;
                s.refunded_units += refunded_units;
                s.overdraft_issued_units += overdraft_units;
            }
            (EventBody::Released { .. }, Some(&DimensionAmounts::Refunded { refunded_units })) => {
                s.refunded_units += refunded_units
            }
            (EventBody::Expired { .. }, Some(&DimensionAmounts::Refunded { refunded_units })) => {
                s.expired_units += refunded_units
            }
            (
                EventBody::Refilled { .. },
                Some(&DimensionAmounts::Refilled {
                    minted_units,
                    repaid_units,
                    ..
                }),
            ) => {
                s.minted_units += minted_units;
                s.overdraft_repaid_units += repaid_units;
            }
            (EventBody::AdmissionRefused { .. }, _) => s.refusals += 1,
            (EventBody::ShardIssued { .. }, _) => s.shards_issued += 1,
            (EventBody::ShardReminted { .. }, _) => s.shards_reconciled += 1,
            _ => {}
        }
    }

    fn count_primary(&mut self, body: &EventBody) {
        let s = self;
        match body {
            EventBody::Reserved { held_units, .. } => {
                s.reservations += 1;
                s.reserved_units += held_units;
            }
            EventBody::Settled {
                actual_units,
                refunded_units,
                overdraft_units,
                ..
            } => {
                s.spent_units += actual_units;
                s.refunded_units += refunded_units;
                s.overdraft_issued_units += overdraft_units;
            }
            EventBody::Released { refunded_units, .. } => s.refunded_units += refunded_units,
            EventBody::Expired { refunded_units, .. } => s.expired_units += refunded_units,
            EventBody::Refilled {
                minted_units,
                repaid_units,
                ..
            } => {
                s.minted_units += minted_units;
                s.overdraft_repaid_units += repaid_units;
            }
            EventBody::AdmissionRefused { .. } => s.refusals += 1,
            EventBody::ShardIssued { units, .. } => {
                s.shards_issued += 1;
                s.shard_issued_units += units;
            }
            EventBody::ShardReminted {
                units,
                spent_units,
                unknown_units,
                excess_units,
                ..
            } => {
                s.shards_reconciled += 1;
                s.shard_spent_units += spent_units;
                s.shard_unknown_units += unknown_units;
                s.shard_reminted_units += units;
                s.shard_excess_units += excess_units;
                // Excess is spent and overdraft issued in the ledger's terms.
                s.spent_units += excess_units;
                s.overdraft_issued_units += excess_units;
            }
            _ => {}
        }
    }
}

/// The terms of `ledgers`, summed.
pub(crate) fn total<'a>(ledgers: impl Iterator<Item = &'a Ledger>) -> Ledger {
    let mut sum = Ledger::default();
    for l in ledgers {
        for (t, slot) in sum.terms_mut() {
            *slot += l.get(t);
        }
    }
    sum
}

pub(crate) fn summary_pairs(s: &Summary) -> Vec<(String, String)> {
    let mut pairs = vec![
        ("events".to_string(), s.events.to_string()),
        ("reservations".into(), s.reservations.to_string()),
        ("reserved_units".into(), s.reserved_units.to_string()),
        ("spent_units".into(), s.spent_units.to_string()),
        ("refunded_units".into(), s.refunded_units.to_string()),
        ("expired_units".into(), s.expired_units.to_string()),
        ("minted_units".into(), s.minted_units.to_string()),
        (
            "overdraft_issued_units".into(),
            s.overdraft_issued_units.to_string(),
        ),
        (
            "overdraft_repaid_units".into(),
            s.overdraft_repaid_units.to_string(),
        ),
        ("refusals".into(), s.refusals.to_string()),
        ("shards_issued".into(), s.shards_issued.to_string()),
        (
            "shard_issued_units".into(),
            s.shard_issued_units.to_string(),
        ),
        ("shards_reconciled".into(), s.shards_reconciled.to_string()),
        ("shard_spent_units".into(), s.shard_spent_units.to_string()),
        (
            "shard_unknown_units".into(),
            s.shard_unknown_units.to_string(),
        ),
        (
            "shard_reminted_units".into(),
            s.shard_reminted_units.to_string(),
        ),
        (
            "shard_excess_units".into(),
            s.shard_excess_units.to_string(),
        ),
        (
            "conservation_failures".into(),
            s.conservation_failures.to_string(),
        ),
        ("findings".into(), s.findings.to_string()),
        (
            "debt_units (start)".into(),
            s.debt_units_at_start.to_string(),
        ),
        ("debt_units (end)".into(), s.debt_units.to_string()),
    ];
    for (name, value) in s.balances_at_start.terms() {
        pairs.push((format!("total {name} (start)"), value.to_string()));
    }
    for (name, value) in s.balances.terms() {
        pairs.push((format!("total {name} (end)"), value.to_string()));
    }
    for (key, l) in &s.partitions {
        let check = if l.check().is_ok() { "ok" } else { "BROKEN" };
        pairs.push((
            format!("partition {key}"),
            format!(
                "available={} reserved={} spent={} overdraft_issued={} overdraft_repaid={} conservation={check}",
                l.available_units, l.reserved_units, l.spent_units, l.overdraft_issued_units, l.overdraft_repaid_units
            ),
        ));
    }
    pairs
}
