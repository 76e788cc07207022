//! Rate-limit headers on every reservation answer and every limit refusal, per
//! dimension of the caller's own partition (no other tenant's numbers ever):
//!
//! - the IETF fields of draft-ietf-httpapi-ratelimit-headers:
//!   `RateLimit-Policy: "requests";q=60;w=60, "input_tokens";q=100000;w=60`
//!   (`q` = the bucket's size, `w` = seconds refill takes to fill it from
//!   empty) and `RateLimit: "requests";r=59;t=1, …` (`r` = remaining, `t` =
//!   seconds until the bucket is full again with no other traffic);
//! - the widely used `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and
//!   `x-ratelimit-reset-*` (a duration such as `1s`, `6m0s` or `250ms`), with
//!   `requests`, `tokens`, `input-tokens` and `output-tokens` as the suffix, so
//!   a gateway can pass them through to its own clients unchanged.
//!
//! *Remaining* is what the subject could reserve in that dimension now: the
//! available units, or 0 while the dimension owes debt (admission is frozen).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use reservoir_core::{Dimension, Partition, Units};

/// One dimension's numbers at the time of the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimensionRate {
    pub dimension: Dimension,
    /// The bucket's size (`burst_units`).
    pub limit: Units,
    pub remaining: Units,
    /// Until the bucket is full again, with no other traffic (`None`: never,
    /// a policy that does not refill).
    pub reset_ms: Option<u64>,
    /// Refill time from empty to full.
    pub window_ms: Option<u64>,
}

/// Every dimension of a partition, primary first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimits(pub Vec<DimensionRate>);

impl RateLimits {
    /// The partition's numbers, or `None` before it is open.
    pub fn of(p: &Partition) -> Option<RateLimits> {
        let policy = p.policy.as_ref()?;
        let rates = policy
            .limits()
            .zip(p.ledgers())
            .enumerate()
            .map(|(i, (limit, ledger))| {
                let debt = ledger.debt_units().unwrap_or(0);
                let remainder = p.refill_remainder_of(i);
                let room = limit
                    .burst_units
                    .saturating_sub(ledger.available_units.saturating_add(ledger.reserved_units));
                DimensionRate {
                    dimension: limit.dimension,
                    limit: limit.burst_units,
                    remaining: if debt > 0 { 0 } else { ledger.available_units },
                    reset_ms: limit
                        .refill
                        .time_to_credit(debt.saturating_add(room), remainder),
                    window_ms: limit.refill.time_to_credit(limit.burst_units, 0),
                }
            })
            .collect();
        Some(RateLimits(rates))
    }

    /// The dimensions' names, primary first.
    pub fn dimensions(&self) -> impl Iterator<Item = Dimension> + '_ {
        self.0.iter().map(|r| r.dimension)
    }

    /// Writes every header (see the module doc). On every reservation
    /// answer, so built without a format string per value (`itoa`, in
    /// [`duration`] too) or a header name parsed at run time (constants):
    /// with them it cost 9,500 instructions per answer, 5 % of the
    /// server's, and 5,700 with the format strings alone (callgrind;
    /// bench-results/request-cost.md).
    pub fn write_headers(&self, headers: &mut HeaderMap) {
        let secs = |ms: Option<u64>| ms.map_or(u64::MAX, |ms| ms.div_ceil(1000));
        headers.reserve(2 + 3 * self.0.len());
        let mut policy = String::with_capacity(40 * self.0.len());
        let mut current = String::with_capacity(40 * self.0.len());
        let mut digits = itoa::Buffer::new();
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                policy.push_str(", ");
                current.push_str(", ");
            }
            let name = r.dimension.name();
            for (out, first, a, second, b) in [
                (&mut policy, "\";q=", r.limit, ";w=", secs(r.window_ms)),
                (&mut current, "\";r=", r.remaining, ";t=", secs(r.reset_ms)),
            ] {
                out.push('"');
                out.push_str(name);
                out.push_str(first);
                out.push_str(digits.format(a));
                out.push_str(second);
                out.push_str(digits.format(b));
            }
        }
        insert(headers, RATELIMIT_POLICY, policy);
        insert(headers, RATELIMIT, current);
        for r in &self.0 {
            let [limit, remaining, reset] = provider_names(r.dimension);
            headers.insert(limit, HeaderValue::from(r.limit));
            headers.insert(remaining, HeaderValue::from(r.remaining));
            if let Some(ms) = r.reset_ms {
                insert(headers, reset, duration(ms));
            }
        }
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// A dimension's `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and
/// `x-ratelimit-reset-*` names (constants: validated when compiled, not on
/// every answer).
fn provider_names(dimension: Dimension) -> [HeaderName; 3] {
    macro_rules! names {
        ($suffix:literal) => {{
            const NAMES: [HeaderName; 3] = [
                HeaderName::from_static(concat!("x-ratelimit-limit-", $suffix)),
                HeaderName::from_static(concat!("x-ratelimit-remaining-", $suffix)),
                HeaderName::from_static(concat!("x-ratelimit-reset-", $suffix)),
            ];
            NAMES
        }};
    }
    match dimension {
        Dimension::Requests => names!("requests"),
        Dimension::InputTokens => names!("input-tokens"),
        Dimension::OutputTokens => names!("output-tokens"),
        Dimension::Tokens => names!("tokens"),
    }
}

