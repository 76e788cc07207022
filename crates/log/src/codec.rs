//! The Avro codec of the log: [`LogEntry`] ⇄ the bytes a Kafka record value (and
//! an embedded-log value) carries.
//!
//! The wire contract is `schemas/` at the repository root. Each value is in the
//! Confluent wire framing: magic byte `0`, the 4-byte big-endian schema id from
//! `schemas/registry.json`, then the Avro binary datum. A record is an
//! `io.reservoir.v1.Envelope` (id [`ENVELOPE_ID`]), a claim an
//! `io.reservoir.v1.Claim` (id [`CLAIM_ID`]): the schema id alone says which kind
//! of entry a value is, so a consumer that knows only the `.avsc` files and the
//! id mapping decodes every value.
//!
//! Encoding writes Avro binary straight from the Rust types (no intermediate
//! `Value`, no schema lookups): it sits on the writer's hot path. Tests check
//! byte for byte that apache-avro, given the registered schema, reads it and
//! re-encodes it to the same bytes. Decoding goes through apache-avro with the
//! registered writer schema of the value's id (resolving to the current schema
//! when the id is an older registered version), then converts the generic
//! `Value` to Rust types. Every malformed input is a [`CodecError`], never a panic.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use apache_avro::schema::Schema;
use apache_avro::types::Value;
use reservoir_core::{
    CapacityUnit, EmergencyMode, Event, EventBody, MoveId, OperationId, PartitionKey, Policy,
    RefillRule, RefusalReason, RequestDigest, ReservationId, ShadowVerdict, ShardId, Sizing,
    SizingRule, Usage,
};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::{Claim, LogEntry, Record};

/// Avro namespace of every schema in `schemas/`.
pub const NAMESPACE: &str = "io.reservoir.v1";
/// First byte of the Confluent wire framing.
pub const MAGIC_BYTE: u8 = 0;
/// Magic byte plus the 4-byte schema id.
pub const FRAME_HEADER_BYTES: usize = 5;
/// Largest value the codec writes or reads (Kafka's default `message.max.bytes`
/// is about this). Also bounds apache-avro's allocations when decoding garbage.
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Most events one record (one command) may carry.
pub const MAX_EVENTS_PER_RECORD: usize = 4096;

/// Current schema id of `io.reservoir.v1.Envelope` (a [`Record`]). Id 1, the
/// first version, stays readable: its values decode with `usage`/`sizing` null.
pub const ENVELOPE_ID: u32 = 8;
/// Current schema id of `io.reservoir.v1.Claim`.
pub const CLAIM_ID: u32 = 2;

/// Record header names (values are UTF-8).
pub const HEADER_ENTRY_KIND: &str = "reservoir.entry";
pub const HEADER_EVENT_TYPES: &str = "reservoir.event-types";
pub const HEADER_SCHEMA_ID: &str = "reservoir.schema-id";
pub const HEADER_SCHEMA_FINGERPRINT: &str = "reservoir.schema-fingerprint";

/// The `.avsc` sources, embedded at build time: (named type, JSON text).
pub const SCHEMA_SOURCES: &[(&str, &str)] = &[
    (
        "PartitionKey",
        include_str!("../../../schemas/PartitionKey.avsc"),
    ),
    ("Sha256", include_str!("../../../schemas/Sha256.avsc")),
    (
        "ShadowVerdict",
        include_str!("../../../schemas/ShadowVerdict.avsc"),
    ),
    (
        "SizingRule",
        include_str!("../../../schemas/SizingRule.avsc"),
    ),
    ("Sizing", include_str!("../../../schemas/Sizing.avsc")),
    ("Usage", include_str!("../../../schemas/Usage.avsc")),
    (
        "AdmissionBudget",
        include_str!("../../../schemas/AdmissionBudget.avsc"),
    ),
    (
        "LimitReservation",
        include_str!("../../../schemas/LimitReservation.avsc"),
    ),
    (
        "EmergencyShard",
        include_str!("../../../schemas/EmergencyShard.avsc"),
    ),
    (
        "PartitionOpened",
        include_str!("../../../schemas/PartitionOpened.avsc"),
    ),
    ("Refilled", include_str!("../../../schemas/Refilled.avsc")),
    ("Reserved", include_str!("../../../schemas/Reserved.avsc")),
    (
        "AdmissionRefused",
        include_str!("../../../schemas/AdmissionRefused.avsc"),
    ),
    ("Started", include_str!("../../../schemas/Started.avsc")),
    ("Settled", include_str!("../../../schemas/Settled.avsc")),
    ("Released", include_str!("../../../schemas/Released.avsc")),
    (
        "ExpiryBegan",
        include_str!("../../../schemas/ExpiryBegan.avsc"),
    ),
    ("Expired", include_str!("../../../schemas/Expired.avsc")),
    (
        "UsageUnknown",
        include_str!("../../../schemas/UsageUnknown.avsc"),
    ),
    (
        "ShardIssued",
        include_str!("../../../schemas/ShardIssued.avsc"),
    ),
    (
        "ShardReminted",
        include_str!("../../../schemas/ShardReminted.avsc"),
    ),
    ("Closed", include_str!("../../../schemas/Closed.avsc")),
    ("MovedOut", include_str!("../../../schemas/MovedOut.avsc")),
    ("MovedIn", include_str!("../../../schemas/MovedIn.avsc")),
    ("Event", include_str!("../../../schemas/Event.avsc")),
    ("Envelope", include_str!("../../../schemas/Envelope.avsc")),
    ("Claim", include_str!("../../../schemas/Claim.avsc")),
];

/// `schemas/registry.json`: schema id → subject, source file, registered schema.
pub const REGISTRY_JSON: &str = include_str!("../../../schemas/registry.json");

/// Every registered schema, self-contained (named types inlined), by id. Ids are
/// never reused and snapshots never change: a value written under any of them
/// stays decodable. A new version adds a line here and in `registry.json`.
pub const REGISTERED_SCHEMAS: &[(u32, &str)] = &[
    (
        1,
        include_str!("../../../schemas/registered/1-Envelope.avsc"),
    ),
    (2, include_str!("../../../schemas/registered/2-Claim.avsc")),
    (
        3,
        include_str!("../../../schemas/registered/3-AdmissionBudget.avsc"),
    ),
    (
        4,
        include_str!("../../../schemas/registered/4-LimitReservation.avsc"),
    ),
    (
        5,
        include_str!("../../../schemas/registered/5-EmergencyShard.avsc"),
    ),
    // Envelope v2: Settled.usage and Reserved.sizing (optional, default null).
    (
        6,
        include_str!("../../../schemas/registered/6-Envelope.avsc"),
    ),
    // AdmissionBudget v2 and Envelope v3: AdmissionBudget.idempotencyWindowMs
    // (default 600000, so every older value reads with 10 minutes).
    (
        7,
        include_str!("../../../schemas/registered/7-AdmissionBudget.avsc"),
    ),
    (
        8,
        include_str!("../../../schemas/registered/8-Envelope.avsc"),
    ),
];

