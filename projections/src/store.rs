//! The projection database: one RocksDB (separate from the log) with one column
//! family per read model, key encodings, and [`dump`].
//!
//! Keys are ASCII with `|` separators (identifiers never contain `|`), numbers
//! zero-padded so byte order is numeric order.

use std::path::Path;
use std::sync::Arc;

use reservoir_core::PartitionKey;
use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DBIteratorWithThreadMode, IteratorMode, Options, DB,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::ReservationRecord;
use crate::ProjectionError;

/// Log position and fence state per log partition (key: log partition).
pub const CURSORS: &str = "cursors";
/// Serialized [`crate::model::PartitionProjection`] per ledger partition: what
/// the projector resumes from.
pub const PARTITIONS: &str = "partitions";
pub const BALANCES: &str = "balances";
pub const TENANT_BALANCES: &str = "tenant_balances";
pub const ROUTE_BALANCES: &str = "route_balances";
/// Key: partition key `|` reservation id.
pub const RESERVATIONS: &str = "reservations";
/// Secondary index of [`RESERVATIONS`] by id. Key: reservation id `|` partition
/// key; value: the [`PartitionKey`] (JSON). Written in the same batch as the
/// record's creation. A key per (id, partition) pair rather than one per id:
/// the write needs no read, and if two partitions ever hold one id the
/// answer (the first partition in key order) does not depend on how the log
/// was cut into steps.
pub const RESERVATION_IDS: &str = "reservation_ids";
/// Key: route `|` model `|` source log partition.
pub const DIGESTS: &str = "digests";
pub const EFFICIENCY_BY_ROUTE: &str = "efficiency_by_route";
pub const EFFICIENCY_BY_TENANT: &str = "efficiency_by_tenant";
pub const INPUT_DRIFT: &str = "input_drift";
/// Key: tenant `|` at_ms `|` partition key `|` sequence.
pub const REFUSALS: &str = "refusals";
/// Shadow verdicts, each under two keys: `route|<route>|<at_ms>|…` and
/// `tenant|<subject>|<at_ms>|…` ([`shadow_key`]).
pub const SHADOW: &str = "shadow";
/// Each half of every capacity move, until checked against the other. Key:
/// move id `|` `out` or `in`.
pub const MOVES: &str = "moves";
/// Key: log partition `|` offset `|` event index.
pub const FINDINGS: &str = "findings";
/// Finished reservations by the time they finished, for the retention rule
/// ([`crate::ProjectorConfig::retention`]). Key: `finished_at_ms` (20 digits)
/// `|` [`reservation_key`]; value empty.
pub const FINISHED: &str = "finished";
/// What the retention rule has pruned. Key [`PRUNED_BEFORE`]: every record of
/// a reservation that finished before this time (ms) is gone (JSON u64).
pub const RETENTION: &str = "retention";
pub const PRUNED_BEFORE: &str = "pruned_before_ms";

/// Every column family, in dump order.
pub const COLUMN_FAMILIES: [&str; 17] = [
    CURSORS,
    PARTITIONS,
    BALANCES,
    TENANT_BALANCES,
    ROUTE_BALANCES,
    RESERVATIONS,
    RESERVATION_IDS,
    DIGESTS,
    EFFICIENCY_BY_ROUTE,
    EFFICIENCY_BY_TENANT,
    INPUT_DRIFT,
    REFUSALS,
    SHADOW,
    MOVES,
    FINDINGS,
    FINISHED,
    RETENTION,
];

/// Model of samples whose settle named no model (or reported no output tokens
/// and sampled `actual_units`).
pub const DEFAULT_MODEL: &str = "default";

/// Memtable bytes of the whole projection database (every column family).
pub const MEMTABLE_BYTES_MAX: usize = 48 << 20;
/// Block cache shared by its column families (index and filter blocks included).
pub const BLOCK_CACHE_BYTES: usize = 32 << 20;