fn insert(headers: &mut HeaderMap, name: HeaderName, value: String) {
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(name, value);
    }
}

/// A duration as the providers write it: `250ms`, `1s`, `6m0s`, `2h0m0s`
/// (rounded up to the millisecond below a second, to the second above).
pub fn duration(ms: u64) -> String {
    let mut out = String::with_capacity(12);
    let mut digits = itoa::Buffer::new();
    if ms < 1000 {
        out.push_str(digits.format(ms));
        out.push_str("ms");
        return out;
    }
    let s = ms.div_ceil(1000);
    let (h, m, s) = (s / 3600, s % 3600 / 60, s % 60);
    // Hours only when there are some; minutes once there are hours or minutes.
    for (n, unit, shown) in [(h, "h", h > 0), (m, "m", h > 0 || m > 0), (s, "s", true)] {
        if shown {
            out.push_str(digits.format(n));
            out.push_str(unit);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_are_the_dimension_names_with_dashes() {
        for d in Dimension::ALL {
            let suffix = d.name().replace('_', "-");
            let names = provider_names(d).map(|n| n.as_str().to_string());
            assert_eq!(
                names,
                ["limit", "remaining", "reset"].map(|k| format!("x-ratelimit-{k}-{suffix}"))
            );
        }
    }

    #[test]
    fn every_header_of_two_dimensions() {
        let limits = RateLimits(vec![
            DimensionRate {
                dimension: Dimension::Requests,
                limit: 60,
                remaining: 59,
                reset_ms: Some(1_000),
                window_ms: Some(60_000),
            },
            DimensionRate {
                dimension: Dimension::InputTokens,
                limit: 100_000,
                remaining: 0,
                reset_ms: None,
                window_ms: None,
            },
        ]);
        let mut headers = HeaderMap::new();
        limits.write_headers(&mut headers);
        let mut written: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        written.sort();
        let never = u64::MAX;
        let expected = [
            (
                "ratelimit",
                format!("\"requests\";r=59;t=1, \"input_tokens\";r=0;t={never}"),
            ),
            (
                "ratelimit-policy",
                format!("\"requests\";q=60;w=60, \"input_tokens\";q=100000;w={never}"),
            ),
            ("x-ratelimit-limit-input-tokens", "100000".into()),
            ("x-ratelimit-limit-requests", "60".into()),
            ("x-ratelimit-remaining-input-tokens", "0".into()),
            ("x-ratelimit-remaining-requests", "59".into()),
            ("x-ratelimit-reset-requests", "1s".into()),
        ]
        .map(|(k, v)| (k.to_string(), v));
        assert_eq!(written, expected);
    }

    #[test]
    fn durations_as_the_providers_write_them() {
        for (ms, text) in [
            (0, "0ms"),
            (250, "250ms"),
            (1_000, "1s"),
            (1_001, "2s"),
            (59_000, "59s"),
            (360_000, "6m0s"),
            (7_261_000, "2h1m1s"),
            (3_600_000, "1h0m0s"),
            (120_000, "2m0s"),
        ] {
            assert_eq!(duration(ms), text);
        }
    }
}