/// Branches of `Event.body`, in union order. The encoder writes these indices;
/// a test checks them against `Event.avsc`.
pub const EVENT_BODY_BRANCHES: [&str; 15] = [
    "PartitionOpened",
    "Refilled",
    "Reserved",
    "AdmissionRefused",
    "Started",
    "Settled",
    "Released",
    "ExpiryBegan",
    "Expired",
    "UsageUnknown",
    "ShardIssued",
    "ShardReminted",
    "Closed",
    "MovedOut",
    "MovedIn",
];

/// Why bytes could not become an entry, or an entry bytes. Never transient.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodecError {
    #[error("value is {len} bytes, shorter than the 5-byte frame header")]
    TooShort { len: usize },
    #[error("value is {len} bytes, above the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("magic byte {0}, expected 0")]
    BadMagic(u8),
    #[error("unknown schema id {0}")]
    UnknownSchemaId(u32),
    #[error("schema id {id} ({subject}) is not a log entry")]
    NotAnEntry { id: u32, subject: String },
    #[error("avro: {0}")]
    Avro(String),
    #[error("{0} trailing bytes after the datum")]
    TrailingBytes(usize),
    #[error("unexpected shape at {path}: {detail}")]
    Shape { path: &'static str, detail: String },
    #[error("{field} = {value} does not fit an Avro long")]
    OutOfRange { field: &'static str, value: u64 },
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("schema: {0}")]
    Schema(String),
}

/// One registered schema, parsed.
#[derive(Debug)]
pub struct RegisteredSchema {
    pub id: u32,
    pub subject: String,
    /// Source file under `schemas/` the snapshot was bundled from.
    pub source: String,
    /// Snapshot path under `schemas/`.
    pub path: String,
    pub schema: Schema,
    /// sha256 of the schema's Parsing Canonical Form, `sha256:<hex>`.
    pub fingerprint: String,
    /// For an Envelope: the `Event.body` union's branches (record name, schema),
    /// in union order. Branches are told apart by these names, never by shape.
    pub body_branches: Vec<(String, Schema)>,
}

/// The `Event.body` union branches of an Envelope schema (empty otherwise).
fn body_branches(schema: &Schema) -> Vec<(String, Schema)> {
    let field = |s: &Schema, name: &str| match s {
        Schema::Record(r) => r
            .fields
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.schema.clone()),
        _ => None,
    };
    let Some(Schema::Array(events)) = field(schema, "events") else {
        return Vec::new();
    };
    let Some(Schema::Union(body)) = field(&events.items, "body") else {
        return Vec::new();
    };
    body.variants()
        .iter()
        .map(|v| {
            let name = match v {
                Schema::Record(r) => r.name.name.clone(),
                Schema::Ref { name } => name.name.clone(),
                _ => String::new(),
            };
            (name, v.clone())
        })
        .collect()
}

/// The parsed registry: every id, and the current (highest) id per subject.
#[derive(Debug)]
pub struct Registry {
    pub schemas: BTreeMap<u32, RegisteredSchema>,
    pub current: BTreeMap<String, u32>,
}

impl Registry {
    /// Adds a schema (its JSON) under `id`, the current one of its subject if
    /// `id` is the highest. For tools and evolution tests; the embedded registry
    /// is fixed.
    pub fn insert(
        &mut self,
        id: u32,
        subject: &str,
        json: &serde_json::Value,
    ) -> Result<(), CodecError> {
        let schema =
            Schema::parse(json).map_err(|e| CodecError::Schema(format!("id {id}: {e}")))?;
        let fingerprint = fingerprint(json)?;
        let current = self.current.entry(subject.to_string()).or_insert(id);
        *current = (*current).max(id);
        self.schemas.insert(
            id,
            RegisteredSchema {
                id,
                subject: subject.to_string(),
                source: String::new(),
                path: String::new(),
                body_branches: body_branches(&schema),
                schema,
                fingerprint,
            },
        );
        Ok(())
    }

    pub fn get(&self, id: u32) -> Option<&RegisteredSchema> {
        self.schemas.get(&id)
    }

    pub fn current(&self, subject: &str) -> Option<&RegisteredSchema> {
        self.current
            .get(subject)
            .and_then(|id| self.schemas.get(id))
    }
}

#[derive(serde::Deserialize)]
struct RegistryFile {
    schemas: Vec<RegistryLine>,
}

#[derive(serde::Deserialize)]
struct RegistryLine {
    id: u32,
    subject: String,
    source: String,
    schema: String,
}

/// `sha256:<hex>` of a schema's Parsing Canonical Form.
pub fn fingerprint(json: &serde_json::Value) -> Result<String, CodecError> {
    let pcf = parsing_canonical_form(json)?;
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(pcf.as_bytes()))
    ))
}

const PRIMITIVES: [&str; 8] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
];

/// The Avro specification's Parsing Canonical Form of a schema given as JSON:
/// primitives in simple form, full names, only `name`, `type`, `fields`,
/// `symbols`, `items`, `values`, `size`, in that order, no whitespace. Written
/// here because apache-avro 0.21 keeps `{"type":"long"}` for a logical type,
/// where the spec (and other clients, e.g. fastavro) write `"long"`; the
/// fingerprint header must be what any client computes from the `.avsc`.
pub fn parsing_canonical_form(json: &serde_json::Value) -> Result<String, CodecError> {
    let mut out = String::new();
    pcf(json, "", &mut out)?;
    Ok(out)
}

fn full_name(name: &str, namespace: &str) -> String {
    if name.contains('.') || namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}.{name}")
    }
}

