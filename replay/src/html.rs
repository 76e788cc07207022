//! `audit --format html`: the statement as one self-contained, printable page.
//!
//! It draws what the other formats print — the same [`Row`]s, [`Finding`]s
//! and [`Summary`] — and computes no balance of its own: a header (tenant,
//! period, partitions and generations covered, every conservation term at the
//! start and the end of the range), the timeline ([`crate::chart`]), the
//! findings, the per-event table (time, event, reservation, the change of every
//! term that changes, the check after the event; findings, broken checks,
//! refusals and overdrafts highlighted), and the summary's totals, each cell
//! named by its key in the JSON statement (`data-summary`).
//!
//! Self-contained: the style is inline, the chart is inline SVG, there is no
//! script, no font, no image and no link to anything outside, and a Content
//! Security Policy of `default-src 'none'` says so to the browser.

use std::collections::BTreeMap;
use std::fmt::Write;

use html_escape::{encode_double_quoted_attribute as attr, encode_text as esc};
use reservoir_core::{Ledger, PartitionKey, Side, Term};

use crate::audit::{short, time_text, Row, Scope, Summary};
use crate::chart::{self, Line};
use crate::engine::Finding;
use crate::Point;

/// The rows an HTML statement collects while the replay runs.
#[derive(Default)]
pub struct Collected {
    pub rows: Vec<Row>,
    /// The partition of every row, by its key text.
    pub keys: BTreeMap<String, PartitionKey>,
}

/// Everything the page shows.
pub struct Page<'a> {
    pub scope: &'a Scope,
    pub summary: &'a Summary,
    pub rows: &'a [Row],
    pub keys: &'a BTreeMap<String, PartitionKey>,
    pub findings: &'a [Finding],
}

