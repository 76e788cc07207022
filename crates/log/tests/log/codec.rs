//! The codec against the wire contract: round trips, the Rust types checked
//! against the `.avsc` files, keys and headers, and garbage in. The registry
//! and schema evolution are in `codec_registry`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use reservoir_core::{
    CapacityUnit, EmergencyMode, Event, RefusalReason, ReservationState, ShadowVerdict,
};
use reservoir_log::codec::{self, CodecError};
use reservoir_log::{Claim, LogEntry, Record};
use serde_json::Value as J;

use crate::fixtures::{self, every_body};

pub fn schemas_dir() -> PathBuf {
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

pub fn every_entry() -> Vec<LogEntry> {
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