fn quoted(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn pcf(node: &serde_json::Value, namespace: &str, out: &mut String) -> Result<(), CodecError> {
    use serde_json::Value as J;
    let bad = |what: &str| CodecError::Schema(format!("canonical form: {what}"));
    match node {
        J::String(name) if PRIMITIVES.contains(&name.as_str()) => out.push_str(&quoted(name)),
        J::String(name) => out.push_str(&quoted(&full_name(name, namespace))),
        J::Array(branches) => {
            out.push('[');
            for (i, branch) in branches.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                pcf(branch, namespace, out)?;
            }
            out.push(']');
        }
        J::Object(map) => {
            let kind = map.get("type").ok_or_else(|| bad("object without type"))?;
            let Some(kind) = kind.as_str() else {
                // {"type": {...}}: the nested schema is the schema.
                return pcf(kind, namespace, out);
            };
            let named = |out: &mut String| -> Result<String, CodecError> {
                let name = map
                    .get("name")
                    .and_then(J::as_str)
                    .ok_or_else(|| bad("unnamed type"))?;
                let own = map
                    .get("namespace")
                    .and_then(J::as_str)
                    .unwrap_or(namespace);
                let full = full_name(name, own);
                out.push_str(&format!(
                    "{{\"name\":{},\"type\":{}",
                    quoted(&full),
                    quoted(kind)
                ));
                Ok(full
                    .rsplit_once('.')
                    .map_or(String::new(), |(ns, _)| ns.to_string()))
            };
            match kind {
                "record" | "error" => {
                    let inner = named(out)?;
                    out.push_str(",\"fields\":[");
                    let fields = map
                        .get("fields")
                        .and_then(J::as_array)
                        .ok_or_else(|| bad("record without fields"))?;
                    for (i, field) in fields.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let name = field
                            .get("name")
                            .and_then(J::as_str)
                            .ok_or_else(|| bad("unnamed field"))?;
                        out.push_str(&format!("{{\"name\":{},\"type\":", quoted(name)));
                        pcf(
                            field.get("type").ok_or_else(|| bad("field without type"))?,
                            &inner,
                            out,
                        )?;
                        out.push('}');
                    }
                    out.push_str("]}");
                }
                "enum" => {
                    named(out)?;
                    let symbols = map
                        .get("symbols")
                        .ok_or_else(|| bad("enum without symbols"))?;
                    out.push_str(&format!(",\"symbols\":{symbols}}}"));
                }
                "fixed" => {
                    named(out)?;
                    let size = map
                        .get("size")
                        .and_then(J::as_u64)
                        .ok_or_else(|| bad("fixed without size"))?;
                    out.push_str(&format!(",\"size\":{size}}}"));
                }
                "array" => {
                    out.push_str("{\"type\":\"array\",\"items\":");
                    pcf(
                        map.get("items").ok_or_else(|| bad("array without items"))?,
                        namespace,
                        out,
                    )?;
                    out.push('}');
                }
                "map" => {
                    out.push_str("{\"type\":\"map\",\"values\":");
                    pcf(
                        map.get("values").ok_or_else(|| bad("map without values"))?,
                        namespace,
                        out,
                    )?;
                    out.push('}');
                }
                // A primitive, possibly with a logical type: its simple form.
                primitive if PRIMITIVES.contains(&primitive) => out.push_str(&quoted(primitive)),
                // A reference written as {"type": "Name"}.
                name => out.push_str(&quoted(&full_name(name, namespace))),
            }
        }
        other => return Err(bad(&format!("unexpected {other}"))),
    }
    Ok(())
}

/// Parses `registry.json` and the embedded snapshots.
pub fn load_registry() -> Result<Registry, CodecError> {
    let file: RegistryFile = serde_json::from_str(REGISTRY_JSON)
        .map_err(|e| CodecError::Schema(format!("registry.json: {e}")))?;
    let mut registry = Registry {
        schemas: BTreeMap::new(),
        current: BTreeMap::new(),
    };
    for line in file.schemas {
        let text = REGISTERED_SCHEMAS
            .iter()
            .find(|(id, _)| *id == line.id)
            .map(|(_, text)| *text)
            .ok_or_else(|| {
                CodecError::Schema(format!("id {} has no embedded snapshot", line.id))
            })?;
        let schema = Schema::parse_str(text)
            .map_err(|e| CodecError::Schema(format!("id {}: {e}", line.id)))?;
        let json: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| CodecError::Schema(format!("id {}: {e}", line.id)))?;
        let fingerprint = fingerprint(&json)?;
        let current = registry
            .current
            .entry(line.subject.clone())
            .or_insert(line.id);
        *current = (*current).max(line.id);
        let entry = RegisteredSchema {
            id: line.id,
            subject: line.subject,
            source: line.source,
            path: line.schema,
            body_branches: body_branches(&schema),
            schema,
            fingerprint,
        };
        if registry.schemas.insert(line.id, entry).is_some() {
            return Err(CodecError::Schema(format!(
                "id {} registered twice",
                line.id
            )));
        }
    }
    Ok(registry)
}

/// Bundles the `.avsc` source of `root` into one self-contained schema: each
/// named type it references is inlined at its first use, as a registry stores it.
pub fn bundle_schema(root: &str) -> Result<serde_json::Value, CodecError> {
    let mut sources = BTreeMap::new();
    for (name, text) in SCHEMA_SOURCES {
        let json: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| CodecError::Schema(format!("{name}.avsc: {e}")))?;
        sources.insert(name.to_string(), json);
    }
    bundle_schema_from(root, &sources)
}

/// [`bundle_schema`] over other sources (named type → parsed `.avsc`), e.g. the
/// files of an earlier commit.
pub fn bundle_schema_from(
    root: &str,
    sources: &BTreeMap<String, serde_json::Value>,
) -> Result<serde_json::Value, CodecError> {
    let root_json = sources
        .get(root)
        .cloned()
        .ok_or_else(|| CodecError::Schema(format!("no schema {root}")))?;
    let mut defined = std::collections::BTreeSet::from([root.to_string()]);
    Ok(inline(root_json, sources, &mut defined))
}

fn inline(
    node: serde_json::Value,
    sources: &BTreeMap<String, serde_json::Value>,
    defined: &mut std::collections::BTreeSet<String>,
) -> serde_json::Value {
    use serde_json::Value as J;
    match node {
        J::String(name) => {
            let short = name
                .strip_prefix(NAMESPACE)
                .and_then(|s| s.strip_prefix('.'))
                .unwrap_or(&name)
                .to_string();
            match sources.get(&short) {
                Some(def) if !defined.contains(&short) => {
                    defined.insert(short);
                    inline(def.clone(), sources, defined)
                }
                _ => J::String(name),
            }
        }
        J::Array(items) => J::Array(
            items
                .into_iter()
                .map(|v| inline(v, sources, defined))
                .collect(),
        ),
        J::Object(map) => {
            let is_named = matches!(
                map.get("type").and_then(J::as_str),
                Some("record" | "enum" | "fixed")
            );
            if let (true, Some(name)) = (is_named, map.get("name").and_then(J::as_str)) {
                defined.insert(name.to_string());
            }
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                let v = if matches!(k.as_str(), "type" | "items" | "values" | "fields") {
                    inline(v, sources, defined)
                } else {
                    v
                };
                out.insert(k, v);
            }
            J::Object(out)
        }
        other => other,
    }
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    // Bound apache-avro's allocations while decoding untrusted bytes (it reserves
    // a length prefix's worth of items before reading them). Process-wide; the
    // first caller fixes it.
    apache_avro::util::max_allocation_bytes(MAX_VALUE_BYTES);
    // The embedded schemas are build-time constants checked by the tests.
    load_registry().expect("embedded schemas/registry.json and snapshots are valid")
});

/// The parsed registry embedded in this build.
pub fn registry() -> &'static Registry {
    &REGISTRY
}

// ---------------------------------------------------------------------------
// Keys and headers.

/// The ledger partition key as a Kafka record key: `subject|route|epoch|g<generation>`.
/// `|` cannot occur in a key part, so the rendering is unambiguous.
pub fn partition_key_string(key: &PartitionKey) -> String {
    key.to_string()
}

/// Event id: `<partition key>/<sequence>`, unique across the whole log.
pub fn event_id(key: &PartitionKey, sequence: u64) -> String {
    format!("{key}/{sequence}")
}

/// Kafka record key of an entry: the partition key for a record; for a claim
/// `!claim|<writer id>` (`!` cannot start a partition key). Claims are produced
/// to an explicit log partition, so their key never decides placement.
pub fn record_key(entry: &LogEntry) -> String {
    match entry {
        LogEntry::Record(r) => partition_key_string(&r.key),
        LogEntry::Claim(c) => format!("!claim|{}", c.writer_id),
    }
}

