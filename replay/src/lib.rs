//! # reservoir-replay
//!
//! `replay/` is the replay and audit tool: it re-derives any state of the
//! ledger from the event log alone, with the core's own `try_apply`, and never
//! reads a clock. Auditors and operators use it through the `reservoir-replay`
//! binary:
//! - [`audit`]: one disputed tenant's statement — every event in order, the
//!   reservation it touched, the change to every conservation term, the running
//!   balances and the conservation check after each event, and a summary;
//!   as a table, JSON lines, CSV, or one self-contained HTML page ([`html`],
//!   its timeline drawn by `chart` with plotters' SVG backend).
//! - [`state`]: balances and reservations exactly as they stood at a time or log
//!   position, as deterministic JSON (the same bytes the live projection holds).
//! - [`verify`]: re-derive every partition and compare with live projections.
//! - `rebuild`: fresh projections from the log with the projector's own code.
//! - [`export`]: events of a range as JSON lines or an Avro object container.
//!
//! The pieces: [`source`] reads the embedded log (as a RocksDB secondary, so a
//! running server keeps its lock) or a Kafka topic, and hands over undecodable
//! entries as data (decoded by `reservoir_log::codec`, whose fast reader
//! handles the current layout); [`engine`] applies the log's validity rule and
//! `try_apply`, turning everything that does not fit into a located
//! [`engine::Finding`] (what "continue" means is documented there).

use std::collections::BTreeMap;

pub mod audit;
mod chart;
pub mod engine;
pub mod export;
pub mod html;
pub mod moves;
pub mod progress;
pub mod shards;
pub mod source;
pub mod state;
mod summary;
pub mod verify;

pub use engine::{Engine, Finding, Limit};
pub use source::{Source, SourceSpec};

/// Why a run ended early.
#[derive(Debug)]
pub enum Stop {
    /// `--strict` and a finding.
    Strict(Finding),
    /// The log or an output could not be read or written.
    Error(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Strict(finding) => {
                write!(f, "stopped (--strict) at the first finding: {finding}")
            }
            Stop::Error(e) => write!(f, "{e}"),
        }
    }
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Error(e.to_string())
    }
}

/// A point of the log: a time, or positions.
///
/// Syntax: a plain number is an offset in log partition 0 (the embedded log);
/// `LP:OFFSET[,LP:OFFSET…]` names offsets per log partition (log partitions not
/// named are not limited); an RFC 3339 time (`2026-07-19T14:00:00Z`) or
/// `<n>ms` (milliseconds since the Unix epoch) is a time, compared with the
/// writer-assigned `at_ms` of each event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Point {
    TimeMs(u64),
    Positions(BTreeMap<u32, u64>),
}

impl std::str::FromStr for Point {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(ms) = s.strip_suffix("ms") {
            return ms
                .parse()
                .map(Point::TimeMs)
                .map_err(|e| format!("{s:?}: {e}"));
        }
        if s.contains('T') {
            let t = humantime::parse_rfc3339_weak(s).map_err(|e| format!("{s:?}: {e}"))?;
            let ms = t
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|e| format!("{s:?}: {e}"))?
                .as_millis();
            return u64::try_from(ms)
                .map(Point::TimeMs)
                .map_err(|e| format!("{s:?}: {e}"));
        }
        let mut map = BTreeMap::new();
        for part in s.split(',') {
            let (lp, offset) = match part.split_once(':') {
                Some((lp, offset)) => (
                    lp.parse::<u32>().map_err(|e| format!("{part:?}: {e}"))?,
                    offset,
                ),
                None => (0, part),
            };
            let offset = offset.parse::<u64>().map_err(|e| {
                format!("{part:?}: {e} (expected OFFSET, LP:OFFSET, an RFC 3339 time or <n>ms)")
            })?;
            if map.insert(lp, offset).is_some() {
                return Err(format!("log partition {lp} named twice in {s:?}"));
            }
        }
        Ok(Point::Positions(map))
    }
}

impl Point {
    /// As an inclusive upper bound: the exclusive end offset per log partition
    /// (capped at the log's end) and the time limit.
    pub fn as_upper(point: Option<&Point>, log_ends: &[u64]) -> Limit {
        match point {
            None => Limit {
                ends: log_ends.to_vec(),
                until_ms: None,
            },
            Some(Point::TimeMs(t)) => Limit {
                ends: log_ends.to_vec(),
                until_ms: Some(*t),
            },
            Some(Point::Positions(map)) => Limit {
                ends: log_ends
                    .iter()
                    .enumerate()
                    .map(|(lp, &end)| {
                        map.get(&(lp as u32))
                            .map_or(end, |&o| end.min(o.saturating_add(1)))
                    })
                    .collect(),
                until_ms: None,
            },
        }
    }

    /// As an inclusive lower bound: is the event at `position`/`at_ms` at or
    /// after this point?
    pub fn admits_from(&self, log_partition: u32, offset: u64, at_ms: u64) -> bool {
        match self {
            Point::TimeMs(t) => at_ms >= *t,
            Point::Positions(map) => map.get(&log_partition).is_none_or(|&o| offset >= o),
        }
    }

    /// As an inclusive upper bound on one event.
    pub fn admits_to(&self, log_partition: u32, offset: u64, at_ms: u64) -> bool {
        match self {
            Point::TimeMs(t) => at_ms <= *t,
            Point::Positions(map) => map.get(&log_partition).is_none_or(|&o| offset <= o),
        }
    }
}

/// The end offset of every log partition, as the log says now.
pub async fn log_ends(source: &Source) -> Result<Vec<u64>, Stop> {
    use reservoir_log::EventReader;
    let mut ends = Vec::new();
    for lp in 0..source.log_partitions() {
        ends.push(
            source
                .end_offset(lp)
                .await
                .map_err(|e| Stop::Error(e.to_string()))?,
        );
    }
    Ok(ends)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_parse() {
        let rows: Vec<(&str, Result<Point, ()>)> = vec![
            ("42", Ok(Point::Positions([(0, 42)].into()))),
            ("1:5,2:7", Ok(Point::Positions([(1, 5), (2, 7)].into()))),
            ("1500ms", Ok(Point::TimeMs(1500))),
            ("1970-01-01T00:00:01Z", Ok(Point::TimeMs(1000))),
            ("1:5,1:6", Err(())),
            ("abc", Err(())),
        ];
        for (text, expected) in rows {
            let got = text.parse::<Point>().map_err(|_| ());
            assert_eq!(got, expected, "{text}");
        }
    }
}
