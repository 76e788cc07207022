//! `audit`: the statement for one disputed tenant.
//!
//! Every event of the tenant's partitions (optionally one route) in log order,
//! each row with: where it is (log partition, offset, sequence), when, the event
//! type, the reservation it touched, the change of every conservation term, the
//! running balance of every term, the debt, and the full conservation check
//! (`Partition::check_invariants`: the equation, debt ≥ 0, reserved = Σ held)
//! after the event. The whole history is replayed (balances need it); `--from`
//! and `--to` choose which rows are printed and summed. A summary closes it:
//! reserved, spent, refunded, expired, overdraft issued and repaid, refusals,
//! and the balances at the start and the end, per partition and in total
//! ([`Summary`], in `summary.rs`).
//! `--format html` draws the same rows and summary as one self-contained page
//! ([`crate::html`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use reservoir_core::{Ledger, PartitionKey, Term};
use serde::Serialize;
use serde_json::json;

use crate::engine::{Applied, Finding};
pub use crate::summary::Summary;
use crate::summary::{summary_pairs, total};
use crate::Point;

impl crate::engine::Visit for Statement<'_> {
    fn event(&mut self, applied: Applied<'_>) {
        self.applied(&applied);
    }
}

/// Short names of the terms for the table (an exhaustive match: a new term
/// cannot go without one).
pub fn short(term: Term) -> &'static str {
    match term {
        Term::Opening => "opening",
        Term::Minted => "minted",
        Term::Reminted => "reminted",
        Term::MovedIn => "moved_in",
        Term::OverdraftIssued => "od_issued",
        Term::Available => "available",
        Term::Reserved => "reserved",
        Term::Spent => "spent",
        Term::RetiredForEmergency => "retired",
        Term::OverdraftRepaid => "od_repaid",
        Term::MovedOut => "moved_out",
        Term::DebtMovedIn => "debt_in",
        Term::DebtMovedOut => "debt_out",
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Jsonl,
    Csv,
    /// One self-contained, printable page with a timeline (a file, `-o`).
    Html,
}

/// What a statement covers: its tenant, optionally one route, and the range
/// of rows (`--from`, `--to`).
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub tenant: String,
    pub route: Option<String>,
    pub from: Option<Point>,
    pub to: Option<Point>,
    /// The dimension the statement is cut in (`--dimension`): partitions whose
    /// policy does not limit it are left out. Absent: each partition's primary.
    pub dimension: Option<reservoir_core::Dimension>,
}

/// Rows an HTML statement holds at most (it is drawn at the end, so its rows
/// stay in memory); `--html-rows-max` changes it.
pub const HTML_ROWS_MAX_DEFAULT: usize = 100_000;

/// One row of the statement.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub log_partition: u32,
    pub offset: u64,
    pub partition: String,
    pub sequence: u64,
    pub at_ms: u64,
    pub event: &'static str,
    pub reservation: Option<String>,
    /// The dimension the terms count (`requests`, `input_tokens`, …).
    pub dimension: &'static str,
    /// Change of every term (signed).
    pub delta: BTreeMap<&'static str, i128>,
    /// Every term after the event.
    pub balance: Ledger,
    pub debt_units: u64,
    /// `ok`, or what the conservation check found.
    pub conservation: String,
    /// The partition is closed and, after this event, drained: nothing
    /// reserved, no debt, no shard out (nothing more will move out of it).
    pub drained: bool,
}

pub struct Statement<'w> {
    out: &'w mut dyn Write,
    format: Format,
    scope: Scope,
    pub summary: Summary,
    pub error: Option<std::io::Error>,
    /// `--format html`: the rows, kept for the page drawn at the end.
    html: crate::html::Collected,
    pub html_rows_max: usize,
    /// Without `--dimension`: the primary dimension of every partition
    /// counted. More than one, and the totals would add unlike units.
    pub primaries: BTreeSet<reservoir_core::Dimension>,
}