pub fn open(path: impl AsRef<Path>) -> Result<Arc<DB>, ProjectionError> {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    // Rarely written column families would otherwise pin every write-ahead log
    // file, and every open (a restart, a replay verify) would replay them all.
    options.set_max_total_wal_size(256 << 20);
    // The projector writes without the WAL by default: flushing every column
    // family together keeps what is on disk a consistent prefix of its steps.
    options.set_atomic_flush(true);
    // Memory does not follow what was projected: memtables are capped for the
    // whole database (past it, every column family flushes together, which
    // atomic flush wants anyway), and every column family reads through one
    // block cache.
    options.set_db_write_buffer_size(MEMTABLE_BYTES_MAX);
    let cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    let cfs = COLUMN_FAMILIES.map(|name| {
        let table = reservoir_log::rocks::table_options(&cache);
        let mut cf = Options::default();
        cf.set_write_buffer_size(16 << 20);
        cf.set_block_based_table_factory(&table);
        ColumnFamilyDescriptor::new(name, cf)
    });
    let db = DB::open_cf_descriptors(&options, path.as_ref(), cfs).map_err(store_error)?;
    backfill_reservation_ids(&db)?;
    Ok(Arc::new(db))
}

/// A database projected before [`RESERVATION_IDS`] existed has records and no
/// index: build it from the records, once, in one batch. Since then every
/// record is written with its index entry, so "records but no index entry at
/// all" means exactly that (or a backfill that did not reach the disk, which
/// this redoes: the batch is atomic and synced).
fn backfill_reservation_ids(db: &DB) -> Result<(), ProjectionError> {
    if is_empty(db, RESERVATIONS)? || !is_empty(db, RESERVATION_IDS)? {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let (records, index) = (handle(db, RESERVATIONS)?, handle(db, RESERVATION_IDS)?);
    let mut batch = rocksdb::WriteBatch::default();
    for item in db.iterator_cf(records, IteratorMode::Start) {
        let (k, v) = item.map_err(store_error)?;
        let record: ReservationRecord = decode(RESERVATIONS, &k, &v)?;
        batch.put_cf(
            index,
            reservation_id_key(record.reservation.id.as_str(), &record.key),
            encode(&record.key),
        );
    }
    let entries = batch.len();
    let mut options = rocksdb::WriteOptions::default();
    options.set_sync(true);
    db.write_opt(batch, &options).map_err(store_error)?;
    tracing::info!(
        entries,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "projection predates the reservation id index; built it from the records"
    );
    Ok(())
}

fn handle<'a>(db: &'a DB, cf: &str) -> Result<&'a rocksdb::ColumnFamily, ProjectionError> {
    db.cf_handle(cf)
        .ok_or_else(|| store_error(format!("missing column family {cf}")))
}

fn is_empty(db: &DB, cf: &str) -> Result<bool, ProjectionError> {
    match db.iterator_cf(handle(db, cf)?, IteratorMode::Start).next() {
        None => Ok(true),
        Some(item) => item.map(|_| false).map_err(store_error),
    }
}

/// Flushes every column family's memtable to disk, atomically. The projector
/// calls it when it stops; RocksDB also flushes on a clean close.
pub fn flush(db: &DB) -> Result<(), ProjectionError> {
    let handles: Vec<_> = COLUMN_FAMILIES
        .iter()
        .filter_map(|name| db.cf_handle(name))
        .collect();
    let mut options = rocksdb::FlushOptions::default();
    options.set_wait(true);
    db.flush_cfs_opt(&handles, &options).map_err(store_error)
}

pub(crate) fn store_error(e: impl std::fmt::Display) -> ProjectionError {
    ProjectionError::Store(e.to_string())
}

pub fn partition_key(key: &PartitionKey) -> String {
    let mut out = String::with_capacity(partition_key_len(key));
    push_partition_key(&mut out, key);
    out
}