/// Schema id an entry is written under.
pub fn schema_id(entry: &LogEntry) -> u32 {
    match entry {
        LogEntry::Record(_) => ENVELOPE_ID,
        LogEntry::Claim(_) => CLAIM_ID,
    }
}

/// Record headers: entry kind, event types (comma-separated, in order, repeats
/// kept once), schema id and schema fingerprint.
pub fn headers(entry: &LogEntry) -> Vec<(&'static str, String)> {
    let id = schema_id(entry);
    let fingerprint = registry()
        .get(id)
        .map(|s| s.fingerprint.clone())
        .unwrap_or_default();
    let (kind, types) = match entry {
        LogEntry::Claim(_) => ("claim", "Claim".to_string()),
        LogEntry::Record(r) => {
            let mut types: Vec<&str> = Vec::new();
            for e in &r.events {
                let t = e.body.type_name();
                if !types.contains(&t) {
                    types.push(t);
                }
            }
            ("record", types.join(","))
        }
    };
    vec![
        (HEADER_ENTRY_KIND, kind.to_string()),
        (HEADER_EVENT_TYPES, types),
        (HEADER_SCHEMA_ID, id.to_string()),
        (HEADER_SCHEMA_FINGERPRINT, fingerprint),
    ]
}

// ---------------------------------------------------------------------------
// Encoding: Avro binary written directly, in the field order of the schemas.

/// Encodes an entry as a framed value.
pub fn encode(entry: &LogEntry) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(128);
    encode_into(entry, &mut out)?;
    Ok(out)
}

/// Appends an entry's framed value to `out` (which may already hold bytes).
pub fn encode_into(entry: &LogEntry, out: &mut Vec<u8>) -> Result<(), CodecError> {
    match entry {
        LogEntry::Record(r) => encode_record_into(r, out),
        LogEntry::Claim(c) => framed(out, CLAIM_ID, |out| write_claim(out, c)),
    }
}

/// [`encode_into`] for a record the caller keeps (no `LogEntry` to build).
pub fn encode_record_into(record: &Record, out: &mut Vec<u8>) -> Result<(), CodecError> {
    framed(out, ENVELOPE_ID, |out| write_envelope(out, record))
}

/// Frame header, then the datum; on any error `out` is left as it was.
fn framed(
    out: &mut Vec<u8>,
    schema_id: u32,
    datum: impl FnOnce(&mut Vec<u8>) -> Result<(), CodecError>,
) -> Result<(), CodecError> {
    let start = out.len();
    out.push(MAGIC_BYTE);
    out.extend_from_slice(&schema_id.to_be_bytes());
    let result = datum(out);
    let len = out.len() - start;
    if let Err(e) = result {
        out.truncate(start);
        return Err(e);
    }
    if len > MAX_VALUE_BYTES {
        out.truncate(start);
        return Err(CodecError::TooLarge {
            len,
            max: MAX_VALUE_BYTES,
        });
    }
    Ok(())
}

/// Zig-zag varint, assembled on the stack and appended in one copy.
fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    let mut buf = [0u8; 10];
    let mut len = 0;
    while z >= 0x80 {
        buf[len] = (z as u8) | 0x80;
        z >>= 7;
        len += 1;
    }
    buf[len] = z as u8;
    out.extend_from_slice(&buf[..=len]);
}

fn put_u64(out: &mut Vec<u8>, field: &'static str, v: u64) -> Result<(), CodecError> {
    let v = i64::try_from(v).map_err(|_| CodecError::OutOfRange { field, value: v })?;
    put_long(out, v);
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

fn put_bool(out: &mut Vec<u8>, b: bool) {
    out.push(u8::from(b));
}

fn put_opt_u64(out: &mut Vec<u8>, field: &'static str, v: Option<u64>) -> Result<(), CodecError> {
    match v {
        None => put_long(out, 0),
        Some(v) => {
            put_long(out, 1);
            put_u64(out, field, v)?;
        }
    }
    Ok(())
}

fn write_key(out: &mut Vec<u8>, key: &PartitionKey) -> Result<(), CodecError> {
    put_str(out, &key.subject);
    put_str(out, &key.route);
    put_str(out, &key.accounting_epoch);
    put_u64(out, "policyGeneration", key.policy_generation)
}

fn write_claim(out: &mut Vec<u8>, c: &Claim) -> Result<(), CodecError> {
    put_str(out, &c.writer_id);
    put_u64(out, "epoch", c.epoch)
}

fn write_envelope(out: &mut Vec<u8>, r: &Record) -> Result<(), CodecError> {
    if r.events.is_empty() || r.events.len() > MAX_EVENTS_PER_RECORD {
        return Err(CodecError::Invalid {
            field: "events",
            reason: format!(
                "{} events, expected 1..={MAX_EVENTS_PER_RECORD}",
                r.events.len()
            ),
        });
    }
    write_key(out, &r.key)?;
    put_str(out, &r.writer_id);
    put_u64(out, "claimEpoch", r.claim_epoch)?;
    // One array block holding every event, then the terminating empty block.
    put_long(out, r.events.len() as i64);
    let key_text_len = key_text_len(&r.key);
    for e in &r.events {
        put_u64(out, "sequence", e.sequence)?;
        put_u64(out, "atMs", e.at_ms)?;
        // eventId = "<key>/<sequence>", rendered straight into the buffer (this
        // is the hot path of every append; no String, no fmt).
        put_long(out, (key_text_len + 1 + decimal_len(e.sequence)) as i64);
        put_key_text(out, &r.key);
        out.push(b'/');
        put_decimal(out, e.sequence);
        write_body(out, &e.body)?;
    }
    put_long(out, 0);
    Ok(())
}

/// Length of [`partition_key_string`] without building it.
fn key_text_len(key: &PartitionKey) -> usize {
    key.subject.len()
        + key.route.len()
        + key.accounting_epoch.len()
        + 4
        + decimal_len(key.policy_generation)
}

/// Writes [`partition_key_string`] (`subject|route|epoch|g<generation>`).
fn put_key_text(out: &mut Vec<u8>, key: &PartitionKey) {
    out.extend_from_slice(key.subject.as_bytes());
    out.push(b'|');
    out.extend_from_slice(key.route.as_bytes());
    out.push(b'|');
    out.extend_from_slice(key.accounting_epoch.as_bytes());
    out.extend_from_slice(b"|g");
    put_decimal(out, key.policy_generation);
}

fn decimal_len(mut v: u64) -> usize {
    let mut digits = 1;
    while v >= 10 {
        v /= 10;
        digits += 1;
    }
    digits
}

fn put_decimal(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[at..]);
}

