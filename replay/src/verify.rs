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

use reservoir_core::{PartitionKey, Reservation};
use reservoir_projections::model::{PartitionBalance, PartitionProjection};

use crate::engine::Engine;
use crate::state::{column, open_projections, projection_of, Entry};
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

/// Before when the projection's retention rule deleted every finished record.
pub fn pruned_before_ms(db: &rocksdb::DB) -> Result<Option<u64>, Stop> {
    let Some(cf) = db.cf_handle(store::RETENTION) else {
        return Ok(None);
    };
    match db
        .get_cf(cf, store::PRUNED_BEFORE)
        .map_err(|e| Stop::Error(e.to_string()))?
    {
        None => Ok(None),
        Some(v) => serde_json::from_slice(&v)
            .map(Some)
            .map_err(|e| Stop::Error(format!("{}: {e}", store::PRUNED_BEFORE))),
    }
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

/// [`compare`] against one column family of `db`, read straight from a
/// RocksDB iterator (no copy of the column is kept: each stored value is
/// compared with the expected bytes where it lies).
pub fn compare_column(
    what: &str,
    expected: &[Entry],
    db: &rocksdb::DB,
    cf: &str,
    differences: &mut Vec<Difference>,
) -> Result<(), Stop> {
    let Some(handle) = db.cf_handle(cf) else {
        compare(what, expected, &[], differences);
        return Ok(());
    };
    let mut options = rocksdb::ReadOptions::default();
    options.fill_cache(false);
    options.set_readahead_size(4 << 20);
    let mut iter = db.raw_iterator_cf_opt(handle, options);
    iter.seek_to_first();
    let mut i = 0;
    loop {
        let found = match (iter.key(), iter.value()) {
            (Some(k), Some(v)) if iter.valid() => Some((k, v)),
            _ => None,
        };
        let order = match (expected.get(i), found) {
            (None, None) => break,
            (Some(e), Some((k, _))) => e.0.as_bytes().cmp(k),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
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
                let (k, _) = found.expect("a found entry");
                differences.push(Difference {
                    partition: String::from_utf8_lossy(k).into_owned(),
                    term: what.to_string(),
                    expected: "absent".into(),
                    found: "present".into(),
                });
                iter.next();
            }
            std::cmp::Ordering::Equal => {
                let (_, v) = found.expect("a found entry");
                if expected[i].1 != v {
                    field_differences(&expected[i].0, &expected[i].1, v, differences);
                }
                i += 1;
                iter.next();
            }
        }
    }
    iter.status().map_err(|e| Stop::Error(e.to_string()))?;
    Ok(())
}

