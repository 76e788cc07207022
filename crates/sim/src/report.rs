//! Figures over many runs, and the gate table.
//!
//! - A gate's count is the number of interleavings in which it fired.
//! - UNKNOWN → resolved: simulated ms from the moment a call's answer was
//!   lost (an append in doubt, a crash mid-batch, a dropped reply, a 503) to
//!   the moment its gateway, retrying with the same id, learnt the outcome;
//!   kept to three significant figures, rounded up.
//! - Fairness: every limit of a tenant's policies is the base limit times
//!   the tenant's weight (1, 2, 3), and the gateways give every tenant the
//!   same demand (calls, each asking for one reservation). A tenant's *fair
//!   share* is its weighted max-min share of everything admitted: tenants
//!   are filled in order of demand over weight, each up to its demand or its
//!   weight's part of what is left, whichever is smaller (a tenant asking
//!   for less than its part gets what it asked for; the rest is shared by
//!   weight). Its *admitted share* is the reservations admitted to it over
//!   all admitted. The error is admitted minus fair, in percentage points.
//!   It measures whether limits scaled by weight admit in proportion to
//!   weight under contention; the ledger has no shared pool, so a tenant
//!   whose own bucket is empty is refused even when another's is not, and
//!   that shows as error too.
//! - Scheduled tenants: the client gateway's start scheduler (the client
//!   crate's `StartScheduler`): each tenant's starts, and the worst stretch
//!   in which it waited throughout beside another tenant, as a fraction of
//!   the fairness budget (`reservoir_client::FairnessGap`; above 1 is a
//!   finding of gate `scheduler_over_budget`). This is the fairness a
//!   scheduler owes: among requests the ledger already admitted, starts in
//!   proportion to weight while tenants compete.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::check::Gate;
use crate::run::RunOutcome;
use crate::workload::TENANTS;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub interleavings: u64,
    pub steps: u64,
    pub simulated_ms: u64,
    pub gates: BTreeMap<Gate, u64>,
    /// UNKNOWN → resolved times: simulated ms, to three significant
    /// figures rounded up (so a percentile read from it is never below the
    /// true one, and at most 1 % above), → how many calls took that long.
    /// A million interleavings make about 180 million samples; this keeps
    /// a few thousand numbers, in memory and in a chunk's file.
    pub unknown_resolved: BTreeMap<u64, u64>,
    /// Upper bounds of (p50, p99, max) from parts merged in without their
    /// times (tables of runs made before chunks were saved, `crate::chunk`);
    /// zero when every part brought its times.
    pub unknown_bounds: [u64; 3],
    /// Samples counted in `unknown_bounds` (not in `unknown_resolved`).
    pub unknown_bounded_samples: u64,
    pub admitted: [u64; TENANTS.len()],
    pub demand: [u64; TENANTS.len()],
    pub starts: StartFigures,
    pub coverage: BTreeMap<String, u64>,
    /// (seed, first finding) of the first failing runs.
    pub failures: Vec<(u64, String)>,
    /// Each run's trace hash, by seed: what [`Summary::runs_digest`] hashes.
    pub trace_hashes: BTreeMap<u64, String>,
    pub wall: Duration,
}

/// The client gateway's start scheduler, against its fairness budget
/// (`run`'s `client_gateway::fairness`), over a run or many.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartFigures {
    /// Starts it gave each tenant.
    pub starts: [u64; TENANTS.len()],
    /// Stretches judged: (reading, pair of tenants that both waited since
    /// an earlier reading).
    pub judged: u64,
    /// Per tenant: the largest gap of a stretch it waited in beside another
    /// tenant, in per-mille of the budget (rounded up; above 1,000: over).
    pub worst_per_mille: [u64; TENANTS.len()],
}

impl StartFigures {
    pub fn merge(&mut self, other: &StartFigures) {
        for (total, n) in self.starts.iter_mut().zip(other.starts) {
            *total += n;
        }
        self.judged += other.judged;
        for (worst, w) in self.worst_per_mille.iter_mut().zip(other.worst_per_mille) {
            *worst = (*worst).max(w);
        }
    }
}

/// Failing runs kept for the report.
const FAILURES_KEPT: usize = 10;

