//! The OpenAPI document (`GET /openapi.json`): each router's part merged,
//! the scopes declared ([`crate::auth::openapi`]), then what the server
//! enforces that the derived parts do not say, added here in one place so a
//! client generated from the document sends what the server accepts:
//!
//! - every identifier (path parameters `id`, `subject`, `route`, `tenant`, and
//!   the same names in request bodies) carries core's rule,
//!   `[A-Za-z0-9._:/@-]`, 1 to [`MAX_ID_BYTES`] bytes;
//! - `min_position` its `LP:OFFSET` pattern, `wait_ms` and the time
//!   windows their bounds, `dimension` its names, `model` its rule;
//! - a reserve gives `units` or the sizing inputs, never both;
//! - every operation with a body documents 400 `malformed_json`, 413 and
//!   415, and 422 for a body that parses but breaks a rule; every operation
//!   with a path identifier documents how a bad one is answered (400 on the
//!   queries, 422 on the writes).
//!
//! `tests/server/openapi.rs` checks the document against the contract; the
//! closing note of issue 17 has the schemathesis run against it.

use reservoir_core::types::MAX_ID_BYTES;
use reservoir_core::Dimension;
use serde_json::{json, Map, Value};
use utoipa::OpenApi;

use crate::queries::MAX_WAIT_MS;

/// Path parameters and body properties that are identifiers.
const IDS: &[&str] = &[
    "id",
    "subject",
    "route",
    "tenant",
    "gateway_id",
    "shard_id",
    "reservation_id",
    "operation_id",
    "accounting_epoch",
];

/// The whole document, as served.
pub fn document(metrics_public: bool) -> Value {
    let mut doc = crate::api::ApiDoc::openapi();
    doc.merge(crate::queries::QueriesDoc::openapi());
    doc.merge(crate::shards::http::ShardsDoc::openapi());
    crate::auth::openapi::declare(&mut doc, metrics_public);
    constrained(doc)
}

/// `doc` as JSON, with the rules above added.
pub fn constrained(doc: utoipa::openapi::OpenApi) -> Value {
    let mut doc = serde_json::to_value(doc).expect("the OpenAPI document serializes");
    constrain(&mut doc);
    doc
}

fn id_pattern() -> String {
    format!("^[A-Za-z0-9._:/@-]{{1,{MAX_ID_BYTES}}}$")
}

fn id_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": MAX_ID_BYTES, "pattern": id_pattern()})
}

fn problem(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    })
}

/// Adds `status` to `responses` unless the operation documents it already.
fn answer(responses: &mut Map<String, Value>, status: u16, description: &str) {
    responses
        .entry(status.to_string())
        .or_insert_with(|| problem(description));
}

fn constrain(doc: &mut Value) {
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            let query = is_query(path);
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for op in item.values_mut().filter_map(Value::as_object_mut) {
                constrain_operation(op, query);
            }
        }
    }
    let schemas = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut);
    for schema in schemas.into_iter().flat_map(|s| s.values_mut()) {
        constrain_properties(schema);
    }
    // A reserve names its units, or gives the sizing inputs
    // (counted_input_tokens, max_tokens): one, not both.
    if let Some(reserve) = doc
        .pointer_mut("/components/schemas/ReserveBody")
        .and_then(Value::as_object_mut)
    {
        reserve.insert(
            "not".into(),
            json!({
                "required": ["units"],
                "properties": {"units": {"type": "integer"}},
                "anyOf": [
                    {"required": ["counted_input_tokens"], "properties": {"counted_input_tokens": {"type": "integer"}}},
                    {"required": ["max_tokens"], "properties": {"max_tokens": {"type": "integer"}}},
                ],
            }),
        );
        reserve.insert(
            "anyOf".into(),
            json!([
                {"required": ["units"], "properties": {"units": {"type": "integer"}}},
                {"required": ["counted_input_tokens"], "properties": {"counted_input_tokens": {"type": "integer"}}},
            ]),
        );
    }
}

/// The read side: bad path parameters are 400 there, 422 on the writes.
fn is_query(path: &str) -> bool {
    path.starts_with("/v1/tenants/")
        || path.starts_with("/v1/routes/")
        || path.starts_with("/v1/projections/")
}

fn constrain_operation(op: &mut Map<String, Value>, query: bool) {
    let mut path_ids = false;
    let params = op.get_mut("parameters").and_then(Value::as_array_mut);
    for param in params
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        let name = param
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let in_path = param.get("in").and_then(Value::as_str) == Some("path");
        let schema = match name {
            n if IDS.contains(&n) => {
                path_ids |= in_path;
                id_schema()
            }
            // A log partition fits u32 and an offset u64 at these lengths.
            "min_position" => json!({"type": "string", "pattern": "^([0-9]{1,9}:)?[0-9]{1,19}$"}),
            "wait_ms" => json!({"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS}),
            "from_ms" | "to_ms" | "min_samples" => {
                json!({"type": "integer", "minimum": 0, "maximum": u64::MAX})
            }
            "dimension" => json!({"type": "string", "enum": Dimension::ALL.map(Dimension::name)}),
            "model" => json!({"type": "string", "minLength": 1, "pattern": "^[^|]+$"}),
            _ => continue,
        };
        param.insert("schema".into(), schema);
    }
    let has_body = op.contains_key("requestBody");
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    if has_body {
        answer(
            responses,
            400,
            "The body is not JSON of the documented shape (malformed_json)",
        );
        answer(
            responses,
            413,
            "The body is larger than --max-body-bytes (payload_too_large)",
        );
        answer(
            responses,
            415,
            "Content-Type is not application/json (unsupported_media_type)",
        );
        answer(
            responses,
            422,
            "The body parses but breaks a rule the detail names",
        );
    }
    if path_ids {
        if query {
            answer(responses, 400, "A path parameter that is not an identifier");
        } else {
            answer(
                responses,
                422,
                "A path parameter that is not an identifier (invalid_id, invalid_input)",
            );
        }
    }
}

/// `"type": "string"`, or `["string", "null"]` for an optional one.
fn is_string(schema: &Map<String, Value>) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    }
}

/// Identifier properties of a component schema (and of the schemas nested
/// in it) take the identifier rule.
fn constrain_properties(schema: &mut Value) {
    let Some(schema) = schema.as_object_mut() else {
        return;
    };
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, prop) in props.iter_mut() {
            match prop.as_object_mut() {
                Some(p) if IDS.contains(&name.as_str()) && is_string(p) => {
                    p.insert("minLength".into(), json!(1));
                    p.insert("maxLength".into(), json!(MAX_ID_BYTES));
                    p.insert("pattern".into(), json!(id_pattern()));
                }
                _ => constrain_properties(prop),
            }
        }
    }
    for key in ["items", "allOf", "oneOf", "anyOf"] {
        match schema.get_mut(key) {
            Some(Value::Array(parts)) => parts.iter_mut().for_each(constrain_properties),
            Some(part @ Value::Object(_)) => constrain_properties(part),
            _ => {}
        }
    }
}