fn branch_index(body: &EventBody) -> i64 {
    match body {
        EventBody::PartitionOpened { .. } => 0,
        EventBody::Refilled { .. } => 1,
        EventBody::Reserved { .. } => 2,
        EventBody::AdmissionRefused { .. } => 3,
        EventBody::Started { .. } => 4,
        EventBody::Settled { .. } => 5,
        EventBody::Released { .. } => 6,
        EventBody::ExpiryBegan { .. } => 7,
        EventBody::Expired { .. } => 8,
        EventBody::UsageUnknown { .. } => 9,
        EventBody::ShardIssued { .. } => 10,
        EventBody::ShardReminted { .. } => 11,
        EventBody::Closed => 12,
        EventBody::MovedOut { .. } => 13,
        EventBody::MovedIn { .. } => 14,
    }
}

fn write_body(out: &mut Vec<u8>, body: &EventBody) -> Result<(), CodecError> {
    put_long(out, branch_index(body));
    match body {
        EventBody::PartitionOpened {
            key,
            policy,
            opening_units,
        } => {
            write_key(out, key)?;
            write_policy(out, policy)?;
            put_u64(out, "openingUnits", *opening_units)?;
        }
        EventBody::Refilled {
            minted_units,
            repaid_units,
            remainder,
        } => {
            put_u64(out, "mintedUnits", *minted_units)?;
            put_u64(out, "repaidUnits", *repaid_units)?;
            put_u64(out, "remainder", *remainder)?;
        }
        EventBody::Reserved {
            id,
            digest,
            reserved_units,
            held_units,
            expires_at_ms,
            shadow,
            sizing,
        } => {
            put_str(out, id.as_str());
            out.extend_from_slice(&digest.0);
            put_u64(out, "reservedUnits", *reserved_units)?;
            put_u64(out, "heldUnits", *held_units)?;
            put_u64(out, "expiresAtMs", *expires_at_ms)?;
            match shadow {
                None => put_long(out, 0),
                Some(v) => {
                    put_long(out, 1);
                    put_long(out, shadow_index(*v));
                }
            }
            match sizing {
                None => put_long(out, 0),
                Some(s) => {
                    put_long(out, 1);
                    put_u64(out, "sizing.units", s.units)?;
                    put_u64(out, "sizing.inputUnits", s.input_units)?;
                    put_u64(out, "sizing.outputUnits", s.output_units)?;
                    put_long(out, sizing_rule_index(s.rule));
                }
            }
        }
        EventBody::AdmissionRefused {
            id,
            requested_units,
            reason,
            retry_after_ms,
        } => {
            put_str(out, id.as_str());
            put_u64(out, "requestedUnits", *requested_units)?;
            put_long(out, refusal_index(*reason));
            put_opt_u64(out, "retryAfterMs", *retry_after_ms)?;
        }
        EventBody::Started {
            id,
            operation_id,
            execution_deadline_ms,
        } => {
            put_str(out, id.as_str());
            put_str(out, operation_id.as_str());
            put_u64(out, "executionDeadlineMs", *execution_deadline_ms)?;
        }
        EventBody::Settled {
            id,
            actual_units,
            refunded_units,
            from_available_units,
            overdraft_units,
            overdraft_limit_breached,
            from_usage_unknown,
            usage,
        } => {
            put_str(out, id.as_str());
            put_u64(out, "actualUnits", *actual_units)?;
            put_u64(out, "refundedUnits", *refunded_units)?;
            put_u64(out, "fromAvailableUnits", *from_available_units)?;
            put_u64(out, "overdraftUnits", *overdraft_units)?;
            put_bool(out, *overdraft_limit_breached);
            put_bool(out, *from_usage_unknown);
            match usage {
                None => put_long(out, 0),
                Some(u) => {
                    put_long(out, 1);
                    match &u.model {
                        None => put_long(out, 0),
                        Some(m) => {
                            put_long(out, 1);
                            put_str(out, m);
                        }
                    }
                    put_opt_u64(out, "usage.outputTokens", u.output_tokens)?;
                    put_opt_u64(out, "usage.countedInputTokens", u.counted_input_tokens)?;
                    put_opt_u64(out, "usage.reportedInputTokens", u.reported_input_tokens)?;
                }
            }
        }
        EventBody::Released { id, refunded_units } | EventBody::Expired { id, refunded_units } => {
            put_str(out, id.as_str());
            put_u64(out, "refundedUnits", *refunded_units)?;
        }
        EventBody::ExpiryBegan { id } | EventBody::UsageUnknown { id } => put_str(out, id.as_str()),
        EventBody::ShardIssued {
            shard_id,
            units,
            gateway_id,
            boot_epoch,
            expires_at_ms,
        } => {
            put_str(out, shard_id.as_str());
            put_u64(out, "units", *units)?;
            put_str(out, gateway_id);
            put_u64(out, "bootEpoch", *boot_epoch)?;
            put_u64(out, "expiresAtMs", *expires_at_ms)?;
        }
        EventBody::ShardReminted {
            shard_id,
            source,
            units,
        } => {
            put_str(out, shard_id.as_str());
            write_key(out, source)?;
            put_u64(out, "units", *units)?;
        }
        EventBody::Closed => {}
        EventBody::MovedOut {
            move_id,
            to: key,
            units,
            debt_units,
        }
        | EventBody::MovedIn {
            move_id,
            from: key,
            units,
            debt_units,
        } => {
            put_str(out, move_id.as_str());
            write_key(out, key)?;
            put_u64(out, "units", *units)?;
            put_u64(out, "debtUnits", *debt_units)?;
        }
    }
    Ok(())
}

fn write_policy(out: &mut Vec<u8>, p: &Policy) -> Result<(), CodecError> {
    put_str(out, &p.subject);
    put_str(out, &p.route);
    put_str(out, &p.region);
    put_long(
        out,
        match p.capacity_unit {
            CapacityUnit::Tokens => 0,
            CapacityUnit::Requests => 1,
        },
    );
    put_u64(out, "refill.units", p.refill.units)?;
    put_u64(out, "refill.intervalMs", p.refill.interval_ms)?;
    put_u64(out, "burstUnits", p.burst_units)?;
    put_u64(out, "openingUnits", p.opening_units)?;
    put_str(out, &p.estimator_digest);
    put_u64(out, "maxReservationUnits", p.max_reservation_units)?;
    put_u64(out, "holdTtlMs", p.hold_ttl_ms)?;
    put_u64(out, "hardExecutionLimitMs", p.hard_execution_limit_ms)?;
    put_u64(out, "maxOverdraftUnits", p.max_overdraft_units)?;
    put_long(out, i64::from(p.priority));
    put_long(
        out,
        match p.emergency_mode {
            EmergencyMode::Disabled => 0,
            EmergencyMode::Enabled => 1,
        },
    );
    put_bool(out, p.shadow_mode);
    put_u64(out, "generation", p.generation)?;
    put_u64(out, "idempotencyWindowMs", p.idempotency_window_ms)
}

fn shadow_index(v: ShadowVerdict) -> i64 {
    match v {
        ShadowVerdict::WouldAdmit => 0,
        ShadowVerdict::WouldRefuseInsufficientCapacity => 1,
        ShadowVerdict::WouldRefuseDebtOutstanding => 2,
        ShadowVerdict::WouldRefuseRequestTooLarge => 3,
    }
}