impl Summary {
    pub fn add(&mut self, o: &RunOutcome) {
        self.interleavings += 1;
        self.steps += o.rounds as u64;
        self.simulated_ms += o.simulated_ms;
        let mut fired: Vec<Gate> = o.findings.iter().map(|f| f.gate).collect();
        fired.sort();
        fired.dedup();
        for gate in fired {
            *self.gates.entry(gate).or_default() += 1;
        }
        if let (Some(f), true) = (o.findings.first(), self.failures.len() < FAILURES_KEPT) {
            self.failures
                .push((o.seed, format!("{}: {}", f.gate.name(), f.detail)));
        }
        for &ms in &o.unknown_resolved_ms {
            *self
                .unknown_resolved
                .entry(three_figures_up(ms))
                .or_default() += 1;
        }
        for (total, n) in self.admitted.iter_mut().zip(o.admitted) {
            *total += n;
        }
        for (total, n) in self.demand.iter_mut().zip(o.demand) {
            *total += n;
        }
        self.starts.merge(&o.starts);
        for (&what, &n) in &o.coverage {
            // A name is allocated once per summary, not once per run.
            match self.coverage.get_mut(what) {
                Some(total) => *total += n,
                None => {
                    self.coverage.insert(what.to_string(), n);
                }
            }
        }
        self.trace_hashes.insert(o.seed, o.trace_hash.clone());
    }

    pub fn findings(&self) -> u64 {
        self.gates.values().sum()
    }

    /// UNKNOWN → resolved samples, with and without their times.
    pub fn unknown_samples(&self) -> u64 {
        self.unknown_resolved.values().sum::<u64>() + self.unknown_bounded_samples
    }

    /// The `q`-th percentile (0..=100) of the UNKNOWN → resolved times.
    /// Where parts came without their times, the larger of this and their
    /// bound: the `q`-th percentile of a union is at most the largest of its
    /// parts' (at most `100 - q` % of each part lies above its own).
    pub fn unknown_percentile(&self, q: u64) -> Option<u64> {
        let bound = match q {
            50 => self.unknown_bounds[0],
            99 => self.unknown_bounds[1],
            100 => self.unknown_bounds[2],
            _ if self.unknown_bounded_samples == 0 => 0,
            _ => return None,
        };
        let n: u64 = self.unknown_resolved.values().sum();
        let exact = match n {
            0 => None,
            n => {
                let rank = (q * (n - 1)).div_ceil(100);
                let mut seen = 0;
                self.unknown_resolved.iter().find_map(|(&ms, &count)| {
                    seen += count;
                    (seen > rank).then_some(ms)
                })
            }
        };
        match (exact, self.unknown_bounded_samples) {
            (None, 0) => None,
            (exact, _) => Some(exact.unwrap_or(0).max(bound)),
        }
    }

    /// SHA-256 over every run's seed and trace hash, in seed order: one
    /// line that says two runs of these seeds behaved the same, run by run.
    pub fn runs_digest(&self) -> String {
        let mut digest = Sha256::new();
        for (seed, hash) in &self.trace_hashes {
            digest.update(format!("{seed} {hash}\n").as_bytes());
        }
        hex::encode(digest.finalize())
    }

    /// Adds `other` (a chunk of other seeds, `crate::chunk`) to this one.
    pub fn merge(&mut self, other: Summary) {
        self.interleavings += other.interleavings;
        self.steps += other.steps;
        self.simulated_ms += other.simulated_ms;
        for (gate, n) in other.gates {
            *self.gates.entry(gate).or_default() += n;
        }
        for (ms, n) in other.unknown_resolved {
            *self.unknown_resolved.entry(ms).or_default() += n;
        }
        for (mine, theirs) in self.unknown_bounds.iter_mut().zip(other.unknown_bounds) {
            *mine = (*mine).max(theirs);
        }
        self.unknown_bounded_samples += other.unknown_bounded_samples;
        for (total, n) in self.admitted.iter_mut().zip(other.admitted) {
            *total += n;
        }
        for (total, n) in self.demand.iter_mut().zip(other.demand) {
            *total += n;
        }
        self.starts.merge(&other.starts);
        for (what, n) in other.coverage {
            *self.coverage.entry(what).or_default() += n;
        }
        self.failures.extend(other.failures);
        self.failures.sort();
        self.failures.truncate(FAILURES_KEPT);
        self.trace_hashes.extend(other.trace_hashes);
        self.wall += other.wall;
    }