const STYLE: &str = r#"
body { font: 13px/1.4 system-ui, sans-serif; color: #222; margin: 24px; }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 15px; margin: 22px 0 6px; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; margin: 0; }
dl.facts dt { color: #666; } dl.facts dd { margin: 0; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 2px 8px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; font-weight: 600; } td.l, th.l { text-align: left; }
tr.refusal td { background: #fdf0f0; } tr.overdraft td { background: #f6effb; }
tr.broken td, tr.finding td { background: #ffd9d9; font-weight: 600; }
.ok { color: #2a7a2a; } .bad { color: #b00000; font-weight: 600; }
figure.timeline { margin: 0; } figure.timeline svg { max-width: 100%; height: auto; }
ul.legend { list-style: none; padding: 0; margin: 4px 0; display: flex; gap: 18px; }
ul.legend span { display: inline-block; width: 18px; height: 3px; vertical-align: middle; margin-right: 6px; }
ul.findings li { color: #b00000; }
footer { margin-top: 24px; color: #777; font-size: 11px; }
@page { size: A4 landscape; margin: 12mm; }
@media print {
  body { margin: 0; font-size: 10px; }
  th, td { padding: 1px 4px; }
  thead { display: table-header-group; }
  tr, figure, #timeline, #terms { break-inside: avoid; }
  h2 { break-after: avoid; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
}
"#;

/// The whole page.
pub fn render(page: &Page<'_>) -> Result<String, String> {
    let timeline = chart::draw(page.rows, page.keys, &page.summary.partitions_at_start)?;
    let mut h = String::new();
    let tenant = &page.scope.tenant;
    let _ = write!(
        h,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Capacity statement: {}</title><style>{STYLE}</style></head><body>
"#,
        esc(tenant)
    );
    header(&mut h, page);
    terms(&mut h, page.summary);
    partitions(&mut h, page);
    h.push_str("<section id=\"timeline\"><h2>Timeline</h2>\n");
    match &timeline {
        Some(t) => timeline_section(&mut h, t),
        None => h.push_str("<p>No event in the range.</p>\n"),
    }
    h.push_str("</section>\n");
    findings(&mut h, page.findings);
    events(&mut h, page);
    totals(&mut h, page.summary);
    h.push_str(
        "<footer>reservoir-replay audit --format html: replayed from the event log alone with the core's own apply; \
         every figure on this page is the statement's (the same rows and summary as --format jsonl).</footer>\n</body></html>\n",
    );
    Ok(h)
}

fn point_text(p: &Option<Point>, open: &str) -> String {
    match p {
        None => open.to_string(),
        Some(Point::TimeMs(ms)) => time_text(*ms),
        Some(Point::Positions(map)) => map
            .iter()
            .map(|(lp, o)| format!("{lp}:{o}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn header(h: &mut String, page: &Page<'_>) {
    let (s, scope) = (page.summary, page.scope);
    let mut generations: Vec<u64> = page.keys.values().map(|k| k.policy_generation).collect();
    generations.sort_unstable();
    generations.dedup();
    let mut epochs: Vec<&str> = page
        .keys
        .values()
        .map(|k| k.accounting_epoch.as_str())
        .collect();
    epochs.sort_unstable();
    epochs.dedup();
    let first = page.rows.iter().map(|r| r.at_ms).min();
    let last = page.rows.iter().map(|r| r.at_ms).max();
    let events_text = match (first, last) {
        (Some(a), Some(b)) => format!("{} … {}", time_text(a), time_text(b)),
        _ => "none".to_string(),
    };
    let check = if s.conservation_failures == 0 {
        "<span class=\"ok\">balanced after every event</span>".to_string()
    } else {
        format!(
            "<span class=\"bad\">{} event(s) with a broken check</span>",
            s.conservation_failures
        )
    };
    let _ = writeln!(
        h,
        "<header><h1>Capacity statement: {}</h1><dl class=\"facts\">",
        esc(&scope.tenant)
    );
    let gens: Vec<String> = generations.iter().map(|g| format!("g{g}")).collect();
    let facts = [
        ("Tenant", esc(&scope.tenant).into_owned()),
        (
            "Route",
            scope
                .route
                .as_deref()
                .map_or("every route".into(), |r| esc(r).into_owned()),
        ),
        (
            "Period",
            format!(
                "from {} to {}",
                esc(&point_text(&scope.from, "the first event")),
                esc(&point_text(&scope.to, "the end of the log"))
            ),
        ),
        ("Events in range", format!("{} ({events_text})", s.events)),
        (
            "Partitions covered",
            format!(
                "{} (accounting epochs {})",
                page.keys.len(),
                esc(&epochs.join(", "))
            ),
        ),
        ("Generations covered", gens.join(", ")),
        ("Conservation", check),
        (
            "Findings",
            if s.findings == 0 {
                "none".to_string()
            } else {
                format!(
                    "<a class=\"bad\" href=\"#findings\">{} (below)</a>",
                    s.findings
                )
            },
        ),
    ];
    for (name, value) in facts {
        let _ = writeln!(h, "<dt>{name}</dt><dd>{value}</dd>");
    }
    h.push_str("</dl></header>\n");
}

/// Every term at the start and the end of the range, summed over the partitions.
fn terms(h: &mut String, s: &Summary) {
    h.push_str(
        "<section id=\"terms\"><h2>Conservation terms (all partitions)</h2>\n<table><thead><tr>\
         <th class=\"l\">term</th><th class=\"l\">side</th><th>at start</th><th>at end</th><th>change</th></tr></thead><tbody>\n",
    );
    let (a, b) = (&s.balances_at_start, &s.balances);
    for term in Term::ALL {
        let side = match term.side() {
            Side::Source => "source",
            Side::Destination => "destination",
            Side::Debt => "debt carried",
        };
        let name = term.name();
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{name}</td><td class=\"l\">{side}</td>\
             <td data-summary=\"balances_at_start.{name}\">{}</td><td data-summary=\"balances.{name}\">{}</td><td>{:+}</td></tr>",
            a.get(term),
            b.get(term),
            i128::from(b.get(term)) - i128::from(a.get(term))
        );
    }
    let _ = writeln!(
        h,
        "<tr><td class=\"l\">debt_units</td><td class=\"l\">issued − repaid ± moved</td>\
         <td data-summary=\"debt_units_at_start\">{}</td><td data-summary=\"debt_units\">{}</td><td>{:+}</td></tr>",
        s.debt_units_at_start,
        s.debt_units,
        i128::from(s.debt_units) - i128::from(s.debt_units_at_start)
    );
    let _ = writeln!(
        h,
        "<tr><td class=\"l\">sources = destinations</td><td></td><td>{}</td><td>{}</td><td></td></tr>",
        equation(a),
        equation(b)
    );
    h.push_str("</tbody></table></section>\n");
}

fn equation(l: &Ledger) -> String {
    let (src, dst) = (l.sources(), l.destinations());
    match l.check() {
        Ok(()) => format!("<span class=\"ok\">{src} = {dst}</span>"),
        Err(e) => format!("<span class=\"bad\">{}</span>", esc(&e.to_string())),
    }
}

fn partitions(h: &mut String, page: &Page<'_>) {
    h.push_str(
        "<section id=\"partitions\"><h2>Partitions</h2>\n<table><thead><tr><th class=\"l\">partition</th>\
         <th>rows</th><th>available at start</th><th>available at end</th><th>reserved at end</th>\
         <th>spent at end</th><th>debt at end</th><th class=\"l\">check at end</th></tr></thead><tbody>\n",
    );
    let mut rows_of: BTreeMap<&str, usize> = BTreeMap::new();
    for r in page.rows {
        *rows_of.entry(r.partition.as_str()).or_default() += 1;
    }
    let s = page.summary;
    for (key, end) in &s.partitions {
        let start = s.partitions_at_start.get(key).copied().unwrap_or_default();
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            esc(key),
            rows_of.get(key.as_str()).copied().unwrap_or(0),
            start.available_units,
            end.available_units,
            end.reserved_units,
            end.spent_units,
            end.debt_units().unwrap_or(0),
            equation(end)
        );
    }
    h.push_str("</tbody></table></section>\n");
}

fn timeline_section(h: &mut String, t: &chart::Timeline) {
    h.push_str("<ul class=\"legend\">");
    for line in Line::ALL {
        let _ = write!(
            h,
            "<li><span style=\"background:{}\"></span>{}</li>",
            chart::hex(line.color()),
            line.name()
        );
    }
    let _ = writeln!(
        h,
        "<li><span style=\"background:{}\"></span>refusal ({} ×)</li></ul>",
        chart::hex(chart::REFUSAL_COLOR),
        t.refusals
    );
    h.push_str(&t.figure);
    h.push('\n');
    if !t.marks.is_empty() {
        h.push_str("<ol class=\"marks\">\n");
        for m in &t.marks {
            let _ = writeln!(
                h,
                "<li value=\"{}\">{}: {}</li>",
                m.number,
                time_text(m.at_ms),
                esc(&m.label)
            );
        }
        h.push_str("</ol>\n");
    }
}

fn findings(h: &mut String, findings: &[Finding]) {
    if findings.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<section id=\"findings\"><h2>Findings ({})</h2><ul class=\"findings\">",
        findings.len()
    );
    for (i, f) in findings.iter().enumerate() {
        let _ = writeln!(
            h,
            "<li><a href=\"#finding-{i}\">{}</a></li>",
            esc(&f.to_string())
        );
    }
    h.push_str("</ul></section>\n");
}

/// The per-event table, findings placed at their log position.
fn events(h: &mut String, page: &Page<'_>) {
    // A column for every term that changes somewhere in the range; the others
    // stay as the terms table shows them.
    let changed: Vec<Term> = Term::ALL
        .into_iter()
        .filter(|t| page.rows.iter().any(|r| r.delta.contains_key(t.name())))
        .collect();
    let many = page.keys.len() > 1;
    h.push_str("<section id=\"events\"><h2>Events</h2>\n<table><thead><tr><th>#</th><th class=\"l\">time</th><th>position</th>");
    if many {
        h.push_str("<th class=\"l\">partition</th>");
    }
    h.push_str("<th>seq</th><th class=\"l\">event</th><th class=\"l\">reservation</th>");
    for t in &changed {
        let _ = write!(h, "<th title=\"{}\">Δ {}</th>", t.name(), short(*t));
    }
    h.push_str("<th>available</th><th>reserved</th><th>debt</th><th class=\"l\">check</th></tr></thead><tbody>\n");
    let columns = 10 + changed.len() + usize::from(many);
    let mut pending = page.findings.iter().enumerate().peekable();
    for (n, row) in page.rows.iter().enumerate() {
        while let Some((i, f)) =
            pending.next_if(|(_, f)| (f.log_partition, f.offset) < (row.log_partition, row.offset))
        {
            finding_row(h, i, f, columns);
        }
        let class = if row.conservation != "ok" {
            "broken"
        } else if row.event == "AdmissionRefused" {
            "refusal"
        } else if row.delta.contains_key(Term::OverdraftIssued.name()) {
            "overdraft"
        } else {
            ""
        };
        let _ = write!(
            h,
            "<tr class=\"{class}\"><td>{}</td><td class=\"l\">{}</td><td>{}:{}</td>",
            n + 1,
            time_text(row.at_ms),
            row.log_partition,
            row.offset
        );
        if many {
            let label = page
                .keys
                .get(&row.partition)
                .map_or_else(|| row.partition.clone(), chart::short_key);
            let _ = write!(h, "<td class=\"l\">{}</td>", esc(&label));
        }
        let _ = write!(
            h,
            "<td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td>",
            row.sequence,
            row.event,
            esc(row.reservation.as_deref().unwrap_or(""))
        );
        for t in &changed {
            match row.delta.get(t.name()) {
                Some(d) => {
                    let _ = write!(h, "<td>{d:+}</td>");
                }
                None => h.push_str("<td></td>"),
            }
        }
        let check = if row.conservation == "ok" {
            "<span class=\"ok\">ok</span>".to_string()
        } else {
            format!("<span class=\"bad\">{}</span>", esc(&row.conservation))
        };
        let _ = writeln!(
            h,
            "<td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{check}</td></tr>",
            row.balance.available_units, row.balance.reserved_units, row.debt_units
        );
    }
    for (i, f) in pending {
        finding_row(h, i, f, columns);
    }
    h.push_str("</tbody></table></section>\n");
}

fn finding_row(h: &mut String, i: usize, f: &Finding, columns: usize) {
    let _ = writeln!(
        h,
        "<tr class=\"finding\" id=\"finding-{i}\"><td colspan=\"{columns}\" class=\"l\">finding: {}</td></tr>",
        esc(&f.to_string())
    );
}

/// The summary's scalar totals, each named by its key in the JSON statement.
fn totals(h: &mut String, s: &Summary) {
    h.push_str("<section id=\"totals\"><h2>Totals</h2>\n<table><tbody>\n");
    let value = serde_json::to_value(s).expect("the summary serializes");
    if let Some(fields) = value.as_object() {
        for (key, v) in fields.iter().filter(|(_, v)| !v.is_object()) {
            let _ = writeln!(
                h,
                "<tr><th class=\"l\">{}</th><td data-summary=\"{}\">{v}</td></tr>",
                esc(key),
                attr(key)
            );
        }
    }
    h.push_str("</tbody></table></section>\n");
}