/// Closes nothing: removes the secondary instance's directory and leaves the
/// database's memory to the process exit (a tool about to exit).
pub fn leak_db(db: rocksdb::DB, secondary: tempfile::TempDir) {
    std::mem::forget(db);
    drop(secondary);
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

/// Replayed partitions in the order of their store keys, each with its
/// projector view and store key (`subject|route|epoch|generation`).
/// Partitions the projection would not store (no balance) are left out, as
/// [`crate::state::entries_of`] leaves them out.
pub struct Expected {
    pub parts: Vec<(String, PartitionKey, PartitionProjection)>,
    pub balances: Vec<Entry>,
}

impl Expected {
    /// Takes the partitions out of `engine`; balances are encoded (a handful
    /// per partition), reservation records are not: [`compare_reservations`]
    /// encodes each one where it compares it.
    pub fn of(engine: &mut Engine<'_>) -> Self {
        let mut parts = Vec::new();
        let mut balances = Vec::new();
        for (key, s) in std::mem::take(&mut engine.partitions) {
            let proj = projection_of(&key, s);
            let Some(balance) = PartitionBalance::of(&proj) else {
                continue;
            };
            let store_key = store::partition_key(&key);
            balances.push((
                store_key.clone(),
                serde_json::to_vec(&balance).expect("read models serialize to JSON"),
            ));
            parts.push((store_key, key, proj));
        }
        parts.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        balances.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        Self { parts, balances }
    }

    /// Leaves out the records the projection's retention rule deleted:
    /// finished before `before_ms` (see `ProjectorConfig::retention`).
    pub fn without_pruned(&mut self, before_ms: u64) {
        for (_, _, proj) in &mut self.parts {
            proj.partition.reservations.retain(|_, r| {
                !(r.state.is_terminal() && r.finished_at_ms.is_some_and(|at| at < before_ms))
            });
        }
    }

    pub fn reservations(&self) -> usize {
        self.parts
            .iter()
            .map(|p| p.2.partition.reservations.len())
            .sum()
    }
}

/// Writes the JSON of `ReservationRecord { key, reservation }` into `out`,
/// given the key's JSON: the bytes `serde_json` writes for that struct (two
/// fields, no attributes; a test pins the equality), without cloning the key
/// and reservation into one per record.
fn record_json(key_json: &[u8], reservation: &Reservation, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(b"{\"key\":");
    out.extend_from_slice(key_json);
    out.extend_from_slice(b",\"reservation\":");
    serde_json::to_writer(&mut *out, reservation).expect("read models serialize to JSON");
    out.push(b'}');
}

/// Compares every expected reservation record with the `reservations` column
/// family, encoding each expected record into one reused buffer and comparing
/// it with the stored bytes in place (no list of either side is built). The
/// key range is split between threads (one per core), each with its own
/// iterator; differences come out in key order. Returns the records compared.
pub fn compare_reservations(
    expected: &Expected,
    db: &rocksdb::DB,
    differences: &mut Vec<Difference>,
) -> Result<usize, Stop> {
    let parts = &expected.parts;
    let total = expected.reservations();
    // Keys are `<partition key>|<id>`, ids in `BTreeMap` (byte) order, so
    // partition by partition in store-key order is key order — unless one
    // partition's `key|` is a prefix of another's. Then: sort everything.
    let nested = parts.windows(2).any(|w| {
        w[1].0.len() > w[0].0.len()
            && w[1].0.as_bytes().starts_with(w[0].0.as_bytes())
            && w[1].0.as_bytes()[w[0].0.len()] == b'|'
    });
    let Some(handle) = db.cf_handle(store::RESERVATIONS) else {
        let mut all = Vec::new();
        let mut buf = Vec::new();
        for (prefix, key, proj) in parts {
            let key_json = serde_json::to_vec(key).expect("keys serialize");
            for (id, r) in &proj.partition.reservations {
                record_json(&key_json, r, &mut buf);
                all.push((format!("{prefix}|{}", id.as_str()), buf.clone()));
            }
        }
        all.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        compare("reservation", &all, &[], differences);
        return Ok(total);
    };
    if nested {
        let mut all = Vec::with_capacity(total);
        let mut buf = Vec::new();
        for (prefix, key, proj) in parts {
            let key_json = serde_json::to_vec(key).expect("keys serialize");
            for (id, r) in &proj.partition.reservations {
                record_json(&key_json, r, &mut buf);
                all.push((format!("{prefix}|{}", id.as_str()), buf.clone()));
            }
        }
        all.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        compare_column("reservation", &all, db, store::RESERVATIONS, differences)?;
        return Ok(total);
    }
    // Split points: partition indices with about equal numbers of records.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut bounds = vec![0usize];
    let mut seen = 0usize;
    for (i, p) in parts.iter().enumerate() {
        if bounds.len() < threads && seen >= total * bounds.len() / threads && i > 0 {
            bounds.push(i);
        }
        seen += p.2.partition.reservations.len();
    }
    bounds.dedup();
    bounds.push(parts.len());
    let ranges: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
    let results: Vec<Result<Vec<Difference>, Stop>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranges
            .iter()
            .enumerate()
            .map(|(n, &(from, to))| {
                // The stored keys this thread owns: from its first partition's
                // `key|` (the very first key for the first thread) up to the
                // next thread's.
                let lower = (n > 0).then(|| format!("{}|", parts[from].0).into_bytes());
                let upper = parts.get(to).map(|p| format!("{}|", p.0).into_bytes());
                s.spawn(move || compare_range(&parts[from..to], db, handle, lower, upper))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("compare thread"))
            .collect()
    });
    for r in results {
        differences.extend(r?);
    }
    Ok(total)
}

