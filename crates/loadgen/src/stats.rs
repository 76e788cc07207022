//! Latency histograms, error counts and the result of one run, printed as a
//! table for people and as one JSON line for scripts.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The three steps of a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `POST /v1/reservations` or `reserve.lua`.
    Reserve,
    /// `POST /v1/reservations/{id}/start` or `start.lua`.
    Start,
    /// `POST /v1/reservations/{id}/settle` or `settle.lua`.
    Settle,
}

impl Step {
    /// Lower-case name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Step::Reserve => "reserve",
            Step::Start => "start",
            Step::Settle => "settle",
        }
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 120 s at 3 significant digits.
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("static bounds are valid")
}

/// What one client (or all clients, merged) measured.
#[derive(Clone)]
pub struct Recorder {
    /// Whole-cycle latency, µs.
    pub cycle: Histogram<u64>,
    /// Per-step latency, µs, in [`Step`] order.
    pub steps: [Histogram<u64>; 3],
    /// Completed cycles inside the measured window.
    pub cycles: u64,
    /// Completed cycles during warm-up (not in the histograms).
    pub warmup_cycles: u64,
    /// Errors by `step: kind`, over the whole run.
    pub errors: BTreeMap<String, u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            cycle: histogram(),
            steps: [histogram(), histogram(), histogram()],
            cycles: 0,
            warmup_cycles: 0,
            errors: BTreeMap::new(),
        }
    }
}

/// CPU seconds (user + system) used so far by process `pid` (`None`: this
/// process), from `/proc/PID/stat`; `None` where that cannot be read.
pub fn process_cpu_secs(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name start at field 3 (state);
    // utime and stime are fields 14 and 15, in clock ticks (100 per second on Linux).
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn micros(d: Duration) -> u64 {
    d.as_micros().clamp(1, u64::MAX as u128) as u64
}

impl Recorder {
    /// Records one step's latency.
    pub fn step(&mut self, step: Step, d: Duration) {
        self.steps[step as usize].saturating_record(micros(d));
    }

    /// Records one whole cycle.
    pub fn cycle(&mut self, d: Duration) {
        self.cycle.saturating_record(micros(d));
        self.cycles += 1;
    }

    /// Counts one error.
    pub fn error(&mut self, step: Step, kind: &str) {
        *self
            .errors
            .entry(format!("{}: {kind}", step.name()))
            .or_default() += 1;
    }

    /// Total errors.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Adds another recorder's data into this one.
    pub fn merge(&mut self, other: &Recorder) {
        self.cycle.add(&other.cycle).expect("same bounds");
        for (a, b) in self.steps.iter_mut().zip(&other.steps) {
            a.add(b).expect("same bounds");
        }
        self.cycles += other.cycles;
        self.warmup_cycles += other.warmup_cycles;
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
    }
}

/// Percentiles of one latency distribution, in microseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest sample.
    pub max_us: u64,
    /// Mean.
    pub mean_us: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            p50_us: h.value_at_quantile(0.50),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            mean_us: (h.mean() * 10.0).round() / 10.0,
        }
    }
}

/// The result of one run: exactly what the JSON line carries.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Free-form name of the run, e.g. `redis-always`.
    pub label: String,
    /// `reservoir` or `redis`.
    pub target: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Subjects (tenants) the clients are spread over.
    pub subjects: usize,
    /// Dimensions of the policy (1, or 3: requests, input and output tokens).
    #[serde(default = "one")]
    pub dimensions: usize,
    /// Units reserved per cycle (three dimensions: input + output tokens).
    pub units: u64,
    /// Units settled per cycle (three dimensions: input + output tokens).
    pub actual_units: u64,
    /// Warm-up excluded from the numbers, seconds.
    pub warmup_s: f64,
    /// Measured wall time, seconds.
    pub measured_s: f64,
    /// Completed cycles in the measured window.
    pub cycles: u64,
    /// `cycles / measured_s`.
    pub cycles_per_s: f64,
    /// Whole-cycle latency.
    pub cycle: Latency,
    /// Reserve step latency.
    pub reserve: Latency,
    /// Start step latency.
    pub start: Latency,
    /// Settle step latency.
    pub settle: Latency,
    /// TCP connections opened (equals `clients` when keep-alive held).
    pub connections: u64,
    /// Total errors (non-2xx, refused or failed calls).
    pub errors: u64,
    /// Errors by `step: kind`.
    pub error_detail: BTreeMap<String, u64>,
    /// True when the run had no errors.
    pub ok: bool,
    /// CPU the load generator used in the measured window, % of one core.
    #[serde(default)]
    pub client_cpu_pct: Option<f64>,
    /// CPU the server process (`--server-pid`) used in the measured window, % of one core.
    #[serde(default)]
    pub server_cpu_pct: Option<f64>,
}

fn one() -> usize {
    1
}

