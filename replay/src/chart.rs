//! The HTML statement's timeline: the tenant's books over time, drawn as
//! inline SVG by plotters' SVG backend from the statement's own rows.
//!
//! Four step lines — available, reserved, spent (cumulative), debt — each the
//! sum over the tenant's partitions of that term after every row, a partition
//! counting from its balance at the start of the range
//! ([`crate::audit::Summary::partitions_at_start`]); nothing is recomputed
//! from events. Refusals are crosses on the available line. Generation
//! switches, epoch rolls, closes, moves and shard issue/remint are numbered
//! dashed verticals, explained in a list under the chart.
//!
//! Rows are drawn in time order (across log partitions the statement's rows
//! are in log order). The `<figure>` carries the mapping between data and
//! pixels as `data-*` attributes, so a reader (the test) can read the values
//! back from the polylines that were drawn.

use std::collections::BTreeMap;

use plotters::element::DashedPathElement;
use plotters::prelude::*;
use reservoir_core::{Ledger, PartitionKey};

use crate::audit::{time_text, Row};

pub const WIDTH_PX: u32 = 1000;
pub const HEIGHT_PX: u32 = 380;

/// The lines of the chart (an exhaustive match: a new one needs a colour and a term).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line {
    Available,
    Reserved,
    Spent,
    Debt,
}

impl Line {
    pub const ALL: [Line; 4] = [Line::Available, Line::Reserved, Line::Spent, Line::Debt];

    pub fn name(self) -> &'static str {
        match self {
            Line::Available => "available",
            Line::Reserved => "reserved",
            Line::Spent => "spent (cumulative)",
            Line::Debt => "debt",
        }
    }

    /// The `data-series` name (no spaces).
    pub fn key(self) -> &'static str {
        match self {
            Line::Available => "available_units",
            Line::Reserved => "reserved_units",
            Line::Spent => "spent_units",
            Line::Debt => "debt_units",
        }
    }

    pub fn color(self) -> RGBColor {
        match self {
            Line::Available => RGBColor(0x1F, 0x77, 0xB4),
            Line::Reserved => RGBColor(0xFF, 0x7F, 0x0E),
            Line::Spent => RGBColor(0x2C, 0xA0, 0x2C),
            Line::Debt => RGBColor(0x94, 0x67, 0xBD),
        }
    }

    fn value(self, l: &Ledger) -> u128 {
        u128::from(match self {
            Line::Available => l.available_units,
            Line::Reserved => l.reserved_units,
            Line::Spent => l.spent_units,
            Line::Debt => l.debt_units().unwrap_or(0),
        })
    }
}

pub const REFUSAL_COLOR: RGBColor = RGBColor(0xD6, 0x27, 0x28);
const MARK_COLOR: RGBColor = RGBColor(0x7F, 0x7F, 0x7F);

/// `#RRGGBB`, as plotters writes a stroke.
pub fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// An annotated event: its number on the chart, when, and what.
pub struct Mark {
    pub number: usize,
    pub at_ms: u64,
    pub label: String,
}

pub struct Timeline {
    /// `<figure …><svg …>…</svg></figure>`.
    pub figure: String,
    pub marks: Vec<Mark>,
    pub refusals: usize,
}

