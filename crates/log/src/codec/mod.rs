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
//!
//! This file holds the contract (constants, the schema registry, canonical
//! forms, record keys and headers); `write` encodes and `read` decodes.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use apache_avro::schema::Schema;
use apache_avro::types::Value;
use reservoir_core::{
    CapacityUnit, Dimension, DimensionAmounts, DimensionLimit, EmergencyMode, EpochLength,
    EstimatorConfig, Event, EventBody, MoveId, OperationId, PartitionKey, Policy, RefillRule,
    RefusalReason, RequestDigest, ReservationId, Rollout, ShadowVerdict, ShardId, Sizing,
    SizingRule, Usage,
};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::{Claim, LogEntry, Record};

mod read;
mod write;

pub use read::{
    decode, decode_canonical, decode_fast, decode_value, decode_value_with, decode_with, peek_key,
    split_frame,
};
pub(crate) use write::Decimal;
pub use write::{encode, encode_into, encode_record_into};

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
pub const ENVELOPE_ID: u32 = 15;
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
        include_str!("../../../../schemas/PartitionKey.avsc"),
    ),
    ("Sha256", include_str!("../../../../schemas/Sha256.avsc")),
    (
        "ShadowVerdict",
        include_str!("../../../../schemas/ShadowVerdict.avsc"),
    ),
    (
        "SizingRule",
        include_str!("../../../../schemas/SizingRule.avsc"),
    ),
    ("Sizing", include_str!("../../../../schemas/Sizing.avsc")),
    ("Usage", include_str!("../../../../schemas/Usage.avsc")),
    (
        "AdmissionBudget",
        include_str!("../../../../schemas/AdmissionBudget.avsc"),
    ),
    (
        "LimitReservation",
        include_str!("../../../../schemas/LimitReservation.avsc"),
    ),
    (
        "EmergencyShard",
        include_str!("../../../../schemas/EmergencyShard.avsc"),
    ),
    (
        "PartitionOpened",
        include_str!("../../../../schemas/PartitionOpened.avsc"),
    ),
    (
        "Refilled",
        include_str!("../../../../schemas/Refilled.avsc"),
    ),
    (
        "Reserved",
        include_str!("../../../../schemas/Reserved.avsc"),
    ),
    (
        "AdmissionRefused",
        include_str!("../../../../schemas/AdmissionRefused.avsc"),
    ),
    ("Started", include_str!("../../../../schemas/Started.avsc")),
    ("Settled", include_str!("../../../../schemas/Settled.avsc")),
    (
        "Released",
        include_str!("../../../../schemas/Released.avsc"),
    ),
    (
        "ExpiryBegan",
        include_str!("../../../../schemas/ExpiryBegan.avsc"),
    ),
    ("Expired", include_str!("../../../../schemas/Expired.avsc")),
    (
        "UsageUnknown",
        include_str!("../../../../schemas/UsageUnknown.avsc"),
    ),
    (
        "ShardIssued",
        include_str!("../../../../schemas/ShardIssued.avsc"),
    ),
    (
        "ShardReminted",
        include_str!("../../../../schemas/ShardReminted.avsc"),
    ),
    ("Closed", include_str!("../../../../schemas/Closed.avsc")),
    (
        "MovedOut",
        include_str!("../../../../schemas/MovedOut.avsc"),
    ),
    ("MovedIn", include_str!("../../../../schemas/MovedIn.avsc")),
    ("Event", include_str!("../../../../schemas/Event.avsc")),
    (
        "Envelope",
        include_str!("../../../../schemas/Envelope.avsc"),
    ),
    ("Claim", include_str!("../../../../schemas/Claim.avsc")),
];

/// `schemas/registry.json`: schema id → subject, source file, registered schema.
pub const REGISTRY_JSON: &str = include_str!("../../../../schemas/registry.json");

/// Every registered schema, self-contained (named types inlined), by id. Ids are
/// never reused and snapshots never change: a value written under any of them
/// stays decodable. A new version adds a line here and in `registry.json`.
pub const REGISTERED_SCHEMAS: &[(u32, &str)] = &[
    (
        1,
        include_str!("../../../../schemas/registered/1-Envelope.avsc"),
    ),
    (
        2,
        include_str!("../../../../schemas/registered/2-Claim.avsc"),
    ),
    (
        3,
        include_str!("../../../../schemas/registered/3-AdmissionBudget.avsc"),
    ),
    (
        4,
        include_str!("../../../../schemas/registered/4-LimitReservation.avsc"),
    ),
    (
        5,
        include_str!("../../../../schemas/registered/5-EmergencyShard.avsc"),
    ),
    // Envelope v2: Settled.usage and Reserved.sizing (optional, default null).
    (
        6,
        include_str!("../../../../schemas/registered/6-Envelope.avsc"),
    ),
    // AdmissionBudget v2 and Envelope v3: AdmissionBudget.idempotencyWindowMs
    // (default 600000, so every older value reads with 10 minutes).
    (
        7,
        include_str!("../../../../schemas/registered/7-AdmissionBudget.avsc"),
    ),
    (
        8,
        include_str!("../../../../schemas/registered/8-Envelope.avsc"),
    ),
    (
        9,
        include_str!("../../../../schemas/registered/9-AdmissionBudget.avsc"),
    ),
    (
        10,
        include_str!("../../../../schemas/registered/10-Envelope.avsc"),
    ),
    // AdmissionBudget v4 and Envelope v5: AdmissionBudget.estimator (the
    // sizing settings, default null) and epochLength (default "none").
    (
        11,
        include_str!("../../../../schemas/registered/11-AdmissionBudget.avsc"),
    ),
    (
        12,
        include_str!("../../../../schemas/registered/12-Envelope.avsc"),
    ),
    // AdmissionBudget v5 and Envelope v6: AdmissionBudget.rollout (staged
    // rollout, default null) and Reserved.shadowDimension (default null).
    (
        13,
        include_str!("../../../../schemas/registered/13-AdmissionBudget.avsc"),
    ),
    (
        14,
        include_str!("../../../../schemas/registered/14-Envelope.avsc"),
    ),
    // Envelope v7: signed shards and recorded reconciles:
    // ShardIssued.fenceEpoch/signature and ShardReminted.issuedUnits/
    // spentUnits/unknownUnits/excessUnits (defaults 0 and ""), so every
    // older value decodes as an unsigned shard and an unrecorded spend.
    (
        15,
        include_str!("../../../../schemas/registered/15-Envelope.avsc"),
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