// The keys a step writes for every reservation are built by hand: `format!`
// was 3.6 % of a request's instructions (bench-results/request-cost.md).
// Same bytes as `format!("{}|{}|{}|{:020}", ...)`.
fn push_partition_key(out: &mut String, key: &PartitionKey) {
    for part in [
        key.subject.as_str(),
        key.route.as_str(),
        key.accounting_epoch.as_str(),
    ] {
        out.push_str(part);
        out.push('|');
    }
    push_padded(out, key.policy_generation);
}

/// The partition key [`partition_key`] wrote (`None` if `s` is not one).
pub fn parse_partition_key(s: &str) -> Option<PartitionKey> {
    let mut parts = s.split('|');
    let (subject, route, epoch, generation) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || generation.len() != PADDED_DIGITS {
        return None;
    }
    PartitionKey::new(subject, route, epoch, generation.parse().ok()?).ok()
}

fn partition_key_len(key: &PartitionKey) -> usize {
    key.subject.len() + key.route.len() + key.accounting_epoch.len() + 3 + PADDED_DIGITS
}

/// Digits of a zero-padded u64 in a key (`{:020}`): byte order is numeric order.
const PADDED_DIGITS: usize = 20;

fn push_padded(out: &mut String, n: u64) {
    let mut digits = [b'0'; PADDED_DIGITS];
    let (mut n, mut i) = (n, PADDED_DIGITS);
    while n > 0 {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out.push_str(std::str::from_utf8(&digits).expect("ASCII digits"));
}

pub fn cursor_key(log_partition: u32) -> String {
    format!("{log_partition:010}")
}

pub fn reservation_key(key: &PartitionKey, id: &str) -> String {
    let mut out = String::with_capacity(partition_key_len(key) + 1 + id.len());
    push_partition_key(&mut out, key);
    out.push('|');
    out.push_str(id);
    out
}

/// Key of one [`FINISHED`] entry.
pub fn finished_key(finished_at_ms: u64, key: &PartitionKey, id: &str) -> String {
    let mut out = String::with_capacity(PADDED_DIGITS + 1 + partition_key_len(key) + 1 + id.len());
    push_padded(&mut out, finished_at_ms);
    out.push('|');
    push_partition_key(&mut out, key);
    out.push('|');
    out.push_str(id);
    out
}

/// The parts of a [`FINISHED`] key: when the reservation finished, its
/// partition key (as [`partition_key`] writes it) and its id.
pub fn finished_parts(finished: &str) -> Option<(u64, &str, &str)> {
    let at = finished.get(..PADDED_DIGITS)?.parse().ok()?;
    let (partition, id) = finished.get(PADDED_DIGITS + 1..)?.rsplit_once('|')?;
    Some((at, partition, id))
}

/// The [`RESERVATIONS`] and [`RESERVATION_IDS`] keys a [`FINISHED`] key names
/// (a partition key has four `|`-separated parts; ids contain no `|`).
pub fn keys_of_finished(finished: &str) -> Option<(String, String)> {
    let (_, partition, id) = finished_parts(finished)?;
    Some((
        finished[PADDED_DIGITS + 1..].to_string(),
        format!("{}{partition}", reservation_id_prefix(id)),
    ))
}

/// Key of one [`RESERVATION_IDS`] entry.
pub fn reservation_id_key(id: &str, key: &PartitionKey) -> String {
    let mut out = String::with_capacity(id.len() + 1 + partition_key_len(key));
    out.push_str(id);
    out.push('|');
    push_partition_key(&mut out, key);
    out
}

/// Every [`RESERVATION_IDS`] entry of `id` (identifiers never contain `|`, so
/// no other id's entries share it).
pub fn reservation_id_prefix(id: &str) -> String {
    format!("{id}|")
}

pub fn digest_prefix(route: &str, model: &str) -> String {
    format!("{route}|{model}|")
}

/// Every model's digests of a route.
pub fn route_digest_prefix(route: &str) -> String {
    format!("{route}|")
}

/// Key of a further dimension's efficiency histogram: `<route or tenant>|<dimension>`
/// (the primary dimension's is the bare route or tenant).
pub fn dimension_key(owner: &str, dimension: reservoir_core::Dimension) -> String {
    format!("{owner}|{}", dimension.name())
}

pub fn digest_key(route: &str, model: &str, log_partition: u32) -> String {
    format!("{}{log_partition:010}", digest_prefix(route, model))
}

pub fn refusal_key(key: &PartitionKey, at_ms: u64, sequence: u64) -> String {
    format!(
        "{}|{at_ms:020}|{}|{sequence:020}",
        key.subject,
        partition_key(key)
    )
}

/// `scope` is `route` or `tenant`, `owner` the route or the subject.
pub fn shadow_key(
    scope: &str,
    owner: &str,
    at_ms: u64,
    key: &PartitionKey,
    sequence: u64,
) -> String {
    format!(
        "{}{at_ms:020}|{}|{sequence:020}",
        shadow_prefix(scope, owner),
        partition_key(key)
    )
}

pub fn shadow_prefix(scope: &str, owner: &str) -> String {
    format!("{scope}|{owner}|")
}

pub fn finding_key(log_partition: u32, offset: u64, event_index: u32) -> String {
    format!("{log_partition:010}|{offset:020}|{event_index:010}")
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Records are a few hundred bytes of JSON: one allocation of this size
    // instead of growing from serde_json's default of 128.
    let mut out = Vec::with_capacity(ENCODED_BYTES_GUESS);
    serde_json::to_writer(&mut out, value).expect("read models serialize to JSON");
    out
}

const ENCODED_BYTES_GUESS: usize = 512;

pub(crate) fn decode<T: DeserializeOwned>(
    cf: &'static str,
    key: &[u8],
    bytes: &[u8],
) -> Result<T, ProjectionError> {
    serde_json::from_slice(bytes).map_err(|e| ProjectionError::Corrupt {
        cf,
        key: String::from_utf8_lossy(key).into_owned(),
        reason: e.to_string(),
    })
}

/// Where the read helpers read from: the database as it is now, or one
/// snapshot of it (see [`crate::query::At`]), so that several reads answer
/// from the same projector step.
pub trait Read {
    fn db(&self) -> &DB;
    fn get_cf(&self, cf: &ColumnFamily, key: &[u8]) -> Result<Option<Vec<u8>>, rocksdb::Error>;
    fn iterator_cf<'b>(
        &'b self,
        cf: &ColumnFamily,
        mode: IteratorMode,
    ) -> DBIteratorWithThreadMode<'b, DB>;
}

