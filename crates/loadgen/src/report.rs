//! Turns the JSON lines of several runs into one Markdown summary: a table of
//! throughput and latency per run, and the ratios of Reservoir against the two
//! Redis baselines (durable `appendfsync always`, and no persistence).
//!
//! The same for native-client runs ([`native_markdown`]): each system driven by
//! its own load tool (`wrk` for Reservoir, `redis-benchmark` for Redis), whose
//! measurement windows `scripts/bench-http` writes as [`NativeWindow`] lines.

use crate::stats::Summary;
use serde::{Deserialize, Serialize};

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

fn json_lines<T: serde::de::DeserializeOwned>(text: &str) -> Result<Vec<T>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| format!("bad result line {l:?}: {e}")))
        .collect()
}

/// Parses JSON lines (blank lines and lines not starting with `{` are skipped).
pub fn parse_lines(text: &str) -> Result<Vec<Summary>, String> {
    json_lines(text)
}

/// Parses native-client window lines, like [`parse_lines`].
pub fn parse_native(text: &str) -> Result<Vec<NativeWindow>, String> {
    json_lines(text)
}

fn cpu(pct: Option<f64>) -> String {
    pct.map_or("n/a".to_string(), |p| format!("{p:.0}"))
}

fn us(v: Option<f64>) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.1}"))
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The median of `values`, with their count (`None` when empty).
fn median(mut values: Vec<f64>) -> Option<(f64, usize)> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    Some((median, n))
}

/// How a ratio's two sides were taken, when either had several runs.
fn medians_of(na: usize, nb: usize) -> String {
    if na > 1 || nb > 1 {
        format!(", medians of {na} and {nb} runs")
    } else {
        String::new()
    }
}