/// What [`Summary::new`] needs besides the merged recorder.
pub struct RunShape<'a> {
    /// See [`Summary::label`].
    pub label: &'a str,
    /// See [`Summary::target`].
    pub target: &'a str,
    /// See [`Summary::clients`].
    pub clients: usize,
    /// See [`Summary::subjects`].
    pub subjects: usize,
    /// See [`Summary::dimensions`].
    pub dimensions: usize,
    /// See [`Summary::units`].
    pub units: u64,
    /// See [`Summary::actual_units`].
    pub actual_units: u64,
    /// See [`Summary::warmup_s`].
    pub warmup: Duration,
    /// See [`Summary::measured_s`].
    pub measured: Duration,
    /// See [`Summary::connections`].
    pub connections: u64,
    /// CPU seconds of the load generator in the measured window.
    pub client_cpu_s: Option<f64>,
    /// CPU seconds of the server in the measured window.
    pub server_cpu_s: Option<f64>,
}

impl Summary {
    /// Builds the summary of a finished run.
    pub fn new(shape: RunShape<'_>, rec: &Recorder) -> Summary {
        let measured_s = shape.measured.as_secs_f64();
        let errors = rec.error_count();
        let round = |x: f64, k: f64| (x * k).round() / k;
        let pct = |cpu: Option<f64>| {
            cpu.filter(|_| measured_s > 0.0)
                .map(|c| round(c / measured_s * 100.0, 10.0))
        };
        Summary {
            label: shape.label.to_string(),
            target: shape.target.to_string(),
            clients: shape.clients,
            subjects: shape.subjects,
            dimensions: shape.dimensions,
            units: shape.units,
            actual_units: shape.actual_units,
            warmup_s: round(shape.warmup.as_secs_f64(), 1000.0),
            measured_s: round(measured_s, 1000.0),
            cycles: rec.cycles,
            cycles_per_s: if measured_s > 0.0 {
                round(rec.cycles as f64 / measured_s, 10.0)
            } else {
                0.0
            },
            cycle: Latency::of(&rec.cycle),
            reserve: Latency::of(&rec.steps[0]),
            start: Latency::of(&rec.steps[1]),
            settle: Latency::of(&rec.steps[2]),
            connections: shape.connections,
            errors,
            error_detail: rec.errors.clone(),
            ok: errors == 0 && rec.cycles > 0,
            client_cpu_pct: pct(shape.client_cpu_s),
            server_cpu_pct: pct(shape.server_cpu_s),
        }
    }

    /// Server CPU per request in the measured window, µs: the server's CPU
    /// seconds over three requests per completed cycle.
    pub fn server_cpu_us_per_request(&self) -> Option<f64> {
        let requests = 3 * self.cycles;
        self.server_cpu_pct
            .filter(|_| requests > 0)
            .map(|pct| pct / 100.0 * self.measured_s * 1e6 / requests as f64)
    }

    /// The one-line JSON form.
    pub fn json_line(&self) -> String {
        serde_json::to_string(self).expect("a Summary always serialises")
    }

    /// A small table for people.
    pub fn table(&self) -> String {
        let ms = |us: u64| us as f64 / 1000.0;
        let mut s = String::new();
        s.push_str(&format!(
            "{} ({}, {} dimension(s)): {} clients over {} subjects, {} cycles in {:.2} s (after {:.1} s warm-up)\n",
            self.label,
            self.target,
            self.dimensions,
            self.clients,
            self.subjects,
            self.cycles,
            self.measured_s,
            self.warmup_s
        ));
        s.push_str(&format!(
            "  throughput  {:>10.1} cycles/s\n",
            self.cycles_per_s
        ));
        s.push_str("  latency ms      p50      p99    p99.9      max\n");
        for (name, l) in [
            ("cycle", &self.cycle),
            ("reserve", &self.reserve),
            ("start", &self.start),
            ("settle", &self.settle),
        ] {
            s.push_str(&format!(
                "  {:<10} {:>8.3} {:>8.3} {:>8.3} {:>8.3}\n",
                name,
                ms(l.p50_us),
                ms(l.p99_us),
                ms(l.p999_us),
                ms(l.max_us)
            ));
        }
        s.push_str(&format!("  connections {}\n", self.connections));
        let show = |c: Option<f64>| c.map_or("n/a".to_string(), |c| format!("{c:.0}%"));
        s.push_str(&format!(
            "  cpu         client {}, server {} (of one core, measured window)\n",
            show(self.client_cpu_pct),
            show(self.server_cpu_pct)
        ));
        if self.errors == 0 {
            s.push_str("  errors      0\n");
        } else {
            s.push_str(&format!("  ERRORS      {} (run flagged)\n", self.errors));
            for (k, v) in &self.error_detail {
                s.push_str(&format!("    {k}: {v}\n"));
            }
        }
        s
    }
}