    /// Per tenant: (name, weight, demand, fair share %, admitted share %,
    /// error in points); see the module docs.
    pub fn fairness(&self) -> Vec<(&'static str, u64, u64, f64, f64, f64)> {
        let admitted: u64 = self.admitted.iter().sum();
        let fair = max_min_fair(admitted as f64, &self.demand);
        TENANTS
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let pct = |x: f64| match admitted {
                    0 => 0.0,
                    all => 100.0 * x / all as f64,
                };
                let (fair, share) = (pct(fair[i]), pct(self.admitted[i] as f64));
                (t.name, t.weight, self.demand[i], fair, share, share - fair)
            })
            .collect()
    }

    /// The gate table, in Markdown.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let secs = self.wall.as_secs_f64();
        let _ = writeln!(s, "| gate | count |");
        let _ = writeln!(s, "| --- | ---: |");
        for gate in Gate::ALL {
            let _ = writeln!(
                s,
                "| {} | {} |",
                gate.name(),
                self.gates.get(&gate).copied().unwrap_or(0)
            );
        }
        let _ = writeln!(s);
        // "≤": some part brought only its percentiles (see `unknown_percentile`).
        let at_most = if self.unknown_bounded_samples > 0 {
            "≤ "
        } else {
            ""
        };
        let ms = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{at_most}{v} ms"));
        let _ = writeln!(s, "| figure | value |");
        let _ = writeln!(s, "| --- | ---: |");
        let _ = writeln!(s, "| interleavings | {} |", self.interleavings);
        let _ = writeln!(s, "| steps (rounds) | {} |", self.steps);
        let _ = writeln!(
            s,
            "| simulated time | {:.1} h |",
            self.simulated_ms as f64 / 3_600_000.0
        );
        let _ = writeln!(
            s,
            "| UNKNOWN resolved (samples) | {} |",
            self.unknown_samples()
        );
        let _ = writeln!(
            s,
            "| UNKNOWN → resolved p50 | {} |",
            ms(self.unknown_percentile(50))
        );
        let _ = writeln!(
            s,
            "| UNKNOWN → resolved p99 | {} |",
            ms(self.unknown_percentile(99))
        );
        let _ = writeln!(
            s,
            "| UNKNOWN → resolved max | {} |",
            ms(self.unknown_percentile(100))
        );
        let _ = writeln!(s, "| wall time | {secs:.1} s |");
        let _ = writeln!(
            s,
            "| interleavings/s | {:.1} |",
            self.interleavings as f64 / secs.max(1e-9)
        );
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "| tenant | weight | calls | admitted | fair share | admitted share | error |"
        );
        let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        for (i, (name, weight, demand, fair, share, error)) in
            self.fairness().into_iter().enumerate()
        {
            let _ = writeln!(
                s,
                "| {name} | {weight} | {demand} | {} | {fair:.1} % | {share:.1} % | {error:+.1} pp |",
                self.admitted[i]
            );
        }
        let _ = writeln!(s);
        let all: u64 = self.starts.starts.iter().sum();
        let _ = writeln!(
            s,
            "| scheduled tenant | weight | starts | start share | worst stretch ({} judged) |",
            self.starts.judged
        );
        let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: |");
        for (i, t) in TENANTS.iter().enumerate() {
            let share = match all {
                0 => 0.0,
                all => 100.0 * self.starts.starts[i] as f64 / all as f64,
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {share:.1} % | {:.3} of the budget |",
                t.name,
                t.weight,
                self.starts.starts[i],
                self.starts.worst_per_mille[i] as f64 / 1000.0
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "| exercised | count |");
        let _ = writeln!(s, "| --- | ---: |");
        for (what, n) in &self.coverage {
            let _ = writeln!(s, "| {what} | {n} |");
        }
        s
    }
}

/// `ms` to three significant figures, rounded up: 320,188 → 321,000; below
/// 1,000 unchanged.
pub fn three_figures_up(ms: u64) -> u64 {
    let mut scale = 1;
    while ms / scale >= 1_000 {
        scale *= 10;
    }
    ms.div_ceil(scale) * scale
}

/// Weighted max-min fair split of `total` over the tenants, given their
/// demands: in order of demand over weight, each gets its demand or its
/// weight's part of what is left, whichever is smaller.
fn max_min_fair(total: f64, demand: &[u64; TENANTS.len()]) -> [f64; TENANTS.len()] {
    let mut order: Vec<usize> = (0..TENANTS.len()).collect();
    order.sort_by(|&a, &b| {
        let ratio = |i: usize| demand[i] as f64 / TENANTS[i].weight as f64;
        ratio(a).total_cmp(&ratio(b))
    });
    let mut fair = [0.0; TENANTS.len()];
    let mut left = total;
    let mut weights: u64 = TENANTS.iter().map(|t| t.weight).sum();
    for i in order {
        let part = left * TENANTS[i].weight as f64 / weights as f64;
        fair[i] = part.min(demand[i] as f64);
        left -= fair[i];
        weights -= TENANTS[i].weight;
    }
    fair
}