/// The median throughput of the runs labelled `label`, with their count.
fn median_rate(runs: &[Summary], label: &str) -> Option<(f64, usize)> {
    median(
        runs.iter()
            .filter(|r| r.label == label)
            .map(|r| r.cycles_per_s)
            .collect(),
    )
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
    if runs.is_empty() {
        s.push_str("No shared-client runs.\n");
        return s;
    }
    s.push_str("| run | cycles/s | cycle p50 ms | cycle p99 ms | reserve p50/p99 ms | start p50/p99 ms | settle p50/p99 ms | cycles | errors | CPU % client / server | server CPU µs/request |\n");
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in runs {
        s.push_str(&format!(
            "| {} | {:.0} | {} | {} | {} / {} | {} / {} | {} / {} | {} | {}{} | {} / {} | {} |\n",
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
            us(r.server_cpu_us_per_request()),
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
                let of = medians_of(na, nb);
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

/// One measured window of a native-client run, one JSON line each as
/// `scripts/bench-http` writes it. A `wrk` run is one window of whole cycles
/// (`step` = `cycle`); a `redis-benchmark` run is three windows, one per
/// script (`reserve`, `start`, `settle`), each script measured on its own.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NativeWindow {
    /// Target, e.g. `reservoir-wrk` or `redis-always-native`.
    pub label: String,
    /// Round of the benchmark; the windows of one run share label and round.
    pub round: u32,
    /// The load tool, e.g. `wrk` or `redis-benchmark`.
    pub client: String,
    /// `cycle` (requests are the steps of reserve → start → settle cycles) or
    /// the one script measured (`reserve`, `start`, `settle`).
    pub step: String,
    /// Connections of the load tool.
    pub clients: usize,
    /// Length of the measured window, seconds.
    pub seconds: f64,
    /// Requests (calls) answered in the window.
    pub requests: u64,
    /// Completed cycles in a `cycle` window (without it, requests / 3).
    #[serde(default)]
    pub cycles: Option<u64>,
    /// Failed requests: non-2xx answers, socket errors, error replies.
    pub errors: u64,
    /// Calls of a one-script window that took the script's full path (a fresh
    /// lease held, a held lease started, a live lease settled); the others
    /// found their lease already in the next state and returned early.
    #[serde(default)]
    pub full_path: Option<u64>,
    /// CPU seconds (user + system) of the server process in the window.
    #[serde(default)]
    pub server_cpu_s: Option<f64>,
    /// CPU seconds of the load tool in the window.
    #[serde(default)]
    pub client_cpu_s: Option<f64>,
    /// Processes the server forked in the window (Redis: AOF rewrites).
    #[serde(default)]
    pub forks: Option<u64>,
}

impl NativeWindow {
    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn server_cpu_us_per_request(&self) -> Option<f64> {
        self.server_cpu_s
            .filter(|_| self.requests > 0)
            .map(|c| c * 1e6 / self.requests as f64)
    }

    fn full_path_share(&self) -> Option<f64> {
        self.full_path
            .filter(|_| self.requests > 0)
            .map(|f| f as f64 / self.requests as f64)
    }
}

/// The steps of a cycle, as the windows of a `redis-benchmark` run name them.
const STEPS: [&str; 3] = ["reserve", "start", "settle"];

/// One native-client run: its windows combined.
#[derive(Clone, Debug, PartialEq)]
pub struct NativeRun<'a> {
    /// Target.
    pub label: &'a str,
    /// Round.
    pub round: u32,
    /// Load tool.
    pub client: &'a str,
    /// Connections of the load tool.
    pub clients: usize,
    /// A cycle run: requests / seconds. Per-script windows: 3 × `cycles_per_s`.
    pub requests_per_s: f64,
    /// A cycle run: cycles / seconds. Per-script windows: the harmonic
    /// combination 1 / (1/reserve + 1/start + 1/settle) of their calls/s.
    pub cycles_per_s: f64,
    /// A cycle run: server CPU ÷ requests. Per-script windows: the mean of
    /// the three scripts' server CPU per call.
    pub server_cpu_us_per_request: Option<f64>,
    /// Server CPU over all windows, % of one core.
    pub server_cpu_pct: Option<f64>,
    /// Load tool CPU over all windows, % of one core.
    pub client_cpu_pct: Option<f64>,
    /// Failed requests over all windows.
    pub errors: u64,
    /// False when a per-script run lacks one of the three scripts.
    pub complete: bool,
    /// The windows, in file order.
    pub windows: Vec<&'a NativeWindow>,
}

impl NativeRun<'_> {
    /// No errors, every window present and something answered.
    pub fn ok(&self) -> bool {
        self.errors == 0 && self.complete && self.cycles_per_s > 0.0
    }
}

fn pct_of(windows: &[&NativeWindow], cpu: impl Fn(&NativeWindow) -> Option<f64>) -> Option<f64> {
    let secs: f64 = windows.iter().map(|w| w.seconds).sum();
    let total: Option<f64> = windows.iter().map(|w| cpu(w)).sum();
    total.filter(|_| secs > 0.0).map(|c| c / secs * 100.0)
}

/// Groups the windows into runs (by label and round, in order of appearance)
/// and combines each run's windows.
pub fn native_runs(windows: &[NativeWindow]) -> Vec<NativeRun<'_>> {
    let mut groups: Vec<Vec<&NativeWindow>> = Vec::new();
    for w in windows {
        match groups
            .iter_mut()
            .find(|g| g[0].label == w.label && g[0].round == w.round)
        {
            Some(g) => g.push(w),
            None => groups.push(vec![w]),
        }
    }
    groups
        .into_iter()
        .map(|ws| {
            let first = ws[0];
            let (requests_per_s, cycles_per_s, cpu_us, complete) =
                match ws.iter().find(|w| w.step == "cycle") {
                    Some(w) => {
                        let cycles = w.cycles.map_or(w.requests as f64 / 3.0, |c| c as f64);
                        let per_s = if w.seconds > 0.0 {
                            cycles / w.seconds
                        } else {
                            0.0
                        };
                        (w.rate(), per_s, w.server_cpu_us_per_request(), true)
                    }
                    None => {
                        let steps: Vec<Option<&&NativeWindow>> = STEPS
                            .iter()
                            .map(|s| ws.iter().find(|w| w.step == *s && w.rate() > 0.0))
                            .collect();
                        let complete = steps.iter().all(Option::is_some);
                        let cycle_s: f64 = steps.iter().flatten().map(|w| 1.0 / w.rate()).sum();
                        let cycles_per_s = if complete { 1.0 / cycle_s } else { 0.0 };
                        let cpu: Option<f64> = steps
                            .iter()
                            .map(|w| w.and_then(|w| w.server_cpu_us_per_request()))
                            .sum();
                        (
                            3.0 * cycles_per_s,
                            cycles_per_s,
                            cpu.map(|c| c / 3.0),
                            complete,
                        )
                    }
                };
            NativeRun {
                label: &first.label,
                round: first.round,
                client: &first.client,
                clients: first.clients,
                requests_per_s,
                cycles_per_s,
                server_cpu_us_per_request: cpu_us,
                server_cpu_pct: pct_of(&ws, |w| w.server_cpu_s),
                client_cpu_pct: pct_of(&ws, |w| w.client_cpu_s),
                errors: ws.iter().map(|w| w.errors).sum(),
                complete,
                windows: ws,
            }
        })
        .collect()
}

