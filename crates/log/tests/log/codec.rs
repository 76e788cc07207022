//! The codec against the wire contract: round trips, the Rust types checked
//! against the `.avsc` files, the registry and schema evolution, and garbage in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use apache_avro::schema::Schema;
use apache_avro::schema_compatibility::SchemaCompatibility;
use reservoir_core::{
    CapacityUnit, EmergencyMode, Event, RefusalReason, ReservationState, ShadowVerdict,
};
use reservoir_log::codec::{self, CodecError};
use reservoir_log::{Claim, LogEntry, Record};
use serde_json::Value as J;

use crate::fixtures::{self, every_body};

fn schemas_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas")
}

fn one_event_record(body: reservoir_core::EventBody, sequence: u64) -> Record {
    Record {
        key: fixtures::key("tenant-7"),
        writer_id: "node-a:boot-1".to_string(),
        claim_epoch: 3,
        events: vec![Event {
            further: Vec::new(),
            sequence,
            at_ms: 1_784_469_600_000 + sequence,
            body,
        }],
    }
}

fn every_entry() -> Vec<LogEntry> {
    let mut entries: Vec<LogEntry> = every_body()
        .into_iter()
        .enumerate()
        .map(|(i, body)| LogEntry::Record(one_event_record(body, i as u64 + 1)))
        .collect();
    // Every body in one record too: a command's events travel together.
    entries.push(LogEntry::Record(Record {
        events: every_body()
            .into_iter()
            .enumerate()
            .map(|(i, body)| Event {
                further: Vec::new(),
                sequence: i as u64 + 1,
                at_ms: 7,
                body,
            })
            .collect(),
        ..one_event_record(reservoir_core::EventBody::Closed, 1)
    }));
    // A three-dimension partition's history: every kind of further amounts.
    entries.push(LogEntry::Record(Record {
        events: fixtures::three_dimension_events(),
        ..one_event_record(reservoir_core::EventBody::Closed, 1)
    }));
    // Generations of one digit and of the most digits a generation has: the
    // fast reader checks each event id against its key digit by digit.
    for generation in [0, reservoir_core::policy::MAX_GENERATION] {
        let mut record = one_event_record(reservoir_core::EventBody::Closed, 9);
        record.key =
            reservoir_core::PartitionKey::new("tenant-7", "chat.generate", "2026-07", generation)
                .unwrap();
        entries.push(LogEntry::Record(record));
    }
    entries.push(fixtures::claim("node-a:boot-1", 1));
    entries.push(fixtures::claim("node-b:boot-9", i64::MAX as u64));
    entries
}

#[test]
fn every_entry_round_trips() {
    for entry in every_entry() {
        let bytes = codec::encode(&entry).unwrap();
        assert_eq!(bytes[0], 0, "magic byte");
        let id = u32::from_be_bytes(bytes[1..5].try_into().unwrap());
        assert_eq!(id, codec::schema_id(&entry));
        assert_eq!(codec::decode(&bytes).unwrap(), entry);
        assert_eq!(codec::decode_canonical(&bytes).unwrap(), entry);
        assert_eq!(codec::decode_fast(&bytes), Some(entry), "fast reader");
    }
}

/// The hand-written encoder and apache-avro agree byte for byte: apache-avro
/// reads our bytes with the registered schema, validates the value against it and
/// writes the very same datum back.
#[test]
fn encoder_bytes_are_what_apache_avro_writes() {
    for entry in every_entry() {
        let bytes = codec::encode(&entry).unwrap();
        let (writer, value) = codec::decode_value(&bytes).unwrap();
        assert_eq!(
            codec::registry().current(&writer.subject).unwrap().id,
            writer.id
        );
        let datum = apache_avro::to_avro_datum(&writer.schema, value).unwrap();
        assert_eq!(
            datum,
            &bytes[codec::FRAME_HEADER_BYTES..],
            "{}",
            writer.subject
        );
    }
}

