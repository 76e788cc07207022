//! Figures over many runs, and the gate table.
//!
//! - A gate's count is the number of interleavings in which it fired.
//! - UNKNOWN → resolved: simulated ms from the moment a call's answer was
//!   lost (an append in doubt, a crash mid-batch, a dropped reply, a 503) to
//!   the moment its gateway, retrying with the same id, learnt the outcome.
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

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::check::Gate;
use crate::run::RunOutcome;
use crate::workload::TENANTS;

#[derive(Default)]
pub struct Summary {
    pub interleavings: u64,
    pub steps: u64,
    pub simulated_ms: u64,
    pub gates: BTreeMap<Gate, u64>,
    pub unknown_resolved_ms: Vec<u64>,
    pub admitted: [u64; TENANTS.len()],
    pub demand: [u64; TENANTS.len()],
    pub coverage: BTreeMap<&'static str, u64>,
    /// (seed, first finding) of the first failing runs.
    pub failures: Vec<(u64, String)>,
    pub wall: Duration,
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
        self.unknown_resolved_ms
            .extend_from_slice(&o.unknown_resolved_ms);
        for (total, n) in self.admitted.iter_mut().zip(o.admitted) {
            *total += n;
        }
        for (total, n) in self.demand.iter_mut().zip(o.demand) {
            *total += n;
        }
        for (what, n) in &o.coverage {
            *self.coverage.entry(what).or_default() += n;
        }
    }

    pub fn findings(&self) -> u64 {
        self.gates.values().sum()
    }

    /// The `q`-th percentile (0..=100) of the UNKNOWN → resolved times.
    pub fn unknown_percentile(&self, q: u64) -> Option<u64> {
        let mut v = self.unknown_resolved_ms.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let rank = (q as usize * (v.len() - 1)).div_ceil(100);
        v.get(rank).copied()
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
        let ms = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{v} ms"));
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
            self.unknown_resolved_ms.len()
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
        let _ = writeln!(s, "| exercised | count |");
        let _ = writeln!(s, "| --- | ---: |");
        for (what, n) in &self.coverage {
            let _ = writeln!(s, "| {what} | {n} |");
        }
        s
    }
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