fn sizing_rule_index(v: SizingRule) -> i64 {
    match v {
        SizingRule::MaxTokens => 0,
        SizingRule::RouteDefaultMaxTokens => 1,
        SizingRule::RouteQuantile => 2,
        SizingRule::SiblingQuantile => 3,
        SizingRule::ColdCeiling => 4,
    }
}

fn refusal_index(v: RefusalReason) -> i64 {
    match v {
        RefusalReason::InsufficientCapacity => 0,
        RefusalReason::DebtOutstanding => 1,
        RefusalReason::RequestTooLarge => 2,
    }
}

// ---------------------------------------------------------------------------
// Decoding: apache-avro reads the datum, then the generic value becomes Rust.

/// Reads the frame header: (schema id, Avro datum).
pub fn split_frame(bytes: &[u8]) -> Result<(u32, &[u8]), CodecError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(CodecError::TooShort { len: bytes.len() });
    }
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: MAX_VALUE_BYTES,
        });
    }
    if bytes[0] != MAGIC_BYTE {
        return Err(CodecError::BadMagic(bytes[0]));
    }
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    Ok((id, &bytes[FRAME_HEADER_BYTES..]))
}

/// Decodes a framed value into the generic Avro value as written (under its
/// id's schema), plus its registered schema. For tools and tests; [`decode`] is
/// the typed path.
pub fn decode_value(bytes: &[u8]) -> Result<(&'static RegisteredSchema, Value), CodecError> {
    decode_value_with(registry(), bytes)
}

/// [`decode_value`] against another registry (tests of schema evolution).
pub fn decode_value_with<'r>(
    registry: &'r Registry,
    bytes: &[u8],
) -> Result<(&'r RegisteredSchema, Value), CodecError> {
    let (id, mut datum) = split_frame(bytes)?;
    let writer = registry.get(id).ok_or(CodecError::UnknownSchemaId(id))?;
    let value = apache_avro::from_avro_datum(&writer.schema, &mut datum, None)
        .map_err(|e| CodecError::Avro(e.to_string()))?;
    if !datum.is_empty() {
        return Err(CodecError::TrailingBytes(datum.len()));
    }
    Ok((writer, value))
}

/// Decodes a framed value into a log entry: by the fast reader when the value
/// is in the current layout, by [`decode_canonical`] otherwise. Both give the
/// same answer for every input (the fast reader declines anything it does not
/// recognise exactly); tests check that on every entry kind and on corruptions.
pub fn decode(bytes: &[u8]) -> Result<LogEntry, CodecError> {
    match crate::fast_decode::decode(bytes) {
        Some(entry) => Ok(entry),
        None => decode_canonical(bytes),
    }
}

/// The fast reader alone: `None` when it declines the value (for tests and
/// benchmarks; [`decode`] is what callers use).
pub fn decode_fast(bytes: &[u8]) -> Option<LogEntry> {
    crate::fast_decode::decode(bytes)
}

/// The canonical decoder: apache-avro's generic reader under the value's
/// registered schema, then typed, resolving older versions field by field.
pub fn decode_canonical(bytes: &[u8]) -> Result<LogEntry, CodecError> {
    decode_with(registry(), bytes)
}

/// Best effort: the ledger partition named at the start of an envelope, even
/// when the rest of the value does not decode (to say where a corrupt entry
/// belongs).
pub fn peek_key(bytes: &[u8]) -> Option<PartitionKey> {
    crate::fast_decode::peek_key(bytes)
}

/// [`decode`] against another registry. A value written under an older id is
/// read with that id's schema and resolved to the registry's current schema of
/// its subject: record by record, with `Event.body` branches matched by name.
/// (apache-avro's whole-value `resolve` matches union branches by shape, and
/// `Released` and `Expired`, say, have the same shape.)
pub fn decode_with(registry: &Registry, bytes: &[u8]) -> Result<LogEntry, CodecError> {
    let (writer, value) = decode_value_with(registry, bytes)?;
    let current = registry
        .current(&writer.subject)
        .ok_or(CodecError::UnknownSchemaId(writer.id))?;
    let evolved = (current.id != writer.id).then_some(current);
    match writer
        .subject
        .strip_prefix(NAMESPACE)
        .and_then(|s| s.strip_prefix('.'))
    {
        Some("Envelope") => {
            read_envelope(Fields::of(value, "Envelope")?, writer, evolved).map(LogEntry::Record)
        }
        Some("Claim") => {
            // No unions in a claim: whole-value resolution is safe.
            let value = match evolved {
                Some(current) => value
                    .resolve(&current.schema)
                    .map_err(|e| CodecError::Avro(e.to_string()))?,
                None => value,
            };
            let mut f = Fields::of(value, "Claim")?;
            Ok(LogEntry::Claim(Claim {
                writer_id: f.string("Claim.writerId")?,
                epoch: f.u64("Claim.epoch")?,
            }))
        }
        _ => Err(CodecError::NotAnEntry {
            id: writer.id,
            subject: writer.subject.clone(),
        }),
    }
}

/// The fields of one decoded Avro record, taken by name.
struct Fields(Vec<(String, Value)>);

fn shape(path: &'static str, detail: impl Into<String>) -> CodecError {
    CodecError::Shape {
        path,
        detail: detail.into(),
    }
}

impl Fields {
    fn of(value: Value, path: &'static str) -> Result<Self, CodecError> {
        match value {
            Value::Record(fields) => Ok(Fields(fields)),
            other => Err(shape(path, format!("expected a record, found {other:?}"))),
        }
    }

    /// `path` is `Record.field`; the field name is the part after the last dot.
    fn take(&mut self, path: &'static str) -> Result<Value, CodecError> {
        let name = path.rsplit('.').next().unwrap_or(path);
        let at = self
            .0
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| shape(path, "missing field"))?;
        Ok(std::mem::replace(&mut self.0[at].1, Value::Null))
    }

    fn u64(&mut self, path: &'static str) -> Result<u64, CodecError> {
        as_u64(self.take(path)?, path)
    }

    fn opt_u64(&mut self, path: &'static str) -> Result<Option<u64>, CodecError> {
        match unwrap_union(self.take(path)?) {
            Value::Null => Ok(None),
            v => as_u64(v, path).map(Some),
        }
    }

    fn string(&mut self, path: &'static str) -> Result<String, CodecError> {
        match self.take(path)? {
            Value::String(s) => Ok(s),
            other => Err(shape(path, format!("expected a string, found {other:?}"))),
        }
    }

    fn boolean(&mut self, path: &'static str) -> Result<bool, CodecError> {
        match self.take(path)? {
            Value::Boolean(b) => Ok(b),
            other => Err(shape(path, format!("expected a boolean, found {other:?}"))),
        }
    }

    fn symbol(&mut self, path: &'static str) -> Result<String, CodecError> {
        match unwrap_union(self.take(path)?) {
            Value::Enum(_, s) => Ok(s),
            other => Err(shape(path, format!("expected an enum, found {other:?}"))),
        }
    }

    fn record(&mut self, path: &'static str) -> Result<Fields, CodecError> {
        Fields::of(self.take(path)?, path)
    }

    fn reservation_id(&mut self, path: &'static str) -> Result<ReservationId, CodecError> {
        ReservationId::new(self.string(path)?).map_err(|e| invalid(path, e))
    }

    fn key(&mut self, path: &'static str) -> Result<PartitionKey, CodecError> {
        let mut k = self.record(path)?;
        PartitionKey::new(
            k.string("PartitionKey.subject")?,
            k.string("PartitionKey.route")?,
            k.string("PartitionKey.accountingEpoch")?,
            k.u64("PartitionKey.policyGeneration")?,
        )
        .map_err(|e| invalid(path, e))
    }
}