impl Read for DB {
    fn db(&self) -> &DB {
        self
    }
    fn get_cf(&self, cf: &ColumnFamily, key: &[u8]) -> Result<Option<Vec<u8>>, rocksdb::Error> {
        DB::get_cf(self, cf, key)
    }
    fn iterator_cf<'b>(
        &'b self,
        cf: &ColumnFamily,
        mode: IteratorMode,
    ) -> DBIteratorWithThreadMode<'b, DB> {
        DB::iterator_cf(self, cf, mode)
    }
}

pub(crate) fn get_raw(
    from: &impl Read,
    cf: &'static str,
    key: &str,
) -> Result<Option<Vec<u8>>, ProjectionError> {
    from.get_cf(handle(from.db(), cf)?, key.as_bytes())
        .map_err(store_error)
}

pub(crate) fn get<T: DeserializeOwned>(
    from: &impl Read,
    cf: &'static str,
    key: &str,
) -> Result<Option<T>, ProjectionError> {
    get_raw(from, cf, key)?
        .map(|bytes| decode(cf, key.as_bytes(), &bytes))
        .transpose()
}

/// A raw key and value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// One logical entry of [`dump`]: column family, key, value.
pub type DumpEntry = (String, Vec<u8>, Vec<u8>);

/// Every key/value of `cf` whose key starts with `prefix`, in key order.
pub(crate) fn scan_prefix(
    from: &impl Read,
    cf: &'static str,
    prefix: &str,
) -> Result<Vec<KeyValue>, ProjectionError> {
    scan_range(from, cf, prefix, prefix, None)
}

