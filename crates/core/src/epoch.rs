//! Accounting epochs that roll by themselves: a policy names its epoch length,
//! and this module turns a writer-assigned time into the epoch holding it (its
//! name, as the partition key's `accountingEpoch`, and its UTC bounds). Pure
//! calendar arithmetic on milliseconds since the Unix epoch; no clock here.

use serde::{Deserialize, Serialize};

use crate::types::TimestampMs;

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

/// How long one accounting epoch lasts. `None` (the default, and every policy
/// written before this field): the epoch is whatever the publish named, and
/// never rolls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpochLength {
    #[default]
    None,
    Hourly,
    Daily,
    Monthly,
}

/// One epoch: `[start_ms, end_ms)` in UTC, named e.g. `2026-11-03T14`
/// (hourly), `2026-11-03` (daily), `2026-11` (monthly).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    pub name: String,
    pub start_ms: TimestampMs,
    pub end_ms: TimestampMs,
}

impl EpochLength {
    pub const ALL: [EpochLength; 4] = [
        EpochLength::None,
        EpochLength::Hourly,
        EpochLength::Daily,
        EpochLength::Monthly,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EpochLength::None => "none",
            EpochLength::Hourly => "hourly",
            EpochLength::Daily => "daily",
            EpochLength::Monthly => "monthly",
        }
    }

    pub fn from_name(name: &str) -> Option<EpochLength> {
        EpochLength::ALL.into_iter().find(|l| l.name() == name)
    }

    pub fn is_none(&self) -> bool {
        *self == EpochLength::None
    }

    /// The epoch holding `at_ms`, or `None` for an epoch that never rolls.
    pub fn epoch_of(self, at_ms: TimestampMs) -> Option<Epoch> {
        let day = at_ms / DAY_MS;
        let (y, m, d) = civil_from_days(day);
        Some(match self {
            EpochLength::None => return None,
            EpochLength::Hourly => {
                let hour = (at_ms % DAY_MS) / HOUR_MS;
                let start_ms = day * DAY_MS + hour * HOUR_MS;
                Epoch {
                    name: format!("{y:04}-{m:02}-{d:02}T{hour:02}"),
                    start_ms,
                    end_ms: start_ms + HOUR_MS,
                }
            }
            EpochLength::Daily => Epoch {
                name: format!("{y:04}-{m:02}-{d:02}"),
                start_ms: day * DAY_MS,
                end_ms: (day + 1) * DAY_MS,
            },
            EpochLength::Monthly => {
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                Epoch {
                    name: format!("{y:04}-{m:02}"),
                    start_ms: days_from_civil(y, m, 1) * DAY_MS,
                    end_ms: days_from_civil(ny, nm, 1) * DAY_MS,
                }
            }
        })
    }
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01
/// (H. Hinnant's `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a civil date (inverse of [`civil_from_days`]).
fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-30T23:59:59.999Z and the instant after it.
    const LAST_MS: u64 = 1_796_083_199_999;

    #[test]
    fn epochs_table() {
        // (length, at) -> (name, start, end)
        let rows: [(EpochLength, u64, &str, u64, u64); 7] = [
            (
                EpochLength::Hourly,
                LAST_MS,
                "2026-11-30T23",
                LAST_MS + 1 - HOUR_MS,
                LAST_MS + 1,
            ),
            (
                EpochLength::Hourly,
                LAST_MS + 1,
                "2026-12-01T00",
                LAST_MS + 1,
                LAST_MS + 1 + HOUR_MS,
            ),
            (
                EpochLength::Daily,
                LAST_MS,
                "2026-11-30",
                LAST_MS + 1 - DAY_MS,
                LAST_MS + 1,
            ),
            (
                EpochLength::Monthly,
                LAST_MS,
                "2026-11",
                LAST_MS + 1 - 30 * DAY_MS,
                LAST_MS + 1,
            ),
            (
                EpochLength::Monthly,
                LAST_MS + 1,
                "2026-12",
                LAST_MS + 1,
                LAST_MS + 1 + 31 * DAY_MS,
            ),
            // A leap February: 2028-02 has 29 days.
            (
                EpochLength::Monthly,
                1_832_976_000_000,
                "2028-02",
                1_832_976_000_000,
                1_832_976_000_000 + 29 * DAY_MS,
            ),
            (EpochLength::Daily, 0, "1970-01-01", 0, DAY_MS),
        ];
        for (length, at, name, start_ms, end_ms) in rows {
            let e = length.epoch_of(at).unwrap();
            assert_eq!(
                (e.name.as_str(), e.start_ms, e.end_ms),
                (name, start_ms, end_ms),
                "{length:?} at {at}"
            );
        }
        assert_eq!(EpochLength::None.epoch_of(LAST_MS), None);
    }

    #[test]
    fn civil_dates_round_trip_for_four_centuries() {
        for day in (0..146_097 * 2).step_by(7) {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }

    #[test]
    fn names_round_trip() {
        for l in EpochLength::ALL {
            assert_eq!(EpochLength::from_name(l.name()), Some(l));
        }
        assert_eq!(EpochLength::from_name("weekly"), None);
    }
}