#[test]
fn every_event_type_has_a_schema_and_a_union_branch_in_order() {
    let bodies: Vec<&str> = every_body().iter().map(|b| b.type_name()).collect();
    let distinct: BTreeSet<&str> = bodies.iter().copied().collect();
    assert_eq!(
        distinct,
        codec::EVENT_BODY_BRANCHES.iter().copied().collect()
    );
    let event: J = serde_json::from_str(source("Event")).unwrap();
    let union: Vec<&str> = field(&event, "body")["type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(union, codec::EVENT_BODY_BRANCHES);
    let registered: Vec<&str> = codec::registry()
        .get(codec::ENVELOPE_ID)
        .unwrap()
        .body_branches
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(registered, codec::EVENT_BODY_BRANCHES);
    for name in codec::EVENT_BODY_BRANCHES {
        assert!(
            codec::SCHEMA_SOURCES.iter().any(|(n, _)| *n == name),
            "{name}.avsc is not embedded"
        );
    }
}

#[test]
fn every_avsc_file_is_embedded_and_reachable_from_a_registered_subject() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(schemas_dir())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".avsc").map(str::to_string))
        .collect();
    let embedded: BTreeSet<String> = codec::SCHEMA_SOURCES
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(on_disk, embedded);
    for (name, text) in codec::SCHEMA_SOURCES {
        let file: J = serde_json::from_str(text).unwrap();
        assert_eq!(file["name"], *name, "{name}.avsc defines another name");
        assert_eq!(file["namespace"], codec::NAMESPACE, "{name}.avsc namespace");
    }
    let mut reachable = BTreeSet::new();
    for s in codec::registry().schemas.values() {
        collect_names(
            &codec::bundle_schema(s.source.trim_end_matches(".avsc")).unwrap(),
            &mut reachable,
        );
    }
    for name in &embedded {
        assert!(
            reachable.contains(name),
            "{name}.avsc is in no registered subject, so no compatibility check covers it"
        );
    }
}

/// Every record, enum and field is documented (meaning and unit).
#[test]
fn every_schema_field_is_documented() {
    for (name, text) in codec::SCHEMA_SOURCES {
        let file: J = serde_json::from_str(text).unwrap();
        let mut missing = Vec::new();
        walk_docs(&file, name, &mut missing);
        assert!(missing.is_empty(), "undocumented: {missing:?}");
    }
}

fn walk_docs(node: &J, at: &str, missing: &mut Vec<String>) {
    match node {
        J::Object(map) => {
            let named = matches!(
                map.get("type").and_then(J::as_str),
                Some("record" | "enum" | "fixed")
            );
            let is_field = map.contains_key("name") && !named;
            if (named || is_field)
                && map
                    .get("doc")
                    .and_then(J::as_str)
                    .is_none_or(|d| d.trim().is_empty())
            {
                missing.push(format!("{at}.{}", map["name"]));
            }
            for v in map.values() {
                walk_docs(v, at, missing);
            }
        }
        J::Array(items) => items.iter().for_each(|v| walk_docs(v, at, missing)),
        _ => {}
    }
}

// --- Rust types against the .avsc files -------------------------------------

fn source(name: &str) -> &'static str {
    codec::SCHEMA_SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .unwrap()
}

/// Every named type defined anywhere in the sources, by short name.
fn definitions() -> BTreeMap<String, J> {
    fn walk(node: &J, out: &mut BTreeMap<String, J>) {
        match node {
            J::Object(map) => {
                if matches!(
                    map.get("type").and_then(J::as_str),
                    Some("record" | "enum" | "fixed")
                ) {
                    out.insert(map["name"].as_str().unwrap().to_string(), node.clone());
                }
                map.values().for_each(|v| walk(v, out));
            }
            J::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    for (_, text) in codec::SCHEMA_SOURCES {
        walk(&serde_json::from_str(text).unwrap(), &mut out);
    }
    out
}

fn collect_names(node: &J, out: &mut BTreeSet<String>) {
    match node {
        J::Object(map) => {
            if matches!(
                map.get("type").and_then(J::as_str),
                Some("record" | "enum" | "fixed")
            ) {
                out.insert(map["name"].as_str().unwrap().to_string());
            }
            map.values().for_each(|v| collect_names(v, out));
        }
        J::Array(items) => items.iter().for_each(|v| collect_names(v, out)),
        _ => {}
    }
}

fn field<'a>(record: &'a J, name: &str) -> &'a J {
    record["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no field {name}"))
}

