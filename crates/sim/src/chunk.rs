//! Chunks of the release gate: a run of many interleavings saved as a file,
//! so a million can be run a few tens of thousands at a time, on several
//! days and machines, and merged into one gate table (`scripts/sim-gate`).
//!
//! A chunk file (JSON, [`Chunk`]) holds the run's [`Summary`] whole except
//! the per-run trace hashes, which it folds into one digest
//! ([`Summary::runs_digest`]): a rerun of the same seeds by the same
//! simulator gives the same digest, so a chunk can be checked without
//! keeping 20,000 hashes. UNKNOWN → resolved times are kept as a histogram
//! of simulated ms, so the merged percentiles are exact.
//!
//! Chunks run before this format existed survive only as the gate tables
//! their runs printed (bench-results/sim.md); [`Chunk::from_table`] reads
//! one back. Such a chunk has no digest, its simulated time is rounded to
//! 0.1 h, and its UNKNOWN times are only its p50, p99 and max, which the
//! merge keeps as upper bounds (shown as "≤").

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::check::Gate;
use crate::report::{StartFigures, Summary};
use crate::workload::TENANTS;

/// The one format this code writes and reads.
const FORMAT: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    pub format: u32,
    /// Seeds `first_seed .. first_seed + interleavings`.
    pub first_seed: u64,
    pub interleavings: u64,
    /// Rounds per interleaving (`--steps`), zombies on, plant: the run's
    /// configuration. Only chunks that agree on it are merged.
    pub steps: usize,
    pub zombies: bool,
    pub plant: Option<String>,
    /// Where the chunk came from: the simulator's version and the commit
    /// its binary was built at, as the caller says (`--source`).
    pub source: String,
    /// [`Summary::runs_digest`]; `None` for a chunk read from a table.
    pub runs_digest: Option<String>,
    pub rounds: u64,
    pub simulated_ms: u64,
    /// Gate name → interleavings in which it fired (every gate, zeros too).
    pub gates: BTreeMap<String, u64>,
    pub failures: Vec<(u64, String)>,
    /// `[simulated ms, calls]`, ascending.
    pub unknown_resolved: Vec<(u64, u64)>,
    /// From a table: (samples, p50, p99, max) in ms.
    pub unknown_bounds: Option<(u64, u64, u64, u64)>,
    pub admitted: Vec<u64>,
    pub demand: Vec<u64>,
    /// The client gateway's start scheduler (absent from chunks run before
    /// the simulator ran it: zeros).
    #[serde(default)]
    pub starts: StartFigures,
    pub coverage: BTreeMap<String, u64>,
    pub wall_s: f64,
}

impl Chunk {
    /// The chunk of a run of seeds `first_seed ..` summarised by `s`.
    pub fn new(s: &Summary, first_seed: u64, config: &crate::RunConfig, source: String) -> Chunk {
        Chunk {
            format: FORMAT,
            first_seed,
            interleavings: s.interleavings,
            steps: config.steps,
            zombies: config.zombies,
            plant: config.plant.map(|p| p.name().to_string()),
            source,
            runs_digest: Some(s.runs_digest()),
            rounds: s.steps,
            simulated_ms: s.simulated_ms,
            gates: Gate::ALL
                .iter()
                .map(|g| (g.name().to_string(), s.gates.get(g).copied().unwrap_or(0)))
                .collect(),
            failures: s.failures.clone(),
            unknown_resolved: s.unknown_resolved.iter().map(|(&ms, &n)| (ms, n)).collect(),
            unknown_bounds: None,
            admitted: s.admitted.to_vec(),
            demand: s.demand.to_vec(),
            starts: s.starts.clone(),
            coverage: s.coverage.clone(),
            wall_s: s.wall.as_secs_f64(),
        }
    }

    /// The seeds this chunk ran, as a half-open range.
    pub fn seeds(&self) -> std::ops::Range<u64> {
        self.first_seed..self.first_seed + self.interleavings
    }

    /// The chunk as a summary, to merge with others.
    pub fn summary(&self) -> Result<Summary, String> {
        if self.format != FORMAT {
            return Err(format!(
                "chunk of seeds {:?} has format {}, this simulator reads {FORMAT}",
                self.seeds(),
                self.format
            ));
        }
        let tenants = |v: &[u64], what: &str| -> Result<[u64; TENANTS.len()], String> {
            v.try_into()
                .map_err(|_| format!("{what}: {} tenants, not {}", v.len(), TENANTS.len()))
        };
        let mut gates = BTreeMap::new();
        for (name, &n) in &self.gates {
            let gate = Gate::from_name(name).ok_or_else(|| format!("unknown gate {name:?}"))?;
            // A summary counts only the gates that fired.
            if n > 0 {
                gates.insert(gate, n);
            }
        }
        let (bounded, bounds) = match self.unknown_bounds {
            Some((samples, p50, p99, max)) => (samples, [p50, p99, max]),
            None => (0, [0; 3]),
        };
        Ok(Summary {
            interleavings: self.interleavings,
            steps: self.rounds,
            simulated_ms: self.simulated_ms,
            gates,
            unknown_resolved: self.unknown_resolved.iter().copied().collect(),
            unknown_bounds: bounds,
            unknown_bounded_samples: bounded,
            admitted: tenants(&self.admitted, "admitted")?,
            demand: tenants(&self.demand, "demand")?,
            starts: self.starts.clone(),
            coverage: self.coverage.clone(),
            failures: self.failures.clone(),
            trace_hashes: BTreeMap::new(),
            wall: Duration::from_secs_f64(self.wall_s),
        })
    }

