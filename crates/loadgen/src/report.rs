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
}

/// Parses JSON lines (blank lines and lines not starting with `{` are skipped).
pub fn parse_lines(text: &str) -> Result<Vec<Summary>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| format!("bad result line {l:?}: {e}")))
        .collect()
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The Markdown table and ratios. The last run of each label wins.
pub fn markdown(runs: &[Summary], labels: &Labels<'_>) -> String {
    let mut s = String::new();
    s.push_str("| run | cycles/s | cycle p50 ms | cycle p99 ms | reserve p50/p99 ms | start p50/p99 ms | settle p50/p99 ms | cycles | errors |\n");
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in runs {
        s.push_str(&format!(
            "| {} | {:.0} | {} | {} | {} / {} | {} / {} | {} / {} | {} | {}{} |\n",
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
        ));
    }
    let find = |label: &str| runs.iter().rev().find(|r| r.label == label);
    let res = find(labels.reservoir);
    s.push('\n');
    for (name, base) in [
        ("redis appendfsync always", find(labels.redis_always)),
        ("redis without persistence", find(labels.redis_none)),
    ] {
        match (res, base) {
            (Some(a), Some(b)) if b.cycles_per_s > 0.0 && b.cycle.p99_us > 0 => s.push_str(&format!(
                "- reservoir ÷ {name}: **{:.2}×** throughput ({:.0} vs {:.0} cycles/s); cycle p99 {} vs {} ms\n",
                a.cycles_per_s / b.cycles_per_s,
                a.cycles_per_s,
                b.cycles_per_s,
                ms(a.cycle.p99_us),
                ms(b.cycle.p99_us),
            )),
            _ => s.push_str(&format!("- reservoir ÷ {name}: n/a (run missing)\n")),
        }
    }
    if let (Some(a), Some(b)) = (res, find(labels.redis_always)) {
        let met = a.ok && a.cycles_per_s >= b.cycles_per_s;
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