fn avro_fields(record: &str) -> BTreeSet<String> {
    let defs = definitions();
    let def = defs
        .get(record)
        .unwrap_or_else(|| panic!("no schema {record}"));
    def["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

pub(crate) fn camel(snake: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Field names the Rust type serializes (serde), in the Avro spelling.
fn serde_fields(value: &J) -> BTreeSet<String> {
    value
        .as_object()
        .map(|m| m.keys().map(|k| camel(k)).collect())
        .unwrap_or_default()
}

#[test]
fn event_bodies_have_exactly_the_fields_of_their_schema() {
    for body in every_body() {
        let json = serde_json::to_value(&body).unwrap();
        let fields = match &json {
            J::String(_) => BTreeSet::new(), // unit variant: Closed
            J::Object(m) => serde_fields(m.values().next().unwrap()),
            other => panic!("unexpected serde shape {other}"),
        };
        assert_eq!(
            fields,
            avro_fields(body.type_name()),
            "{}",
            body.type_name()
        );
    }
}

#[test]
fn records_the_seeds_name_match_their_rust_types() {
    // With every optional part set, so serde writes every field.
    let policy = fixtures::every_part_policy(31);
    let json = serde_json::to_value(&policy).unwrap();
    assert_eq!(serde_fields(&json), avro_fields("AdmissionBudget"));
    assert_eq!(
        serde_fields(&json["dimensions"][0]),
        avro_fields("DimensionLimit")
    );
    assert_eq!(serde_fields(&json["refill"]), avro_fields("RefillRule"));

    let reservation = reservoir_core::Reservation {
        further: Vec::new(),
        id: reservoir_core::ReservationId::new("rl-01").unwrap(),
        digest: reservoir_core::RequestDigest([1; 32]),
        reserved_units: 1,
        held_units: 1,
        actual_units: None,
        overdraft_units: 0,
        operation_id: None,
        state: ReservationState::Reserved,
        reserved_at_ms: 0,
        expires_at_ms: 0,
        started_at_ms: None,
        execution_deadline_ms: None,
        finished_at_ms: None,
        shadow: None,
        // Kept from the Reserved event for receipts; not a limitReservation.v1
        // field, and omitted from the record when absent (as here).
        sizing: None,
        shadow_dimension: None,
    };
    assert_eq!(
        serde_fields(&serde_json::to_value(&reservation).unwrap()),
        avro_fields("LimitReservation")
    );

    // emergencyShard.v1 carries the shard's local books (core ShardLedger) and
    // what ShardIssued says about it.
    let books =
        serde_fields(&serde_json::to_value(reservoir_core::ShardLedger::default()).unwrap());
    let shard = avro_fields("EmergencyShard");
    assert!(books.is_subset(&shard), "{books:?} not in {shard:?}");
    for f in ["shardId", "gatewayId", "bootEpoch", "expiresAtMs"] {
        assert!(shard.contains(f), "EmergencyShard lacks {f}");
    }

    let key = serde_json::to_value(fixtures::key("t")).unwrap();
    assert_eq!(serde_fields(&key), avro_fields("PartitionKey"));
    let event = Event {
        further: vec![reservoir_core::DimensionAmounts::Refunded { refunded_units: 1 }],
        ..Event::new(1, 1, reservoir_core::EventBody::Closed)
    };
    let mut event_fields = serde_fields(&serde_json::to_value(&event).unwrap());
    event_fields.insert("eventId".into()); // derived: "<key>/<sequence>"
    assert_eq!(event_fields, avro_fields("Event"));

    // Log types (no serde): named by hand, so a new field fails here.
    let Record {
        key: _,
        writer_id: _,
        claim_epoch: _,
        events: _,
    } = fixtures::record("t", "w", 1, 1, 1);
    assert_eq!(
        avro_fields("Envelope"),
        ["partitionKey", "writerId", "claimEpoch", "events"]
            .map(String::from)
            .into()
    );
    let Claim {
        writer_id: _,
        epoch: _,
    } = Claim {
        writer_id: String::new(),
        epoch: 0,
    };
    assert_eq!(
        avro_fields("Claim"),
        ["writerId", "epoch"].map(String::from).into()
    );
}

#[test]
fn enum_symbols_match_rust_enums() {
    fn symbols(name: &str) -> Vec<String> {
        definitions()[name]["symbols"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    }
    fn serde_upper<T: serde::Serialize>(values: &[T]) -> Vec<String> {
        values
            .iter()
            .map(|v| {
                serde_json::to_value(v)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_uppercase()
            })
            .collect()
    }
    use ShadowVerdict::*;
    let shadow = [
        WouldAdmit,
        WouldRefuseInsufficientCapacity,
        WouldRefuseDebtOutstanding,
        WouldRefuseRequestTooLarge,
    ];
    assert_eq!(symbols("ShadowVerdict"), serde_upper(&shadow));
    let refusal = [
        RefusalReason::InsufficientCapacity,
        RefusalReason::DebtOutstanding,
        RefusalReason::RequestTooLarge,
    ];
    assert_eq!(symbols("RefusalReason"), serde_upper(&refusal));
    assert_eq!(
        symbols("CapacityUnit"),
        serde_upper(&[CapacityUnit::Tokens, CapacityUnit::Requests])
    );
    assert_eq!(
        symbols("EmergencyMode"),
        serde_upper(&[EmergencyMode::Disabled, EmergencyMode::Enabled])
    );
    assert_eq!(
        symbols("ReservationState"),
        serde_upper(&ReservationState::ALL)
    );
    use reservoir_core::SizingRule as R;
    assert_eq!(
        symbols("SizingRule"),
        serde_upper(&[
            R::MaxTokens,
            R::RouteDefaultMaxTokens,
            R::RouteQuantile,
            R::SiblingQuantile,
            R::ColdCeiling
        ])
    );
}

// --- Registry and evolution ---------------------------------------------------

/// The snapshot registered under each subject's current id is exactly what the
/// sources bundle to. Change a `.avsc` and this fails until the change is
/// registered: run with `RESERVOIR_REGISTER_SCHEMAS=1` to write the new snapshot
/// and id (then add the snapshot to `codec::REGISTERED_SCHEMAS`).
#[test]
fn registered_snapshots_match_the_sources() {
    let registry = codec::registry();
    let mut stale = Vec::new();
    for (subject, id) in &registry.current {
        let current = &registry.schemas[id];
        let bundled = codec::bundle_schema(current.source.trim_end_matches(".avsc")).unwrap();
        let snapshot: J = serde_json::from_str(
            codec::REGISTERED_SCHEMAS
                .iter()
                .find(|(i, _)| i == id)
                .map(|(_, t)| *t)
                .unwrap(),
        )
        .unwrap();
        if bundled != snapshot {
            stale.push((subject.clone(), current.source.clone(), bundled));
        }
    }
    if !stale.is_empty() && std::env::var_os("RESERVOIR_REGISTER_SCHEMAS").is_some() {
        register(&stale);
    }
    let names: Vec<_> = stale.iter().map(|(s, _, _)| s.as_str()).collect();
    assert!(
        names.is_empty(),
        "schemas changed without a new registered id: {names:?} (see schemas/README.md)"
    );
}

fn register(stale: &[(String, String, J)]) {
    let path = schemas_dir().join("registry.json");
    let mut file: J = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let lines = file["schemas"].as_array_mut().unwrap();
    let first_id = lines
        .iter()
        .map(|l| l["id"].as_u64().unwrap())
        .max()
        .unwrap_or(0)
        + 1;
    for (i, (subject, source, bundled)) in stale.iter().enumerate() {
        let next = first_id + i as u64;
        let short = source.trim_end_matches(".avsc");
        let snapshot = format!("registered/{next}-{short}.avsc");
        std::fs::write(
            schemas_dir().join(&snapshot),
            serde_json::to_string_pretty(bundled).unwrap() + "\n",
        )
        .unwrap();
        lines.push(serde_json::json!({"id": next, "subject": subject, "source": source, "schema": snapshot}));
        eprintln!("registered {subject} as id {next}: add ({next}, include_str!(\"../../../schemas/{snapshot}\")) to codec::REGISTERED_SCHEMAS");
    }
    std::fs::write(&path, serde_json::to_string_pretty(&file).unwrap() + "\n").unwrap();
}

#[test]
fn registry_is_complete_and_ids_are_stable() {
    let registry = codec::registry();
    let ids: Vec<u32> = registry.schemas.keys().copied().collect();
    let embedded: Vec<u32> = codec::REGISTERED_SCHEMAS
        .iter()
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        ids, embedded,
        "every registered id has its snapshot embedded, and nothing else"
    );
    assert_eq!(
        registry.current("io.reservoir.v1.Envelope").unwrap().id,
        codec::ENVELOPE_ID
    );
    assert_eq!(
        registry.current("io.reservoir.v1.Claim").unwrap().id,
        codec::CLAIM_ID
    );
    for s in registry.schemas.values() {
        assert!(schemas_dir().join(&s.path).is_file(), "{} missing", s.path);
        assert_eq!(
            s.schema.name().map(|n| n.fullname(None)),
            Some(s.subject.clone())
        );
        assert!(s.fingerprint.starts_with("sha256:") && s.fingerprint.len() == 7 + 64);
    }
}

fn can_read_both_ways(old: &Schema, new: &Schema, what: &str) {
    SchemaCompatibility::can_read(old, new)
        .unwrap_or_else(|e| panic!("{what}: new readers cannot read old data: {e}"));
    SchemaCompatibility::can_read(new, old)
        .unwrap_or_else(|e| panic!("{what}: old readers cannot read new data: {e}"));
}

/// FULL_TRANSITIVE: every registered version of a subject, and the sources as
/// they are now, can read each other's data. Works in a fresh clone (the
/// history lives in `schemas/registered/`).
#[test]
fn every_registered_version_is_compatible_both_ways() {
    let registry = codec::registry();
    for (subject, current_id) in &registry.current {
        let current = &registry.schemas[current_id];
        let bundled = codec::bundle_schema(current.source.trim_end_matches(".avsc")).unwrap();
        let now = Schema::parse(&bundled).unwrap();
        for old in registry.schemas.values().filter(|s| &s.subject == subject) {
            can_read_both_ways(
                &old.schema,
                &now,
                &format!("{subject} id {} vs sources", old.id),
            );
        }
    }
}

/// Each `.avsc` against its own last committed version (git `HEAD`), so an
/// incompatible edit fails before it is committed. Skipped where git or the
/// history is unavailable; the registered snapshots above cover CI.
#[test]
fn every_avsc_is_compatible_with_its_committed_version() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(schemas_dir())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let Some(listing) = git(&["ls-tree", "--name-only", "HEAD", "./"]) else {
        eprintln!("no git history: skipped");
        return;
    };
    let mut old_sources = BTreeMap::new();
    for file in listing.lines().filter(|f| f.ends_with(".avsc")) {
        let name = Path::new(file)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if let Some(text) = git(&["show", &format!("HEAD:./{name}.avsc")]) {
            old_sources.insert(name, serde_json::from_str::<J>(&text).unwrap());
        }
    }
    for name in old_sources.keys() {
        let Ok(old) = codec::bundle_schema_from(name, &old_sources) else {
            continue;
        };
        let new =
            codec::bundle_schema(name).unwrap_or_else(|e| panic!("{name}.avsc was removed: {e}"));
        if old == new {
            continue;
        }
        let (old, new) = (Schema::parse(&old).unwrap(), Schema::parse(&new).unwrap());
        can_read_both_ways(&old, &new, &format!("{name}.avsc vs HEAD"));
    }
}

/// A value written under an older id decodes through schema resolution once a
/// newer version is current: here a v2 Envelope whose `Released` gained a field
/// with a default. (Whole-value resolution in apache-avro would turn `Expired`
/// into `Released`, which has the same shape; the codec matches by name.)
#[test]
fn values_under_an_older_id_decode_after_an_evolution() {
    let mut v2 = codec::bundle_schema("Envelope").unwrap();
    fn add_field(node: &mut J) -> bool {
        match node {
            J::Object(map)
                if map.get("name") == Some(&J::from("Released")) && map.contains_key("fields") =>
            {
                map["fields"].as_array_mut().unwrap().push(serde_json::json!(
                    {"name": "reasonCode", "type": "string", "default": "unknown", "doc": "test"}
                ));
                true
            }
            J::Object(map) => map.values_mut().any(add_field),
            J::Array(items) => items.iter_mut().any(add_field),
            _ => false,
        }
    }
    assert!(add_field(&mut v2));
    let v2_json = v2.clone();
    let v2 = Schema::parse(&v2).unwrap();
    let old = &codec::registry().get(codec::ENVELOPE_ID).unwrap().schema;
    can_read_both_ways(old, &v2, "Envelope v1 vs v2");

    let mut registry = codec::load_registry().unwrap();
    registry
        .insert(99, "io.reservoir.v1.Envelope", &v2_json)
        .unwrap();
    assert_eq!(registry.current("io.reservoir.v1.Envelope").unwrap().id, 99);
    for entry in every_entry() {
        let bytes = codec::encode(&entry).unwrap(); // written under id 1 or 2
        assert_eq!(codec::decode_with(&registry, &bytes).unwrap(), entry);
    }
}

/// Records written under Envelope id 1 (before `Settled.usage`,
/// `Reserved.sizing` and `AdmissionBudget.idempotencyWindowMs` existed) still
/// decode, with the first two `None` and the window at its default: the bytes
/// are produced by apache-avro under the registered id-1 schema, from the
/// current value with the new fields taken out.
#[test]
fn id_1_values_decode_with_usage_and_sizing_none() {
    fn strip(v: apache_avro::types::Value) -> apache_avro::types::Value {
        use apache_avro::types::Value as V;
        match v {
            V::Record(fields) => V::Record(
                fields
                    .into_iter()
                    .filter(|(n, _)| {
                        ![
                            "usage",
                            "sizing",
                            "idempotencyWindowMs",
                            "further",
                            "dimension",
                            "dimensions",
                            "excludeCacheReadInputTokens",
                            "estimator",
                            "epochLength",
                            "rollout",
                            "shadowDimension",
                            "fenceEpoch",
                            "signature",
                            "issuedUnits",
                            "spentUnits",
                            "unknownUnits",
                            "excessUnits",
                        ]
                        .contains(&n.as_str())
                    })
                    .map(|(n, v)| (n, strip(v)))
                    .collect(),
            ),
            V::Union(i, inner) => V::Union(i, Box::new(strip(*inner))),
            V::Array(items) => V::Array(items.into_iter().map(strip).collect()),
            other => other,
        }
    }
    let v1 = &codec::registry().get(1).unwrap().schema;
    let mut with_new_fields = 0;
    for entry in every_entry() {
        let LogEntry::Record(record) = &entry else {
            continue;
        };
        let bytes = codec::encode(&entry).unwrap();
        let (_, value) = codec::decode_value(&bytes).unwrap();
        let mut old = vec![0, 0, 0, 0, 1];
        old.extend(apache_avro::to_avro_datum(v1, strip(value)).unwrap());
        let mut expected = record.clone();
        for e in &mut expected.events {
            with_new_fields += usize::from(!e.further.is_empty());
            e.further.clear();
            match &mut e.body {
                reservoir_core::EventBody::AdmissionRefused { dimension, .. } => {
                    with_new_fields += usize::from(dimension.take().is_some())
                }
                reservoir_core::EventBody::Settled { usage, .. } => {
                    with_new_fields += usize::from(usage.take().is_some())
                }
                reservoir_core::EventBody::Reserved {
                    sizing,
                    shadow_dimension,
                    ..
                } => {
                    with_new_fields += usize::from(sizing.take().is_some());
                    with_new_fields += usize::from(shadow_dimension.take().is_some());
                }
                // Shards written before they were signed: no fence, no
                // signature, and reconciles that recorded no spend.
                reservoir_core::EventBody::ShardIssued {
                    fence_epoch,
                    signature,
                    ..
                } => {
                    with_new_fields += usize::from(!signature.is_empty());
                    *fence_epoch = 0;
                    signature.clear();
                }
                reservoir_core::EventBody::ShardReminted {
                    issued_units,
                    spent_units,
                    unknown_units,
                    excess_units,
                    ..
                } => {
                    with_new_fields += usize::from(*issued_units > 0);
                    (*issued_units, *spent_units, *unknown_units, *excess_units) = (0, 0, 0, 0);
                }
                reservoir_core::EventBody::PartitionOpened { policy, .. } => {
                    let default = reservoir_core::retention::DEFAULT_IDEMPOTENCY_WINDOW_MS;
                    with_new_fields += usize::from(policy.idempotency_window_ms != default);
                    policy.idempotency_window_ms = default;
                    policy.dimensions.clear();
                    policy.exclude_cache_read_input_tokens = false;
                    policy.estimator = None;
                    policy.epoch_length = reservoir_core::EpochLength::None;
                    policy.rollout = None;
                }
                _ => {}
            }
        }
        assert_eq!(codec::decode(&old).unwrap(), LogEntry::Record(expected));
    }
    assert!(with_new_fields > 0, "the fixtures exercise the new fields");
}

/// The fingerprint header is what a spec-following client computes from the
/// registered `.avsc`: the expected values below come from fastavro 1.13
/// (`to_parsing_canonical_form`, sha256), and are recomputed with it when
/// python3 has fastavro installed.
#[test]
fn fingerprints_follow_the_spec_canonical_form() {
    let expected = [
        (
            1,
            "f85ab29d7138fc5e7f010353c47c3d7c975f9737257f1672fbde7f9395bfe36b",
        ),
        (
            2,
            "798bfe1beade439c55000efac8f7d9094276e8b7b6cd3af0d39612c8f7eb2f68",
        ),
        (
            3,
            "ddce8ce2d51bf2691db5d2e621a65e999c41406c92dcac5f20b7c84e52e4f952",
        ),
        (
            4,
            "412963ea62b463a0557744138871d0d81ef53859e896b1cdcf1953bbf2fc6c07",
        ),
        (
            5,
            "ad222f407fb17f1f002f976ff8f15161b181a4435dadb72469c58ca169654594",
        ),
        (
            6,
            "07b82f162f1b2c68a3a3ab8fa4f6de5a5a9f41bf3a72ba4843e7caab167b08c2",
        ),
    ];
    for (id, hex) in expected {
        assert_eq!(
            codec::registry().get(id).unwrap().fingerprint,
            format!("sha256:{hex}"),
            "id {id}"
        );
    }
    // Logical types reduce to their primitive; names become full names.
    let json = serde_json::json!({"type": "record", "name": "R", "namespace": "a.b", "doc": "x", "fields": [
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}, "doc": "y"},
        {"name": "o", "type": ["null", "R"], "default": null}
    ]});
    assert_eq!(
        codec::parsing_canonical_form(&json).unwrap(),
        r#"{"name":"a.b.R","type":"record","fields":[{"name":"t","type":"long"},{"name":"o","type":["null","a.b.R"]}]}"#
    );
    // Where apache-avro is right (no logical types), both agree.
    let claim = codec::registry().get(codec::CLAIM_ID).unwrap();
    let claim_json: J = serde_json::from_str(codec::REGISTERED_SCHEMAS[1].1).unwrap();
    assert_eq!(
        codec::parsing_canonical_form(&claim_json).unwrap(),
        claim.schema.canonical_form()
    );

    let script = r#"
import json, sys, hashlib
from fastavro.schema import to_parsing_canonical_form
for path in sys.argv[1:]:
    print("sha256:" + hashlib.sha256(to_parsing_canonical_form(json.load(open(path))).encode()).hexdigest())
"#;
    let paths: Vec<PathBuf> = codec::registry()
        .schemas
        .values()
        .map(|s| schemas_dir().join(&s.path))
        .collect();
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(&paths)
        .output();
    match output {
        Ok(o) if o.status.success() => {
            let theirs: Vec<String> = String::from_utf8(o.stdout)
                .unwrap()
                .lines()
                .map(String::from)
                .collect();
            let ours: Vec<String> = codec::registry()
                .schemas
                .values()
                .map(|s| s.fingerprint.clone())
                .collect();
            assert_eq!(ours, theirs, "fastavro computes the same fingerprints");
        }
        _ => eprintln!("python3 with fastavro not available: live cross-check skipped"),
    }
}