/// Every key/value of `cf` whose key starts with `prefix`, from `start` up
/// to (not including) `until`, in key order.
pub(crate) fn scan_range(
    from: &impl Read,
    cf: &'static str,
    prefix: &str,
    start: &str,
    until: Option<&str>,
) -> Result<Vec<KeyValue>, ProjectionError> {
    let mode = IteratorMode::From(start.as_bytes(), rocksdb::Direction::Forward);
    let mut out = Vec::new();
    for item in from.iterator_cf(handle(from.db(), cf)?, mode) {
        let (k, v) = item.map_err(store_error)?;
        let past = until.is_some_and(|u| *k >= *u.as_bytes());
        if !k.starts_with(prefix.as_bytes()) || past {
            break;
        }
        out.push((k.to_vec(), v.to_vec()));
    }
    Ok(out)
}

/// The first key/value of `cf` whose key starts with `prefix`.
pub(crate) fn first_with_prefix(
    from: &impl Read,
    cf: &'static str,
    prefix: &str,
) -> Result<Option<KeyValue>, ProjectionError> {
    let mode = IteratorMode::From(prefix.as_bytes(), rocksdb::Direction::Forward);
    match from.iterator_cf(handle(from.db(), cf)?, mode).next() {
        Some(Ok((k, v))) if k.starts_with(prefix.as_bytes()) => Ok(Some((k.to_vec(), v.to_vec()))),
        Some(Err(e)) => Err(store_error(e)),
        _ => Ok(None),
    }
}

/// Every logical key/value of the projection, column family by column family in
/// [`COLUMN_FAMILIES`] order, keys in byte order. Two projections of the same log
/// have equal dumps.
pub fn dump(db: &DB) -> Result<Vec<DumpEntry>, ProjectionError> {
    // One snapshot: a projector writing meanwhile cannot tear the dump.
    let at = crate::query::At::of(db);
    let mut out = Vec::new();
    for cf in COLUMN_FAMILIES {
        for (k, v) in scan_prefix(&at, cf, "")? {
            out.push((cf.to_string(), k, v));
        }
    }
    Ok(out)
}

/// Where two dumps first differ, as text: each side's column family, key and
/// value (an entry only one side has, when one is a prefix of the other), or
/// `None` when they are equal.
pub fn first_difference(a: &[DumpEntry], b: &[DumpEntry]) -> Option<String> {
    let show = |entry: Option<&DumpEntry>| match entry {
        Some((cf, key, value)) => format!(
            "{cf} {} = {}",
            String::from_utf8_lossy(key),
            String::from_utf8_lossy(value)
        ),
        None => "(nothing)".to_string(),
    };
    let at = a.iter().zip(b).position(|(x, y)| x != y);
    let at = at.or((a.len() != b.len()).then_some(a.len().min(b.len())))?;
    Some(format!("{}\n  vs {}", show(a.get(at)), show(b.get(at))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str) -> DumpEntry {
        (BALANCES.into(), key.into(), value.into())
    }

    #[test]
    fn the_first_difference_names_both_sides_and_an_entry_one_side_lacks() {
        let a = [entry("k1", "1"), entry("k2", "2")];
        assert_eq!(first_difference(&a, &a), None);
        let b = [entry("k1", "1"), entry("k2", "3")];
        assert_eq!(
            first_difference(&a, &b).unwrap(),
            "balances k2 = 2\n  vs balances k2 = 3"
        );
        assert_eq!(
            first_difference(&a, &a[..1]).unwrap(),
            "balances k2 = 2\n  vs (nothing)"
        );
        assert_eq!(
            first_difference(&a[..1], &a).unwrap(),
            "(nothing)\n  vs balances k2 = 2"
        );
    }
}
