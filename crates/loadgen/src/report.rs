//! Turns the JSON lines of several runs into one Markdown summary: a table of
//! throughput and latency per run, and the ratios of Reservoir against the two
//! Redis baselines (durable `appendfsync always`, and no persistence).

use crate::stats::Summary;

/// Labels of the three runs the ratios compare.
pub struct Labels<'a> {
    /// Reservoir on the embedded log.
    pub reservoir: &'a str,
    /// Redis with `appendfsync always`.
    pub redis_always: &'a str,
    /// Redis without persistence.
    pub redis_none: &'a str,
    /// Reservoir built from another revision (`scripts/bench-http`'s target
    /// `baseline`): a before/after ratio when such runs are present.
    pub baseline: Option<&'a str>,
}

/// Parses JSON lines (blank lines and lines not starting with `{` are skipped).
pub fn parse_lines(text: &str) -> Result<Vec<Summary>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| format!("bad result line {l:?}: {e}")))
        .collect()
}

fn cpu(pct: Option<f64>) -> String {
    pct.map_or("n/a".to_string(), |p| format!("{p:.0}"))
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The median throughput of the runs labelled `label`, with their count.
fn median_rate(runs: &[Summary], label: &str) -> Option<(f64, usize)> {
    let mut rates: Vec<f64> = runs
        .iter()
        .filter(|r| r.label == label)
        .map(|r| r.cycles_per_s)
        .collect();
    if rates.is_empty() {
        return None;
    }
    rates.sort_by(f64::total_cmp);
    let n = rates.len();
    let median = if n % 2 == 1 {
        rates[n / 2]
    } else {
        (rates[n / 2 - 1] + rates[n / 2]) / 2.0
    };
    Some((median, n))
}

/// The median cycle p99 of the runs labelled `label`, in microseconds.
fn median_p99(runs: &[Summary], label: &str) -> u64 {
    let mut v: Vec<u64> = runs
        .iter()
        .filter(|r| r.label == label)
        .map(|r| r.cycle.p99_us)
        .collect();
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

/// The Markdown table of every run, then the ratios of Reservoir against both
/// Redis baselines. With several runs per label (rounds), ratios use medians.
pub fn markdown(runs: &[Summary], labels: &Labels<'_>) -> String {
    let mut s = String::new();
    s.push_str("| run | cycles/s | cycle p50 ms | cycle p99 ms | reserve p50/p99 ms | start p50/p99 ms | settle p50/p99 ms | cycles | errors | CPU % client / server |\n");
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in runs {
        s.push_str(&format!(
            "| {} | {:.0} | {} | {} | {} / {} | {} / {} | {} / {} | {} | {}{} | {} / {} |\n",
            r.label,
            r.cycles_per_s,
            ms(r.cycle.p50_us),
            ms(r.cycle.p99_us),
            ms(r.reserve.p50_us),
            ms(r.reserve.p99_us),
            ms(r.start.p50_us),
            ms(r.start.p99_us),
            ms(r.settle.p50_us),
            ms(r.settle.p99_us),
            r.cycles,
            r.errors,
            if r.ok { "" } else { " **FLAGGED**" },
            cpu(r.client_cpu_pct),
            cpu(r.server_cpu_pct),
        ));
    }
    s.push('\n');
    let res = median_rate(runs, labels.reservoir);
    for (name, label) in [
        ("redis appendfsync always", labels.redis_always),
        ("redis without persistence", labels.redis_none),
    ] {
        match (res, median_rate(runs, label)) {
            (Some((a, na)), Some((b, nb))) if b > 0.0 => {
                let of = if na > 1 || nb > 1 {
                    format!(", medians of {na} and {nb} runs")
                } else {
                    String::new()
                };
                s.push_str(&format!(
                    "- reservoir ÷ {name}: **{:.2}×** throughput ({a:.0} vs {b:.0} cycles/s{of}); cycle p99 {} vs {} ms\n",
                    a / b,
                    ms(median_p99(runs, labels.reservoir)),
                    ms(median_p99(runs, label)),
                ))
            }
            _ => s.push_str(&format!("- reservoir ÷ {name}: n/a (run missing)\n")),
        }
    }
    if let (Some((a, na)), Some((b, nb))) =
        (res, labels.baseline.and_then(|l| median_rate(runs, l)))
    {
        if b > 0.0 {
            s.push_str(&format!(
                "- reservoir ÷ baseline (the same server built from another revision): **{:.2}×** throughput ({a:.0} vs {b:.0} cycles/s, medians of {na} and {nb} runs); cycle p99 {} vs {} ms\n",
                a / b,
                ms(median_p99(runs, labels.reservoir)),
                ms(median_p99(runs, labels.baseline.unwrap_or_default())),
            ));
        }
    }
    if let (Some((a, _)), Some((b, _))) = (res, median_rate(runs, labels.redis_always)) {
        let clean = runs
            .iter()
            .filter(|r| r.label == labels.reservoir)
            .all(|r| r.ok);
        let met = clean && a >= b;
        s.push_str(&format!(
            "- bar (reservoir durable ≥ redis appendfsync always, no errors): **{}**\n",
            if met { "met" } else { "not met" }
        ));
    }
    let flagged: Vec<&str> = runs
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.label.as_str())
        .collect();
    if !flagged.is_empty() {
        s.push_str(&format!(
            "- runs with errors (numbers not comparable): {}\n",
            flagged.join(", ")
        ));
    }
    s
}