    /// Reads back what `reservoir-sim --interleavings N --seed S --steps M`
    /// printed: its first line and the gate table ([`Summary::table`]).
    pub fn from_table(text: &str, source: String) -> Result<Chunk, String> {
        let command = text
            .lines()
            .find(|l| l.starts_with("reservoir-sim --interleavings "))
            .ok_or("no `reservoir-sim --interleavings` line")?;
        let flag = |name: &str| -> Result<u64, String> {
            let mut words = command.split_whitespace();
            words
                .find(|w| *w == name)
                .and_then(|_| words.next())
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("no {name} in {command:?}"))
        };
        if command.contains("--plant") {
            return Err("a table of a planted run is not a chunk of the gate".into());
        }
        // Rows of every table: (first cell, the other cells).
        let mut section = "";
        let mut rows: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        for line in text.lines().map(str::trim) {
            let Some(inner) = line.strip_prefix('|').and_then(|l| l.strip_suffix('|')) else {
                continue;
            };
            let cells: Vec<&str> = inner.split('|').map(str::trim).collect();
            if cells[0].starts_with("---") {
                continue;
            }
            if matches!(
                cells[0],
                "gate" | "figure" | "tenant" | "scheduled tenant" | "exercised"
            ) {
                section = cells[0];
                continue;
            }
            rows.push((section, cells[0], cells[1..].to_vec()));
        }
        let number = |s: &str| -> Result<u64, String> {
            s.trim_end_matches(" ms")
                .parse()
                .map_err(|_| format!("not a number: {s:?}"))
        };
        let figure = |name: &str| -> Result<&str, String> {
            rows.iter()
                .find(|(sec, first, _)| *sec == "figure" && *first == name)
                .map(|(_, _, rest)| rest[0])
                .ok_or_else(|| format!("no figure {name:?}"))
        };
        let mut gates = BTreeMap::new();
        let mut coverage = BTreeMap::new();
        let (mut admitted, mut demand) = (vec![0; TENANTS.len()], vec![0; TENANTS.len()]);
        for (sec, first, rest) in &rows {
            match *sec {
                "gate" => {
                    Gate::from_name(first).ok_or_else(|| format!("unknown gate {first:?}"))?;
                    gates.insert(first.to_string(), number(rest[0])?);
                }
                "exercised" => {
                    coverage.insert(first.to_string(), number(rest[0])?);
                }
                "tenant" => {
                    let i = TENANTS
                        .iter()
                        .position(|t| t.name == *first)
                        .ok_or_else(|| format!("unknown tenant {first:?}"))?;
                    demand[i] = number(rest[1])?;
                    admitted[i] = number(rest[2])?;
                }
                _ => {}
            }
        }
        if gates.len() != Gate::ALL.len() {
            return Err(format!("{} gates, not {}", gates.len(), Gate::ALL.len()));
        }
        let hours: f64 = figure("simulated time")?
            .trim_end_matches(" h")
            .parse()
            .map_err(|_| "simulated time is not a number of hours")?;
        let wall_s: f64 = figure("wall time")?
            .trim_end_matches(" s")
            .parse()
            .map_err(|_| "wall time is not a number of seconds")?;
        let chunk = Chunk {
            format: FORMAT,
            first_seed: flag("--seed")?,
            interleavings: number(figure("interleavings")?)?,
            steps: flag("--steps")? as usize,
            zombies: !command.contains("--no-zombies"),
            plant: None,
            source,
            runs_digest: None,
            rounds: number(figure("steps (rounds)")?)?,
            simulated_ms: (hours * 3_600_000.0).round() as u64,
            gates,
            failures: Vec::new(),
            unknown_resolved: Vec::new(),
            unknown_bounds: Some((
                number(figure("UNKNOWN resolved (samples)")?)?,
                number(figure("UNKNOWN → resolved p50")?)?,
                number(figure("UNKNOWN → resolved p99")?)?,
                number(figure("UNKNOWN → resolved max")?)?,
            )),
            admitted,
            demand,
            starts: StartFigures::default(),
            coverage,
            wall_s,
        };
        if chunk.interleavings != flag("--interleavings")? {
            return Err("the table counts other interleavings than its command ran".into());
        }
        Ok(chunk)
    }
}

/// Chunks merged: one summary, the seed ranges they cover (contiguous
/// ranges joined), and each chunk's source and digest for the report.
pub struct Merged {
    pub summary: Summary,
    pub ranges: Vec<std::ops::Range<u64>>,
    pub chunks: Vec<Chunk>,
}

/// Merges chunks of one configuration; overlapping seeds are refused (a
/// seed counted twice would inflate the gate's interleavings).
pub fn merge(mut chunks: Vec<Chunk>) -> Result<Merged, String> {
    chunks.sort_by_key(|c| c.first_seed);
    let first = chunks.first().ok_or("no chunks to merge")?;
    let config = (first.steps, first.zombies, first.plant.clone());
    let mut summary = Summary::default();
    let mut ranges: Vec<std::ops::Range<u64>> = Vec::new();
    for c in &chunks {
        if (c.steps, c.zombies, c.plant.clone()) != config {
            return Err(format!(
                "chunk of seeds {:?} ran another configuration (steps {}, zombies {}, plant {:?}) than the first ({config:?})",
                c.seeds(), c.steps, c.zombies, c.plant
            ));
        }
        match ranges.last_mut() {
            Some(last) if c.first_seed < last.end => {
                return Err(format!("seeds {:?} and {last:?} overlap", c.seeds()));
            }
            Some(last) if c.first_seed == last.end => last.end = c.seeds().end,
            _ => ranges.push(c.seeds()),
        }
        summary.merge(c.summary()?);
    }
    Ok(Merged {
        summary,
        ranges,
        chunks,
    })
}