fn invalid(field: &'static str, e: impl std::fmt::Display) -> CodecError {
    CodecError::Invalid {
        field,
        reason: e.to_string(),
    }
}

fn unwrap_union(v: Value) -> Value {
    match v {
        Value::Union(_, inner) => *inner,
        other => other,
    }
}

fn as_u64(v: Value, path: &'static str) -> Result<u64, CodecError> {
    let n = match v {
        Value::Long(n) | Value::TimestampMillis(n) => n,
        Value::Int(n) => i64::from(n),
        other => return Err(shape(path, format!("expected a long, found {other:?}"))),
    };
    u64::try_from(n).map_err(|_| shape(path, format!("negative value {n}")))
}

fn read_envelope(
    mut f: Fields,
    writer: &RegisteredSchema,
    evolved: Option<&RegisteredSchema>,
) -> Result<Record, CodecError> {
    let key = f.key("Envelope.partitionKey")?;
    let writer_id = f.string("Envelope.writerId")?;
    let claim_epoch = f.u64("Envelope.claimEpoch")?;
    let items = match f.take("Envelope.events")? {
        Value::Array(items) => items,
        other => {
            return Err(shape(
                "Envelope.events",
                format!("expected an array, found {other:?}"),
            ))
        }
    };
    if items.is_empty() || items.len() > MAX_EVENTS_PER_RECORD {
        return Err(invalid(
            "Envelope.events",
            format!(
                "{} events, expected 1..={MAX_EVENTS_PER_RECORD}",
                items.len()
            ),
        ));
    }
    let key_text = partition_key_string(&key);
    let mut events = Vec::with_capacity(items.len());
    for item in items {
        let mut e = Fields::of(item, "Event")?;
        let sequence = e.u64("Event.sequence")?;
        let at_ms = e.u64("Event.atMs")?;
        let event_id = e.string("Event.eventId")?;
        // Checked without allocating: "<key>/<sequence>".
        let id_ok = event_id
            .strip_prefix(key_text.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|seq| seq.parse::<u64>() == Ok(sequence));
        if !id_ok {
            return Err(invalid(
                "Event.eventId",
                format!("{event_id:?} is not {key_text}/{sequence}"),
            ));
        }
        let body = read_body(e.take("Event.body")?, writer, evolved)?;
        events.push(Event {
            sequence,
            at_ms,
            body,
        });
    }
    Ok(Record {
        key,
        writer_id,
        claim_epoch,
        events,
    })
}

fn read_body(
    value: Value,
    writer: &RegisteredSchema,
    evolved: Option<&RegisteredSchema>,
) -> Result<EventBody, CodecError> {
    let (index, inner) = match value {
        Value::Union(i, inner) => (i, *inner),
        other => {
            return Err(shape(
                "Event.body",
                format!("expected a union, found {other:?}"),
            ))
        }
    };
    let branch = writer
        .body_branches
        .get(index as usize)
        .map(|(name, _)| name.as_str())
        .ok_or_else(|| shape("Event.body", format!("union branch {index}")))?;
    let inner = match evolved {
        None => inner,
        Some(current) => {
            let (_, schema) = current
                .body_branches
                .iter()
                .find(|(name, _)| name == branch)
                .ok_or_else(|| shape("Event.body", format!("{branch} left the union")))?;
            inner
                .resolve_schemata(schema, vec![&current.schema])
                .map_err(|e| CodecError::Avro(e.to_string()))?
        }
    };
    let mut f = Fields::of(inner, "Event.body")?;
    let body = match branch {
        "PartitionOpened" => EventBody::PartitionOpened {
            key: f.key("PartitionOpened.key")?,
            policy: read_policy(f.record("PartitionOpened.policy")?)?,
            opening_units: f.u64("PartitionOpened.openingUnits")?,
        },
        "Refilled" => EventBody::Refilled {
            minted_units: f.u64("Refilled.mintedUnits")?,
            repaid_units: f.u64("Refilled.repaidUnits")?,
            remainder: f.u64("Refilled.remainder")?,
        },
        "Reserved" => EventBody::Reserved {
            id: f.reservation_id("Reserved.id")?,
            digest: match f.take("Reserved.digest")? {
                Value::Fixed(32, bytes) => RequestDigest(
                    bytes
                        .try_into()
                        .map_err(|_| shape("Reserved.digest", "not 32 bytes"))?,
                ),
                other => {
                    return Err(shape(
                        "Reserved.digest",
                        format!("expected fixed(32), found {other:?}"),
                    ))
                }
            },
            reserved_units: f.u64("Reserved.reservedUnits")?,
            held_units: f.u64("Reserved.heldUnits")?,
            expires_at_ms: f.u64("Reserved.expiresAtMs")?,
            shadow: match unwrap_union(f.take("Reserved.shadow")?) {
                Value::Null => None,
                Value::Enum(_, s) => Some(shadow_from(&s)?),
                other => return Err(shape("Reserved.shadow", format!("{other:?}"))),
            },
            // Absent from values under older ids: resolution fills in null.
            sizing: match unwrap_union(f.take("Reserved.sizing")?) {
                Value::Null => None,
                Value::Record(fields) => Some(read_sizing(Fields(fields))?),
                other => return Err(shape("Reserved.sizing", format!("{other:?}"))),
            },
        },
        "AdmissionRefused" => EventBody::AdmissionRefused {
            id: f.reservation_id("AdmissionRefused.id")?,
            requested_units: f.u64("AdmissionRefused.requestedUnits")?,
            reason: match f.symbol("AdmissionRefused.reason")?.as_str() {
                "INSUFFICIENT_CAPACITY" => RefusalReason::InsufficientCapacity,
                "DEBT_OUTSTANDING" => RefusalReason::DebtOutstanding,
                "REQUEST_TOO_LARGE" => RefusalReason::RequestTooLarge,
                s => return Err(shape("AdmissionRefused.reason", s.to_string())),
            },
            retry_after_ms: f.opt_u64("AdmissionRefused.retryAfterMs")?,
        },
        "Started" => EventBody::Started {
            id: f.reservation_id("Started.id")?,
            operation_id: OperationId::new(f.string("Started.operationId")?)
                .map_err(|e| invalid("Started.operationId", e))?,
            execution_deadline_ms: f.u64("Started.executionDeadlineMs")?,
        },
        "Settled" => EventBody::Settled {
            id: f.reservation_id("Settled.id")?,
            actual_units: f.u64("Settled.actualUnits")?,
            refunded_units: f.u64("Settled.refundedUnits")?,
            from_available_units: f.u64("Settled.fromAvailableUnits")?,
            overdraft_units: f.u64("Settled.overdraftUnits")?,
            overdraft_limit_breached: f.boolean("Settled.overdraftLimitBreached")?,
            from_usage_unknown: f.boolean("Settled.fromUsageUnknown")?,
            usage: match unwrap_union(f.take("Settled.usage")?) {
                Value::Null => None,
                Value::Record(fields) => Some(read_usage(Fields(fields))?),
                other => return Err(shape("Settled.usage", format!("{other:?}"))),
            },
        },
        "Released" => EventBody::Released {
            id: f.reservation_id("Released.id")?,
            refunded_units: f.u64("Released.refundedUnits")?,
        },
        "ExpiryBegan" => EventBody::ExpiryBegan {
            id: f.reservation_id("ExpiryBegan.id")?,
        },
        "Expired" => EventBody::Expired {
            id: f.reservation_id("Expired.id")?,
            refunded_units: f.u64("Expired.refundedUnits")?,
        },
        "UsageUnknown" => EventBody::UsageUnknown {
            id: f.reservation_id("UsageUnknown.id")?,
        },
        "ShardIssued" => EventBody::ShardIssued {
            shard_id: ShardId::new(f.string("ShardIssued.shardId")?)
                .map_err(|e| invalid("ShardIssued.shardId", e))?,
            units: f.u64("ShardIssued.units")?,
            gateway_id: f.string("ShardIssued.gatewayId")?,
            boot_epoch: f.u64("ShardIssued.bootEpoch")?,
            expires_at_ms: f.u64("ShardIssued.expiresAtMs")?,
        },
        "ShardReminted" => EventBody::ShardReminted {
            shard_id: ShardId::new(f.string("ShardReminted.shardId")?)
                .map_err(|e| invalid("ShardReminted.shardId", e))?,
            source: f.key("ShardReminted.source")?,
            units: f.u64("ShardReminted.units")?,
        },
        "Closed" => EventBody::Closed,
        "MovedOut" => EventBody::MovedOut {
            move_id: MoveId::new(f.string("MovedOut.moveId")?)
                .map_err(|e| invalid("MovedOut.moveId", e))?,
            to: f.key("MovedOut.to")?,
            units: f.u64("MovedOut.units")?,
            debt_units: f.u64("MovedOut.debtUnits")?,
        },
        "MovedIn" => EventBody::MovedIn {
            move_id: MoveId::new(f.string("MovedIn.moveId")?)
                .map_err(|e| invalid("MovedIn.moveId", e))?,
            from: f.key("MovedIn.from")?,
            units: f.u64("MovedIn.units")?,
            debt_units: f.u64("MovedIn.debtUnits")?,
        },
        other => return Err(shape("Event.body", format!("unknown branch {other}"))),
    };
    Ok(body)
}

