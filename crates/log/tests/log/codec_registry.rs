//! The schema registry and evolution: the registered snapshots are what the
//! sources bundle to, ids are stable, every registered version reads and is
//! read by the next, values written under an older id still decode, and
//! fingerprints follow the spec's canonical form.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use apache_avro::schema::Schema;
use apache_avro::schema_compatibility::SchemaCompatibility;
use reservoir_log::codec;
use reservoir_log::LogEntry;
use serde_json::Value as J;

use crate::codec::{every_entry, schemas_dir};

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