// --- Keys and headers ------------------------------------------------------------

#[test]
fn keys_and_headers() {
    let record = fixtures::record("tenant-7", "node-a", 2, 5, 2);
    let entry = LogEntry::Record(record);
    assert_eq!(
        codec::record_key(&entry),
        "tenant-7|chat.generate|2026-07-19T14:00Z|g31"
    );
    assert_eq!(
        codec::event_id(&fixtures::key("tenant-7"), 5),
        "tenant-7|chat.generate|2026-07-19T14:00Z|g31/5"
    );
    let headers: BTreeMap<_, _> = codec::headers(&entry).into_iter().collect();
    assert_eq!(headers[codec::HEADER_ENTRY_KIND], "record");
    assert_eq!(headers[codec::HEADER_EVENT_TYPES], "Reserved,Released");
    assert_eq!(
        headers[codec::HEADER_SCHEMA_ID],
        codec::ENVELOPE_ID.to_string()
    );
    assert_eq!(
        headers[codec::HEADER_SCHEMA_FINGERPRINT],
        codec::registry()
            .get(codec::ENVELOPE_ID)
            .unwrap()
            .fingerprint
    );

    let claim = fixtures::claim("node-a", 4);
    assert_eq!(codec::record_key(&claim), "!claim|node-a");
    let headers: BTreeMap<_, _> = codec::headers(&claim).into_iter().collect();
    assert_eq!(headers[codec::HEADER_ENTRY_KIND], "claim");
    assert_eq!(headers[codec::HEADER_SCHEMA_ID], "2");
}