fn read_sizing(mut f: Fields) -> Result<Sizing, CodecError> {
    Ok(Sizing {
        units: f.u64("Sizing.units")?,
        input_units: f.u64("Sizing.inputUnits")?,
        output_units: f.u64("Sizing.outputUnits")?,
        rule: match f.symbol("Sizing.rule")?.as_str() {
            "MAX_TOKENS" => SizingRule::MaxTokens,
            "ROUTE_DEFAULT_MAX_TOKENS" => SizingRule::RouteDefaultMaxTokens,
            "ROUTE_QUANTILE" => SizingRule::RouteQuantile,
            "SIBLING_QUANTILE" => SizingRule::SiblingQuantile,
            "COLD_CEILING" => SizingRule::ColdCeiling,
            s => return Err(shape("Sizing.rule", s.to_string())),
        },
    })
}

fn read_usage(mut f: Fields) -> Result<Usage, CodecError> {
    let usage = Usage {
        model: match unwrap_union(f.take("Usage.model")?) {
            Value::Null => None,
            Value::String(s) => Some(s),
            other => return Err(shape("Usage.model", format!("{other:?}"))),
        },
        output_tokens: f.opt_u64("Usage.outputTokens")?,
        counted_input_tokens: f.opt_u64("Usage.countedInputTokens")?,
        reported_input_tokens: f.opt_u64("Usage.reportedInputTokens")?,
    };
    usage.validate().map_err(|e| invalid("Usage", e))?;
    Ok(usage)
}

fn shadow_from(s: &str) -> Result<ShadowVerdict, CodecError> {
    Ok(match s {
        "WOULD_ADMIT" => ShadowVerdict::WouldAdmit,
        "WOULD_REFUSE_INSUFFICIENT_CAPACITY" => ShadowVerdict::WouldRefuseInsufficientCapacity,
        "WOULD_REFUSE_DEBT_OUTSTANDING" => ShadowVerdict::WouldRefuseDebtOutstanding,
        "WOULD_REFUSE_REQUEST_TOO_LARGE" => ShadowVerdict::WouldRefuseRequestTooLarge,
        other => return Err(shape("ShadowVerdict", other.to_string())),
    })
}

fn read_policy(mut f: Fields) -> Result<Policy, CodecError> {
    Ok(Policy {
        subject: f.string("AdmissionBudget.subject")?,
        route: f.string("AdmissionBudget.route")?,
        region: f.string("AdmissionBudget.region")?,
        capacity_unit: match f.symbol("AdmissionBudget.capacityUnit")?.as_str() {
            "TOKENS" => CapacityUnit::Tokens,
            "REQUESTS" => CapacityUnit::Requests,
            s => return Err(shape("AdmissionBudget.capacityUnit", s.to_string())),
        },
        refill: {
            let mut r = f.record("AdmissionBudget.refill")?;
            RefillRule {
                units: r.u64("RefillRule.units")?,
                interval_ms: r.u64("RefillRule.intervalMs")?,
            }
        },
        burst_units: f.u64("AdmissionBudget.burstUnits")?,
        opening_units: f.u64("AdmissionBudget.openingUnits")?,
        estimator_digest: f.string("AdmissionBudget.estimatorDigest")?,
        max_reservation_units: f.u64("AdmissionBudget.maxReservationUnits")?,
        hold_ttl_ms: f.u64("AdmissionBudget.holdTtlMs")?,
        hard_execution_limit_ms: f.u64("AdmissionBudget.hardExecutionLimitMs")?,
        max_overdraft_units: f.u64("AdmissionBudget.maxOverdraftUnits")?,
        priority: u32::try_from(f.u64("AdmissionBudget.priority")?)
            .map_err(|e| invalid("AdmissionBudget.priority", e))?,
        emergency_mode: match f.symbol("AdmissionBudget.emergencyMode")?.as_str() {
            "DISABLED" => EmergencyMode::Disabled,
            "ENABLED" => EmergencyMode::Enabled,
            s => return Err(shape("AdmissionBudget.emergencyMode", s.to_string())),
        },
        shadow_mode: f.boolean("AdmissionBudget.shadowMode")?,
        generation: f.u64("AdmissionBudget.generation")?,
        // Filled with the schema's default for values written before it existed.
        idempotency_window_ms: f.u64("AdmissionBudget.idempotencyWindowMs")?,
    })
}
