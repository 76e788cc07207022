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

    /// Writes every header (see the module doc).
    pub fn write_headers(&self, headers: &mut HeaderMap) {
        let secs = |ms: Option<u64>| ms.map_or(u64::MAX, |ms| ms.div_ceil(1000));
        let policy: Vec<String> = self
            .0
            .iter()
            .map(|r| format!("\"{}\";q={};w={}", r.dimension, r.limit, secs(r.window_ms)))
            .collect();
        let current: Vec<String> = self
            .0
            .iter()
            .map(|r| {
                format!(
                    "\"{}\";r={};t={}",
                    r.dimension,
                    r.remaining,
                    secs(r.reset_ms)
                )
            })
            .collect();
        insert(headers, "ratelimit-policy", policy.join(", "));
        insert(headers, "ratelimit", current.join(", "));
        for r in &self.0 {
            let suffix = r.dimension.name().replace('_', "-");
            insert(
                headers,
                &format!("x-ratelimit-limit-{suffix}"),
                r.limit.to_string(),
            );
            insert(
                headers,
                &format!("x-ratelimit-remaining-{suffix}"),
                r.remaining.to_string(),
            );
            if let Some(ms) = r.reset_ms {
                insert(
                    headers,
                    &format!("x-ratelimit-reset-{suffix}"),
                    duration(ms),
                );
            }
        }
    }
}

fn insert(headers: &mut HeaderMap, name: &str, value: String) {
    if let (Ok(name), Ok(value)) = (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(&value),
    ) {
        headers.insert(name, value);
    }
}

/// A duration as the providers write it: `250ms`, `1s`, `6m0s`, `2h0m0s`
/// (rounded up to the millisecond below a second, to the second above).
pub fn duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms.div_ceil(1000);
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            assert_eq!(duration(ms), text);
        }
    }
}