impl<'w> Statement<'w> {
    pub fn new(out: &'w mut dyn Write, format: Format, scope: Scope) -> Self {
        let mut s = Self {
            out,
            format,
            scope,
            summary: Summary::default(),
            error: None,
            html: crate::html::Collected::default(),
            html_rows_max: HTML_ROWS_MAX_DEFAULT,
            primaries: BTreeSet::new(),
        };
        s.header();
        s
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(bytes) {
                self.error = Some(e);
            }
        }
    }

    fn header(&mut self) {
        match self.format {
            Format::Table => {
                let line = format!(
                    "{:<12} {:<38} {:>6} {:<24} {:<16} {:<20} {:<13} {:<40} {}\n",
                    "position",
                    "partition",
                    "seq",
                    "at",
                    "event",
                    "reservation",
                    "dimension",
                    "change",
                    "balances after | check"
                );
                self.write(line.as_bytes());
            }
            Format::Csv => {
                let mut header = vec![
                    "kind",
                    "log_partition",
                    "offset",
                    "partition",
                    "sequence",
                    "at_ms",
                    "event",
                    "reservation",
                    "dimension",
                ];
                header.extend(Term::ALL.map(Term::name));
                let after: Vec<String> = Term::ALL.iter().map(|t| format!("after_{t}")).collect();
                let mut header: Vec<String> = header
                    .into_iter()
                    .map(|h| {
                        if h.ends_with("_units") {
                            format!("delta_{h}")
                        } else {
                            h.to_string()
                        }
                    })
                    .collect();
                header.extend(after);
                header.push("debt_units".into());
                header.push("conservation".into());
                header.push("drained".into());
                self.csv_row(&header);
            }
            Format::Jsonl | Format::Html => {}
        }
    }

    fn csv_row<S: AsRef<[u8]>>(&mut self, fields: &[S]) {
        if self.format != Format::Csv {
            return;
        }
        // One small writer per row: csv quotes and escapes, we own the stream.
        let mut w = csv::WriterBuilder::new()
            .flexible(true)
            .has_headers(false)
            .from_writer(Vec::new());
        match w
            .write_record(fields)
            .map_err(std::io::Error::other)
            .and_then(|_| {
                w.into_inner()
                    .map_err(|e| std::io::Error::other(e.to_string()))
            }) {
            Ok(bytes) => self.write(&bytes),
            Err(e) => self.error = Some(e),
        }
    }

    /// One applied event.
    fn applied(&mut self, a: &Applied<'_>) {
        let (lp, offset, at) = (a.position.log_partition, a.position.offset, a.event.at_ms);
        let (from, to) = (&self.scope.from, &self.scope.to);
        let up_to_end = to.as_ref().is_none_or(|p| p.admits_to(lp, offset, at));
        let in_range = from.as_ref().is_none_or(|p| p.admits_from(lp, offset, at)) && up_to_end;
        // The dimension this statement is cut in, in this partition.
        let partition = &a.state.partition;
        if let (None, Some(policy), true) = (self.scope.dimension, &partition.policy, up_to_end) {
            self.primaries.insert(policy.limit(0).dimension);
        }
        let index = match (self.scope.dimension, partition.policy.as_ref()) {
            (None, _) => Some(0),
            (Some(d), Some(policy)) => policy.dimension_index(d),
            (Some(_), None) => None,
        };
        let Some(index) = index else {
            return;
        };
        let (before, after) = match index {
            0 => (a.before, partition.ledger),
            // Absent before the partition opened: all zero.
            i => (
                a.before_further.get(i - 1).copied().unwrap_or_default(),
                *partition.ledger_of(i),
            ),
        };
        let dimension = partition
            .policy
            .as_ref()
            .map_or("", |p| p.limit(index).dimension.name());
        let key_text = a.key.to_string();
        if in_range {
            self.summary.count(a.event, index.checked_sub(1));
        }
        // The balances at the start and the end of the range, whether or not
        // rows are printed.
        if up_to_end {
            let at_start = &mut self.summary.partitions_at_start;
            if in_range {
                at_start.entry(key_text.clone()).or_insert(before);
            } else {
                at_start.insert(key_text.clone(), after);
            }
            self.summary.partitions.insert(key_text.clone(), after);
            if self.format == Format::Html && !self.html.keys.contains_key(&key_text) {
                self.html.keys.insert(key_text.clone(), a.key.clone());
            }
        }
        if !in_range {
            return;
        }
        let conservation = match a.state.partition.check_invariants() {
            Ok(()) => "ok".to_string(),
            Err(e) => {
                self.summary.conservation_failures += 1;
                e.to_string()
            }
        };
        let row = Row {
            log_partition: lp,
            offset,
            partition: key_text,
            sequence: a.event.sequence,
            at_ms: at,
            event: a.event.body.type_name(),
            reservation: a.event.body.reservation_id().map(|id| id.to_string()),
            dimension,
            delta: before
                .terms()
                .filter(|&(t, b)| b != after.get(t))
                .map(|(t, b)| (t.name(), i128::from(after.get(t)) - i128::from(b)))
                .collect(),
            balance: after,
            debt_units: after.debt_units().unwrap_or(0),
            conservation,
            drained: partition.drained(),
        };
        self.row(row);
    }

    fn row(&mut self, row: Row) {
        let row = &row;
        match self.format {
            Format::Html => {
                if self.html.rows.len() < self.html_rows_max {
                    self.html.rows.push(row.clone());
                } else if self.error.is_none() {
                    self.error = Some(std::io::Error::other(format!(
                        "an HTML statement holds at most {} rows (--html-rows-max): narrow it with --from/--to or --route, or use --format jsonl",
                        self.html_rows_max
                    )));
                }
            }
            Format::Jsonl => {
                let mut line = serde_json::to_vec(&json!({"kind": "event", "row": row}))
                    .expect("rows serialize");
                line.push(b'\n');
                self.write(&line);
            }
            Format::Csv => {
                let mut fields = vec![
                    "event".to_string(),
                    row.log_partition.to_string(),
                    row.offset.to_string(),
                    row.partition.clone(),
                    row.sequence.to_string(),
                    row.at_ms.to_string(),
                    row.event.to_string(),
                    row.reservation.clone().unwrap_or_default(),
                    row.dimension.to_string(),
                ];
                for t in Term::ALL {
                    fields.push(row.delta.get(t.name()).copied().unwrap_or(0).to_string());
                }
                for (_, value) in row.balance.terms() {
                    fields.push(value.to_string());
                }
                fields.push(row.debt_units.to_string());
                fields.push(row.conservation.clone());
                fields.push(row.drained.to_string());
                self.csv_row(&fields);
            }
            Format::Table => {
                let change: Vec<String> = Term::ALL
                    .iter()
                    .filter_map(|&t| {
                        row.delta
                            .get(t.name())
                            .map(|d| format!("{} {d:+}", short(t)))
                    })
                    .collect();
                let l = &row.balance;
                let line = format!(
                    "{:<12} {:<38} {:>6} {:<24} {:<16} {:<20} {:<13} {:<40} avail={} resv={} spent={} minted={} od_issued={} od_repaid={} debt={} | {}{}\n",
                    format!("{}:{}", row.log_partition, row.offset),
                    row.partition,
                    row.sequence,
                    time_text(row.at_ms),
                    row.event,
                    row.reservation.as_deref().unwrap_or("-"),
                    row.dimension,
                    if change.is_empty() { "-".to_string() } else { change.join(", ") },
                    l.available_units,
                    l.reserved_units,
                    l.spent_units,
                    l.minted_units,
                    l.overdraft_issued_units,
                    l.overdraft_repaid_units,
                    row.debt_units,
                    row.conservation,
                    if row.drained { " | drained" } else { "" },
                );
                self.write(line.as_bytes());
            }
        }
    }

    /// Findings, then the summary; closes the statement.
    pub fn finish(&mut self, findings: &[Finding]) {
        self.summary.findings = findings.len() as u64;
        let (start, end) = (
            total(self.summary.partitions_at_start.values()),
            total(self.summary.partitions.values()),
        );
        self.summary.balances_at_start = start;
        self.summary.debt_units_at_start = start.debt_units().unwrap_or(0);
        self.summary.balances = end;
        self.summary.debt_units = end.debt_units().unwrap_or(0);
        let summary = self.summary.clone();
        match self.format {
            Format::Html => {
                let page = crate::html::Page {
                    scope: &self.scope,
                    summary: &summary,
                    rows: &self.html.rows,
                    keys: &self.html.keys,
                    findings,
                };
                match crate::html::render(&page) {
                    Ok(text) => self.write(text.as_bytes()),
                    Err(e) => self.error = Some(std::io::Error::other(e)),
                }
            }
            Format::Jsonl => {
                for f in findings {
                    let mut line = serde_json::to_vec(&json!({"kind": "finding", "finding": f}))
                        .expect("findings serialize");
                    line.push(b'\n');
                    self.write(&line);
                }
                let mut line = serde_json::to_vec(&json!({"kind": "summary", "summary": summary}))
                    .expect("summary serializes");
                line.push(b'\n');
                self.write(&line);
            }
            Format::Csv => {
                for f in findings {
                    self.csv_row(&[
                        "finding".to_string(),
                        f.log_partition.to_string(),
                        f.offset.to_string(),
                        f.partition.clone().unwrap_or_default(),
                        f.sequence.map(|s| s.to_string()).unwrap_or_default(),
                        String::new(),
                        f.kind.to_string(),
                        f.detail.clone(),
                    ]);
                }
                for (name, value) in summary_pairs(&summary) {
                    self.csv_row(&["summary".to_string(), name, value]);
                }
            }
            Format::Table => {
                let mut text = String::new();
                if !findings.is_empty() {
                    text.push_str(&format!("\nFINDINGS ({})\n", findings.len()));
                    for f in findings {
                        text.push_str(&format!("  {f}\n"));
                    }
                }
                text.push_str("\nSUMMARY\n");
                for (name, value) in summary_pairs(&summary) {
                    text.push_str(&format!("  {name:<40} {value}\n"));
                }
                self.write(text.as_bytes());
            }
        }
    }
}

/// RFC 3339 with milliseconds.
pub fn time_text(at_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(at_ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// The audit filter: the tenant's partitions, optionally one route.
pub fn filter(tenant: String, route: Option<String>) -> impl Fn(&PartitionKey) -> bool {
    move |k| k.subject == tenant && route.as_ref().is_none_or(|r| &k.route == r)
}