/// Draws the timeline of `rows`; `None` when there is nothing to draw.
pub fn draw(
    rows: &[Row],
    keys: &BTreeMap<String, PartitionKey>,
    at_start: &BTreeMap<String, Ledger>,
) -> Result<Option<Timeline>, String> {
    let mut order: Vec<&Row> = rows.iter().collect();
    order.sort_by_key(|r| r.at_ms);
    let (Some(first), Some(last)) = (order.first(), order.last()) else {
        return Ok(None);
    };
    let (t0, t1) = (first.at_ms, last.at_ms.max(first.at_ms + 1));

    let mut latest: BTreeMap<&str, Ledger> =
        at_start.iter().map(|(k, l)| (k.as_str(), *l)).collect();
    let mut totals = Line::ALL.map(|line| latest.values().map(|l| line.value(l)).sum::<u128>());
    let mut points: [Vec<(f64, f64)>; 4] =
        std::array::from_fn(|i| vec![(t0 as f64, totals[i] as f64)]);
    let mut refusals = Vec::new();
    let mut marks = Vec::new();
    let mut active: BTreeMap<(&str, &str), &PartitionKey> = BTreeMap::new();
    for row in &order {
        let x = row.at_ms as f64;
        let before = latest
            .insert(row.partition.as_str(), row.balance)
            .unwrap_or_default();
        for (i, line) in Line::ALL.into_iter().enumerate() {
            points[i].push((x, totals[i] as f64));
            // The sum includes `before`: this never goes below zero.
            totals[i] = totals[i] - line.value(&before) + line.value(&row.balance);
            points[i].push((x, totals[i] as f64));
        }
        if row.event == "AdmissionRefused" {
            refusals.push((x, totals[0] as f64));
        }
        if let Some(label) = annotation(row, keys, &mut active) {
            marks.push(Mark {
                number: marks.len() + 1,
                at_ms: row.at_ms,
                label,
            });
        }
    }
    let y_max = points.iter().flatten().map(|&(_, y)| y).fold(1.0, f64::max) * 1.08;

    let mut svg = String::new();
    let mapping = {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(text)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(48)
            .x_label_area_size(32)
            .y_label_area_size(64)
            .build_cartesian_2d(t0 as f64..t1 as f64, 0.0..y_max)
            .map_err(text)?;
        let clock = |ms: &f64| clock_text(*ms as u64);
        chart
            .configure_mesh()
            .x_labels(8)
            .y_labels(6)
            .x_label_formatter(&clock)
            .y_label_formatter(&|units: &f64| format!("{units:.0}"))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 14))
            .y_desc("units")
            .light_line_style(RGBColor(0xEE, 0xEE, 0xEE))
            .draw()
            .map_err(text)?;
        for (i, mark) in marks.iter().enumerate() {
            let x = mark.at_ms as f64;
            // Marks close in time would print their numbers on one another:
            // three rows of labels, in turn.
            let label_y = y_max * (1.0 - 0.05 * (i % 3) as f64);
            chart
                .draw_series(std::iter::once(DashedPathElement::new(
                    [(x, 0.0), (x, y_max)],
                    4,
                    3,
                    MARK_COLOR.stroke_width(1),
                )))
                .map_err(text)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    mark.number.to_string(),
                    (x, label_y),
                    ("sans-serif", 16).into_font().color(&MARK_COLOR),
                )))
                .map_err(text)?;
        }
        for (i, line) in Line::ALL.into_iter().enumerate() {
            let series = std::mem::take(&mut points[i]);
            chart
                .draw_series(LineSeries::new(series, line.color().stroke_width(2)))
                .map_err(text)?;
        }
        chart
            .draw_series(
                refusals
                    .iter()
                    .map(|&p| Cross::new(p, 5, REFUSAL_COLOR.stroke_width(2))),
            )
            .map_err(text)?;
        let (px0, py0) = chart.backend_coord(&(t0 as f64, 0.0));
        let (px1, py1) = chart.backend_coord(&(t1 as f64, y_max));
        root.present().map_err(text)?;
        format!(
            r#"data-x0-ms="{t0}" data-x1-ms="{t1}" data-y1-units="{y_max}" data-px-x0="{px0}" data-px-x1="{px1}" data-px-y0="{py0}" data-px-y1="{py1}""#
        )
    };
    // Inline SVG in HTML needs no namespace, and the page names no URL at all.
    let svg = svg.replacen(r#" xmlns="http://www.w3.org/2000/svg""#, "", 1);
    let series: Vec<String> = Line::ALL
        .iter()
        .map(|l| format!("{}={}", l.key(), hex(l.color())))
        .collect();
    let figure = format!(
        r#"<figure class="timeline" {mapping} data-series="{}" data-refusal-color="{}">{svg}</figure>"#,
        series.join(" "),
        hex(REFUSAL_COLOR),
    );
    Ok(Some(Timeline {
        figure,
        marks,
        refusals: refusals.len(),
    }))
}

fn text(e: impl std::fmt::Display) -> String {
    format!("drawing the timeline: {e}")
}

/// `HH:MM:SS.mmm` (UTC) of a writer-assigned time.
fn clock_text(at_ms: u64) -> String {
    let full = time_text(at_ms);
    full.get(11..23).unwrap_or(&full).to_string()
}

/// What an event means for the chart's annotations, if anything:
/// generation switches and epoch rolls (a new partition of a subject/route
/// that had another), closes, moves, shard issue and remint.
fn annotation<'k>(
    row: &Row,
    keys: &'k BTreeMap<String, PartitionKey>,
    active: &mut BTreeMap<(&'k str, &'k str), &'k PartitionKey>,
) -> Option<String> {
    let key = keys.get(&row.partition)?;
    let moved = |term: &str| row.delta.get(term).copied().unwrap_or(0);
    let label = match row.event {
        "PartitionOpened" => {
            let sr = (key.subject.as_str(), key.route.as_str());
            // The subject/route's partition before this one: the last opened
            // in the range, else one that existed before it.
            let previous = active.insert(sr, key).or_else(|| {
                keys.values()
                    .filter(|k| (k.subject.as_str(), k.route.as_str()) == sr && *k < key)
                    .max()
            });
            match previous {
                None => format!("opened {}", short_key(key)),
                Some(p) if p.accounting_epoch != key.accounting_epoch => {
                    format!("epoch roll {} → {}", short_key(p), short_key(key))
                }
                Some(p) => format!(
                    "generation switch {} → g{}",
                    short_key(p),
                    key.policy_generation
                ),
            }
        }
        "Closed" => format!("closed {}", short_key(key)),
        "MovedOut" => format!(
            "moved {} units out of {}{}",
            moved("moved_out_units"),
            short_key(key),
            if row.drained { "; drained" } else { "" }
        ),
        "MovedIn" => format!(
            "moved {} units into {}",
            moved("moved_in_units"),
            short_key(key)
        ),
        "ShardIssued" => format!(
            "emergency shard issued from {} ({} units)",
            short_key(key),
            moved("retired_for_emergency_units")
        ),
        "ShardReminted" => format!(
            "shard reminted into {} ({} units)",
            short_key(key),
            moved("reminted_units")
        ),
        _ => return None,
    };
    Some(label)
}

/// `route · epoch · g<generation>` (the tenant is the statement's).
pub fn short_key(k: &PartitionKey) -> String {
    format!(
        "{} · {} · g{}",
        k.route, k.accounting_epoch, k.policy_generation
    )
}