// --- Errors ------------------------------------------------------------------------

#[test]
fn encode_refuses_what_the_schema_cannot_hold() {
    let mut record = fixtures::record("t", "w", 1, 1, 1);
    record.claim_epoch = u64::MAX;
    assert_eq!(
        codec::encode(&LogEntry::Record(record)),
        Err(CodecError::OutOfRange {
            field: "claimEpoch",
            value: u64::MAX
        })
    );
    let empty = Record {
        events: vec![],
        ..fixtures::record("t", "w", 1, 1, 1)
    };
    assert!(matches!(
        codec::encode(&LogEntry::Record(empty)),
        Err(CodecError::Invalid {
            field: "events",
            ..
        })
    ));
}

#[test]
fn decode_errors_are_typed() {
    let good = codec::encode(&fixtures::claim("w", 1)).unwrap();
    assert_eq!(codec::decode(&[]), Err(CodecError::TooShort { len: 0 }));
    assert_eq!(
        codec::decode(&[1, 0, 0, 0, 2, 2]),
        Err(CodecError::BadMagic(1))
    );
    assert_eq!(
        codec::decode(&[0, 0, 0, 0, 99, 2]),
        Err(CodecError::UnknownSchemaId(99))
    );
    assert!(matches!(
        codec::decode(&[0, 0, 0, 0, 3, 2]),
        Err(CodecError::NotAnEntry { id: 3, .. }) | Err(CodecError::Avro(_))
    ));
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(codec::decode(&trailing), Err(CodecError::TrailingBytes(1)));
    assert!(matches!(
        codec::decode(&good[..good.len() - 1]),
        Err(CodecError::Avro(_))
    ));
    let huge = vec![0u8; codec::MAX_VALUE_BYTES + 1];
    assert!(matches!(
        codec::decode(&huge),
        Err(CodecError::TooLarge { .. })
    ));
}