fn thousands(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// The per-script column of a native run: calls/s, server µs/call and the
/// share of full-path calls of each one-script window.
fn per_script(r: &NativeRun<'_>) -> String {
    let parts: Vec<String> = r
        .windows
        .iter()
        .filter(|w| w.step != "cycle")
        .map(|w| {
            let full = w
                .full_path_share()
                .map_or(String::new(), |f| format!(", {:.0}% full path", f * 100.0));
            format!(
                "{} {}/s, {} µs{full}",
                w.step,
                thousands(w.rate()),
                us(w.server_cpu_us_per_request())
            )
        })
        .collect();
    if parts.is_empty() {
        "whole cycles".to_string()
    } else {
        parts.join("; ")
    }
}

/// The median cycles/s and server CPU µs/request of the native runs labelled
/// `label`, with their count.
fn native_medians(runs: &[NativeRun<'_>], label: &str) -> Option<(f64, Option<f64>, usize)> {
    let mine: Vec<&NativeRun<'_>> = runs.iter().filter(|r| r.label == label).collect();
    let (rate, n) = median(mine.iter().map(|r| r.cycles_per_s).collect())?;
    let cpu = median(
        mine.iter()
            .filter_map(|r| r.server_cpu_us_per_request)
            .collect(),
    )
    .map(|(c, _)| c);
    Some((rate, cpu, n))
}

/// Below this share of full-path calls a script's rate is flagged as optimistic.
const FULL_PATH_FLAG: f64 = 0.9;

/// The Markdown table of native-client runs, then the ratios of Reservoir
/// (`<reservoir>-wrk`) against both Redis baselines (`<redis_always>-native`,
/// `<redis_none>-native`), and against `<baseline>-wrk` when present.
pub fn native_markdown(windows: &[NativeWindow], labels: &Labels<'_>) -> String {
    let runs = native_runs(windows);
    let mut s = String::new();
    s.push_str("Native clients, each system driven by its own load tool: `wrk` runs the cycle against Reservoir\n");
    s.push_str("(`scripts/bench/wrk-cycle.lua`: every connection loops reserve → start → settle with fresh ids), and\n");
    s.push_str("`redis-benchmark` runs one script at a time (`EVALSHA` reserve with fresh ids, then start, then settle\n");
    s.push_str("against pre-created leases). A Redis row's cycles/s is therefore the **harmonic combination**\n");
    s.push_str("1 / (1/reserve + 1/start + 1/settle) of the three scripts' separately measured calls/s (what the\n");
    s.push_str("server could do if it only ran whole cycles), and its requests/s is 3 × that. Server CPU per request:\n");
    s.push_str("the server's CPU seconds in the measured window ÷ the requests answered in it (for Redis, the mean\n");
    s.push_str("of the three scripts' µs per call).\n\n");
    s.push_str("| run | client | connections | requests/s | cycles/s | server CPU µs/request | CPU % client / server | errors | per script: calls/s, server CPU µs/call |\n");
    s.push_str("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    for r in &runs {
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {} | {} / {} | {}{} | {} |\n",
            r.label,
            r.client,
            r.clients,
            r.requests_per_s,
            r.cycles_per_s,
            us(r.server_cpu_us_per_request),
            cpu(r.client_cpu_pct),
            cpu(r.server_cpu_pct),
            r.errors,
            if r.ok() { "" } else { " **FLAGGED**" },
            per_script(r),
        ));
    }
    s.push('\n');
    let name = |l: &str, suffix: &str| format!("{l}-{suffix}");
    let res_label = name(labels.reservoir, "wrk");
    let res = native_medians(&runs, &res_label);
    let mut others = vec![
        (
            "redis appendfsync always",
            name(labels.redis_always, "native"),
        ),
        (
            "redis without persistence",
            name(labels.redis_none, "native"),
        ),
    ];
    if let Some(b) = labels.baseline {
        let b = name(b, "wrk");
        if runs.iter().any(|r| r.label == b) {
            others.push(("the same server built from another revision", b));
        }
    }
    for (what, label) in &others {
        match (res, native_medians(&runs, label)) {
            (Some((a, a_cpu, na)), Some((b, b_cpu, nb))) if b > 0.0 => {
                let of = medians_of(na, nb);
                s.push_str(&format!(
                    "- native clients, {res_label} ÷ {label} ({what}): **{:.2}×** cycles/s ({a:.0} vs {b:.0}{of}); server CPU {} vs {} µs/request\n",
                    a / b,
                    us(a_cpu),
                    us(b_cpu),
                ))
            }
            _ => s.push_str(&format!(
                "- native clients, {res_label} ÷ {label} ({what}): n/a (run missing)\n"
            )),
        }
    }
    if let (Some((a, _, _)), Some((b, _, _))) = (res, native_medians(&runs, &others[0].1)) {
        // Both sides clean and complete: a Redis run with a missing window has
        // no cycles/s (0), which any throughput would beat.
        let clean = runs
            .iter()
            .filter(|r| r.label == res_label || r.label == others[0].1)
            .all(|r| r.ok());
        s.push_str(&format!(
            "- bar (native clients: {res_label} ≥ {}, no errors): **{}**\n",
            others[0].1,
            if clean && b > 0.0 && a >= b {
                "met"
            } else {
                "not met"
            }
        ));
    }
    for r in &runs {
        let at = format!("`{}` (round {})", r.label, r.round);
        if !r.complete {
            s.push_str(&format!(
                "- {at}: a script's window is missing, no cycles/s\n"
            ));
        }
        for w in &r.windows {
            if let Some(f) = w.full_path_share().filter(|f| *f < FULL_PATH_FLAG) {
                s.push_str(&format!(
                    "- {at} {}: only {:.0}% of the calls took the full path (the others found their lease in the next state already and returned early), so its rate is optimistic\n",
                    w.step,
                    f * 100.0
                ));
            }
        }
        let forks: u64 = r.windows.iter().filter_map(|w| w.forks).sum();
        if forks > 0 {
            s.push_str(&format!(
                "- {at}: the server forked {forks} time(s) in the measured windows (AOF rewrite), the child competing for the cores\n"
            ));
        }
    }
    let flagged: Vec<String> = runs
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} (round {})", r.label, r.round))
        .collect();
    if !flagged.is_empty() {
        s.push_str(&format!(
            "- native runs with errors (numbers not comparable): {}\n",
            flagged.join(", ")
        ));
    }
    s
}