fn compare_range(
    parts: &[(String, PartitionKey, PartitionProjection)],
    db: &rocksdb::DB,
    handle: &rocksdb::ColumnFamily,
    lower: Option<Vec<u8>>,
    upper: Option<Vec<u8>>,
) -> Result<Vec<Difference>, Stop> {
    let mut differences = Vec::new();
    let mut options = rocksdb::ReadOptions::default();
    options.fill_cache(false);
    options.set_readahead_size(4 << 20);
    if let Some(upper) = upper {
        options.set_iterate_upper_bound(upper);
    }
    let mut iter = db.raw_iterator_cf_opt(handle, options);
    match &lower {
        Some(lower) => iter.seek(lower),
        None => iter.seek_to_first(),
    }
    let mut expected = parts.iter().flat_map(|(prefix, key, proj)| {
        let key_json = std::rc::Rc::new(serde_json::to_vec(key).expect("keys serialize"));
        proj.partition
            .reservations
            .iter()
            .map(move |(id, r)| (prefix, key_json.clone(), id, r))
    });
    let mut next = expected.next();
    let (mut key, mut buf) = (Vec::new(), Vec::new());
    let set_key = |key: &mut Vec<u8>, prefix: &str, id: &str| {
        key.clear();
        key.extend_from_slice(prefix.as_bytes());
        key.push(b'|');
        key.extend_from_slice(id.as_bytes());
    };
    if let Some((prefix, _, id, _)) = &next {
        set_key(&mut key, prefix, id.as_str());
    }
    loop {
        let found = match (iter.key(), iter.value()) {
            (Some(k), Some(v)) if iter.valid() => Some((k, v)),
            _ => None,
        };
        let order = match (&next, found) {
            (None, None) => break,
            (Some(_), Some((k, _))) => key.as_slice().cmp(k),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Greater => {
                let (k, _) = found.expect("a found entry");
                differences.push(Difference {
                    partition: String::from_utf8_lossy(k).into_owned(),
                    term: "reservation".into(),
                    expected: "absent".into(),
                    found: "present".into(),
                });
                iter.next();
                continue;
            }
            std::cmp::Ordering::Less => differences.push(Difference {
                partition: String::from_utf8_lossy(&key).into_owned(),
                term: "reservation".into(),
                expected: "present".into(),
                found: "absent".into(),
            }),
            std::cmp::Ordering::Equal => {
                let (_, v) = found.expect("a found entry");
                let (_, key_json, _, r) = next.as_ref().expect("an expected entry");
                record_json(key_json, r, &mut buf);
                if buf != v {
                    field_differences(&String::from_utf8_lossy(&key), &buf, v, &mut differences);
                }
                iter.next();
            }
        }
        next = expected.next();
        if let Some((prefix, _, id, _)) = &next {
            set_key(&mut key, prefix, id.as_str());
        }
    }
    iter.status().map_err(|e| Stop::Error(e.to_string()))?;
    Ok(differences)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reservoir_projections::model::ReservationRecord;

    /// `record_json` writes exactly what serde_json writes for the struct.
    #[test]
    fn record_json_is_the_struct_encoding() {
        let key = PartitionKey::new("tenant-a", "chat.generate", "2026-07", 3).unwrap();
        let mut partition = reservoir_core::Partition::default();
        let mut policy = reservoir_core::Policy::example("tenant-a", "chat.generate", 3);
        policy.opening_units = 1_000;
        let events = [
            reservoir_core::EventBody::PartitionOpened {
                key: key.clone(),
                opening_units: 1_000,
                policy,
            },
            reservoir_core::EventBody::Reserved {
                id: reservoir_core::ReservationId::new("r-1").unwrap(),
                digest: reservoir_core::RequestDigest([7; 32]),
                reserved_units: 100,
                held_units: 100,
                expires_at_ms: 10_000,
                shadow: None,
                sizing: None,
                shadow_dimension: None,
            },
        ];
        for (i, body) in events.into_iter().enumerate() {
            let event = reservoir_core::Event {
                further: Vec::new(),
                sequence: i as u64 + 1,
                at_ms: 1_000 + i as u64,
                body,
            };
            reservoir_core::try_apply(&mut partition, &event).unwrap();
        }
        let (_, reservation) = partition.reservations.iter().next().unwrap();
        let record = ReservationRecord {
            key: key.clone(),
            reservation: reservation.clone(),
        };
        let mut buf = Vec::new();
        record_json(&serde_json::to_vec(&key).unwrap(), reservation, &mut buf);
        assert_eq!(buf, serde_json::to_vec(&record).unwrap());
    }
}