/// Random bytes, every truncation and single-byte corruption of valid values:
/// decoding returns `Ok` or a `CodecError`, never panics or aborts, and the
/// fast reader never answers differently from the canonical decoder.
#[test]
fn garbage_never_panics() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let valid: Vec<Vec<u8>> = every_entry()
        .iter()
        .map(|e| codec::encode(e).unwrap())
        .collect();
    let mut tried = 0usize;
    for bytes in &valid {
        for len in 0..bytes.len() {
            same_answer(&bytes[..len]);
            tried += 1;
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= (next() as u8) | 1;
            same_answer(&b);
            // Keep the frame valid so the corruption reaches the Avro datum.
            let mut b = bytes.clone();
            b[i.max(codec::FRAME_HEADER_BYTES)] = next() as u8;
            same_answer(&b);
            tried += 2;
        }
    }
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if b.len() >= 5 && next() % 4 != 0 {
            b[..5].copy_from_slice(&[0, 0, 0, 0, 1 + (next() % 2) as u8]);
        }
        same_answer(&b);
        tried += 1;
    }
    assert!(tried > 20_000);
}

/// Decodes `bytes` both ways: the answers must be the same.
fn same_answer(bytes: &[u8]) {
    let canonical = codec::decode_canonical(bytes);
    assert_eq!(codec::decode(bytes), canonical, "{bytes:?}");
    if let Some(fast) = codec::decode_fast(bytes) {
        assert_eq!(Ok(fast), canonical, "{bytes:?}");
    }
}
