//! `verify`: re-derive every partition from the log and compare it with a live
//! projection database.
//!
//! The projection says how far it has consumed each log partition (its
//! `cursors` column family); replay stops at exactly those offsets, so a
//! projector that is merely behind is not a difference. Then, per ledger
//! partition, every field of the stored balance (each conservation term, debt,
//! open reservations, refusals, last sequence, …) is compared with the derived
//! one, and (unless `--balances-only`) every reservation record as well. Each
//! mismatch is a [`Difference`]: (partition, term, expected from the log, found
//! in the projection).

use std::path::Path;

use reservoir_projections::model::Cursor;
use reservoir_projections::store;
use serde::Serialize;
use serde_json::Value;

use crate::state::{column, open_projections, Entry};
use crate::Stop;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Difference {
    /// Store key of the partition (or reservation, or log partition cursor).
    pub partition: String,
    pub term: String,
    pub expected: String,
    pub found: String,
}

/// Where the projection stands: the end offset (exclusive) it consumed per log
/// partition, and differences if it claims more than the log holds.
pub fn projection_ends(
    db: &rocksdb::DB,
    log_ends: &[u64],
) -> Result<(Vec<u64>, Vec<Difference>), Stop> {
    let mut cursors = vec![0u64; log_ends.len()];
    let mut differences = Vec::new();
    for (key, value) in column(db, store::CURSORS)? {
        let cursor: Cursor = serde_json::from_slice(&value)
            .map_err(|e| Stop::Error(format!("projection cursor {key}: {e}")))?;
        let lp: usize = key
            .parse()
            .map_err(|e| Stop::Error(format!("projection cursor key {key}: {e}")))?;
        match cursors.get_mut(lp) {
            Some(slot) => *slot = cursor.next_offset,
            None => differences.push(Difference {
                partition: format!("log partition {lp}"),
                term: "cursor".into(),
                expected: "no such log partition".into(),
                found: cursor.next_offset.to_string(),
            }),
        }
    }
    for (lp, (cursor, end)) in cursors.iter_mut().zip(log_ends).enumerate() {
        if *cursor > *end {
            differences.push(Difference {
                partition: format!("log partition {lp}"),
                term: "cursor (next offset)".into(),
                expected: format!("at most {end} (the log's end)"),
                found: cursor.to_string(),
            });
            *cursor = *end;
        }
    }
    Ok((cursors, differences))
}

/// Opens the projection and reads where it stands.
pub fn open(dir: &Path) -> Result<(rocksdb::DB, tempfile::TempDir), Stop> {
    if !dir.join("CURRENT").exists() {
        return Err(Stop::Error(format!(
            "{} is not a projection database",
            dir.display()
        )));
    }
    open_projections(dir)
}

/// Compares two key-ordered lists of (key, JSON bytes): differing values field by
/// field, keys on one side only as present/absent.
pub fn compare(what: &str, expected: &[Entry], found: &[Entry], differences: &mut Vec<Difference>) {
    let (mut i, mut j) = (0, 0);
    while i < expected.len() || j < found.len() {
        let order = match (expected.get(i), found.get(j)) {
            (Some(e), Some(f)) => e.0.as_bytes().cmp(f.0.as_bytes()),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, _) => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                differences.push(Difference {
                    partition: expected[i].0.clone(),
                    term: what.to_string(),
                    expected: "present".into(),
                    found: "absent".into(),
                });
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                differences.push(Difference {
                    partition: found[j].0.clone(),
                    term: what.to_string(),
                    expected: "absent".into(),
                    found: "present".into(),
                });
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                if expected[i].1 != found[j].1 {
                    field_differences(&expected[i].0, &expected[i].1, &found[j].1, differences);
                }
                i += 1;
                j += 1;
            }
        }
    }
}

/// The differing leaves of two JSON values, named by their path.
fn field_differences(key: &str, expected: &[u8], found: &[u8], out: &mut Vec<Difference>) {
    let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null);
    let (e, f) = (parse(expected), parse(found));
    let before = out.len();
    walk(key, "", &e, &f, out);
    if out.len() == before {
        // Same values, different bytes (field order, spacing): still a difference.
        out.push(Difference {
            partition: key.to_string(),
            term: "(encoding)".into(),
            expected: String::from_utf8_lossy(expected).into_owned(),
            found: String::from_utf8_lossy(found).into_owned(),
        });
    }
}

fn walk(key: &str, path: &str, e: &Value, f: &Value, out: &mut Vec<Difference>) {
    match (e, f) {
        (Value::Object(a), Value::Object(b)) => {
            let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
            names.sort();
            names.dedup();
            for name in names {
                let sub = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                walk(
                    key,
                    &sub,
                    a.get(name).unwrap_or(&Value::Null),
                    b.get(name).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if e != f => out.push(Difference {
            partition: key.to_string(),
            term: path.to_string(),
            expected: e.to_string(),
            found: f.to_string(),
        }),
        _ => {}
    }
}
