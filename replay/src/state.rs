//! `state`: balances and reservations as they stood at a point of the log, as
//! one deterministic JSON document.
//!
//! The document holds exactly the values the live projection stores in its
//! `balances` and `reservations` column families, under the same keys, in key
//! byte order, each value the same JSON bytes the projector writes
//! (`PartitionBalance` and `ReservationRecord` of `reservoir_projections`). So
//! `state --as-of <end>` and `state --from-projections DIR` of a projection that
//! consumed the whole log are byte-identical files:
//!
//! ```text
//! {"balances":{
//! "<subject>|<route>|<epoch>|<generation:020>":{...PartitionBalance...},
//! ...
//! },"reservations":{
//! "<partition key>|<reservation id>":{...ReservationRecord...},
//! ...
//! }}
//! ```

use std::io::Write;
use std::path::Path;

use reservoir_projections::model::{
    Finding as ProjectionFinding, PartitionBalance, PartitionProjection, ReservationRecord,
};
use reservoir_projections::store;
use rocksdb::{IteratorMode, Options, DB};

use crate::engine::{Engine, PartState};
use crate::Stop;

/// One key and its JSON value bytes.
pub type Entry = (String, Vec<u8>);

/// The projector's view of a replayed partition (what `PartitionBalance::of`
/// reads), holding every record (the retired ones too: the projection keeps
/// them all). A partition with findings is marked quarantined with its first one.
pub fn projection_of(key: &reservoir_core::PartitionKey, mut s: PartState) -> PartitionProjection {
    let retired = std::mem::take(&mut s.retired);
    s.partition.reservations.extend(retired);
    PartitionProjection {
        partition: s.partition,
        opened_at_ms: s.opened_at_ms,
        quarantine: s.first_finding.map(|f| ProjectionFinding {
            key: key.clone(),
            log_partition: f.log_partition,
            offset: f.offset,
            event_index: f.event_index.unwrap_or(0),
            sequence: f.sequence.unwrap_or(0),
            error: f.detail,
        }),
        skipped_events: s.skipped_events,
    }
}

/// Balances and reservations of every replayed partition, keyed and encoded as
/// the projection stores them, each list in key byte order.
pub fn entries_of(engine: &mut Engine<'_>) -> (Vec<Entry>, Vec<Entry>) {
    entries_with(engine, true)
}

/// [`entries_of`], leaving out the reservation records unless asked for.
/// Takes the partitions out of `engine` and deliberately leaks their state (a
/// tool that exits next should not spend seconds freeing millions of records).
/// Partitions are encoded on every core (each thread a share of them).
pub fn entries_with(engine: &mut Engine<'_>, with_reservations: bool) -> (Vec<Entry>, Vec<Entry>) {
    let partitions: Vec<_> = std::mem::take(&mut engine.partitions).into_iter().collect();
    let encode = |share: Vec<(reservoir_core::PartitionKey, PartState)>| {
        let mut balances = Vec::with_capacity(share.len());
        let mut reservations = Vec::new();
        for (key, s) in share {
            let proj = projection_of(&key, s);
            let Some(balance) = PartitionBalance::of(&proj) else {
                continue;
            };
            balances.push((store::partition_key(&key), json(&balance)));
            if with_reservations {
                let prefix = store::partition_key(&key);
                for (id, reservation) in &proj.partition.reservations {
                    let record = ReservationRecord {
                        key: key.clone(),
                        reservation: reservation.clone(),
                    };
                    // = store::reservation_key(&key, id), without re-formatting the key.
                    let mut k = String::with_capacity(prefix.len() + 1 + id.as_str().len());
                    k.push_str(&prefix);
                    k.push('|');
                    k.push_str(id.as_str());
                    reservations.push((k, json(&record)));
                }
            }
            // Freed at exit, not here: dropping millions of records costs seconds.
            std::mem::forget(proj);
        }
        (balances, reservations)
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut balances, mut reservations) = if threads < 2 || partitions.len() < 64 {
        encode(partitions)
    } else {
        // Shares of about equal work: deal partitions round-robin.
        let mut shares: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, p) in partitions.into_iter().enumerate() {
            shares[i % threads].push(p);
        }
        let parts: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = shares
                .into_iter()
                .map(|share| s.spawn(move || encode(share)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("encoder thread"))
                .collect()
        });
        let (mut balances, mut reservations) = (Vec::new(), Vec::new());
        for (b, r) in parts {
            balances.extend(b);
            reservations.extend(r);
        }
        (balances, reservations)
    };
    balances.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    reservations.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    (balances, reservations)
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("read models serialize to JSON")
}

/// Opens a projection database read-only, as a secondary instance (the
/// projector may be running), returning it and the directory it needs.
pub fn open_projections(dir: &Path) -> Result<(DB, tempfile::TempDir), Stop> {
    let secondary = tempfile::Builder::new()
        .prefix("reservoir-replay-projections")
        .tempdir()?;
    let names = DB::list_cf(&Options::default(), dir)
        .map_err(|e| Stop::Error(format!("{}: {e}", dir.display())))?;
    let mut options = Options::default();
    options.set_max_open_files(-1);
    let db = DB::open_cf_as_secondary(&options, dir, secondary.path(), names)
        .map_err(|e| Stop::Error(format!("{}: {e}", dir.display())))?;
    db.try_catch_up_with_primary()
        .map_err(|e| Stop::Error(e.to_string()))?;
    Ok((db, secondary))
}

/// Every key/value of one column family of a projection, in key order.
pub fn column(db: &DB, cf: &str) -> Result<Vec<Entry>, Stop> {
    let Some(handle) = db.cf_handle(cf) else {
        return Ok(Vec::new());
    };
    db.iterator_cf(handle, IteratorMode::Start)
        .map(|item| {
            let (k, v) = item.map_err(|e| Stop::Error(e.to_string()))?;
            Ok((String::from_utf8_lossy(&k).into_owned(), v.into_vec()))
        })
        .collect()
}

/// Writes the document (see the module docs).
pub fn write_document(
    out: &mut dyn Write,
    balances: &[Entry],
    reservations: &[Entry],
) -> std::io::Result<()> {
    out.write_all(b"{\"balances\":{\n")?;
    write_section(out, balances)?;
    out.write_all(b"},\"reservations\":{\n")?;
    write_section(out, reservations)?;
    out.write_all(b"}}\n")
}

fn write_section(out: &mut dyn Write, entries: &[Entry]) -> std::io::Result<()> {
    for (i, (key, value)) in entries.iter().enumerate() {
        serde_json::to_writer(&mut *out, key)?;
        out.write_all(b":")?;
        out.write_all(value)?;
        out.write_all(if i + 1 < entries.len() { b",\n" } else { b"\n" })?;
    }
    Ok(())
}

/// The document of a projection database (`state --from-projections`).
pub fn write_projection_document(out: &mut dyn Write, dir: &Path) -> Result<(), Stop> {
    let (db, _secondary) = open_projections(dir)?;
    let balances = column(&db, store::BALANCES)?;
    let reservations = column(&db, store::RESERVATIONS)?;
    write_document(out, &balances, &reservations)?;
    Ok(())
}
