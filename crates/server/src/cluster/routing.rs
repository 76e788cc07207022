//! The cluster node's HTTP front: finds the Kafka partition a request belongs
//! to, and hands it to the local partition's router (the single-node API,
//! unchanged), forwards it to the peer serving that partition, or answers a
//! retryable 503 while nobody serves it. A non-owner never decides.
//!
//! | request | partition from |
//! | --- | --- |
//! | `POST /v1/policies` | `policy.subject`, `policy.route` in the body |
//! | `GET /v1/policies/{subject}/{route}`, `POST …/rollback` | the path |
//! | `POST /v1/reservations` | `subject`, `route` in the body |
//! | `/v1/reservations/{id}[/start,/settle,/release]` | the id: local writers, then ids this node routed, then `GET /v1/cluster/locate/{id}` on every live peer |
//! | `GET /v1/partitions` | every local partition, and (unless forwarded) every live peer's |
//! | `POST /v1/shards` | `subject`, `route` in the body |
//! | `POST /v1/shards/{id}/reconcile` | `shard.partition_key` in the body |
//! | `GET /v1/shards?subject=&route=` | `subject`, `route`; without `route`, as `GET /v1/partitions` |
//!
//! The two gathered lists name the partitions nobody served while they were
//! gathered in `x-reservoir-unserved-partitions` (absent when none).
//!
//! Before it places a request, the front checks the caller's scope and the
//! subject the path or body names ([`gate`]): placing can answer by itself
//! (an id nobody holds, a partition without an owner), and a caller without
//! the route's scope must learn nothing from that. An id is looked up among
//! the subjects the caller sees, here and (with its principal) on the peers,
//! and a 404 from an owner never names it; ids this node routed are
//! remembered with their subject, and a reserve under one of them for
//! another partition is refused (422) as on one node.
//!
//! The shard routes are placed only on a node with `--shard-key-file`;
//! without it they are answered here, 501 (see `Node::shards`).
//!
//! Forwarded requests carry `x-reservoir-hops`; a request that has been
//! forwarded [`MAX_HOPS`] times is answered 503 rather than forwarded again
//! (ownership is moving; the client retries with the same id).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use reservoir_core::ReservationId;
use reservoir_log::kafka::log_partition_of_route;
use tower::ServiceExt;

use super::{gate, status, Node, Routed};
use crate::auth::{self, require, Principal};
use crate::problem::ApiError;

pub const HOPS_HEADER: &str = "x-reservoir-hops";
/// Headers of the owner's answer that are not passed on: they describe its
/// connection to this node (RFC 9110 §7.6.1), or the body's length, which
/// the answer to the caller sets again.
const HOP_BY_HOP: [header::HeaderName; 8] = [
    header::CONNECTION,
    header::HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::CONTENT_LENGTH,
];
/// Most times one request is forwarded between nodes.
pub const MAX_HOPS: u32 = 2;
/// Longest a forwarded request may take (the owner's own limit is 30 s).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(35);

/// The node's front. Every request is authenticated here once; the
/// [`Principal`] found travels in the request's extensions into the local
/// partition routers, and in [`auth::forward::PRINCIPAL_HEADER`] (with the
/// node credential every peer request carries) to the owner.
pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/v1/cluster", require(auth::OPERATOR, get(cluster_view)))
        .route("/v1/cluster/node", require(auth::NODE, get(node_status)))
        .route("/v1/cluster/locate/{id}", get(locate))
        .route("/readyz", get(readyz))
        .fallback(front)
        .method_not_allowed_fallback(crate::api::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            node.auth.clone(),
            auth::authenticate,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            crate::api::panicked,
        ))
        .with_state(node)
}

/// The caller's principal for a request to a peer (none when authentication is off).
fn principal_header(node: &Node, parts: &axum::http::request::Parts) -> Option<HeaderValue> {
    node.auth.node_credential()?;
    parts
        .extensions
        .get::<Principal>()
        .and_then(auth::forward::encode)
}

async fn cluster_view(State(node): State<Arc<Node>>) -> Response {
    Json(status::cluster(&node).await).into_response()
}

#[derive(serde::Deserialize)]
struct Offsets {
    offsets: Option<bool>,
}

async fn node_status(
    State(node): State<Arc<Node>>,
    query: Result<axum::extract::Query<Offsets>, axum::extract::rejection::QueryRejection>,
) -> Response {
    match query {
        Ok(query) => {
            Json(status::local(&node, query.offsets.unwrap_or(false)).await).into_response()
        }
        Err(rejection) => ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            rejection.body_text(),
        )
        .into_response(),
    }
}

/// Ready once the group has given this node its first assignment.
async fn readyz(State(node): State<Arc<Node>>) -> Response {
    if node.joined.load(std::sync::atomic::Ordering::Acquire) {
        Json(serde_json::json!({"status": "ready"})).into_response()
    } else {
        unavailable("joining the consumer group").into_response()
    }
}

/// `GET /v1/cluster/locate/{id}`: the partition holding `id` among this
/// node's, of a subject the principal the asking peer forwards sees. For
/// peers (the node credential, with or without the caller's principal) and
/// operators.
async fn locate(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    principal: Principal,
    axum::extract::Path(raw): axum::extract::Path<String>,
) -> Response {
    if !gate::from_peer(&node, &headers) {
        if let Some(refused) = auth::layer::refusal(Some(&principal), auth::NODE, None) {
            return refused;
        }
    }
    match ReservationId::new(&raw)
        .ok()
        .and_then(|id| locate_local(&node, &id, None, &principal))
    {
        Some(routed) => Json(serde_json::json!({
            "log_partition": routed.log_partition,
            "subject": &*routed.subject,
        }))
        .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_reservation",
            format!("no partition of this node holds reservation {raw}"),
        )
        .into_response(),
    }
}

/// The local partition holding `id` for `principal`, not asking `asked`
/// (looked in already).
fn locate_local(
    node: &Node,
    id: &ReservationId,
    asked: Option<u32>,
    principal: &Principal,
) -> Option<Routed> {
    let slots = node.slots.read().expect("slots");
    slots
        .iter()
        .filter(|(p, _)| Some(**p) != asked)
        .find_map(|(p, slot)| {
            let subject = slot_holds(node, slot, id, principal)?;
            Some(Routed {
                log_partition: *p,
                subject,
            })
        })
}

/// The subject of reservation `id` if the local partition `slot` serves
/// holds it and `principal` sees the subject: the caller's own reservation
/// is found, not another subject's under the same id in another partition.
///
/// The node's partitions share one idempotency index, which also keeps the
/// records of partitions the node served before: a record found there is
/// this slot's only if its subject/route is placed in this partition.
fn slot_holds(
    node: &Node,
    slot: &super::Slot,
    id: &ReservationId,
    principal: &Principal,
) -> Option<Arc<str>> {
    // An unreadable idempotency index is not "here": the caller asks the
    // peers, and the owner's writer answers 503 when it is asked itself.
    let super::SlotState::Serving(owned) = &slot.state else {
        return None;
    };
    let key = owned.writers.locate(id).ok()??;
    let here = log_partition_of_route(&key.subject, &key.route, node.log_partitions())
        == owned.log_partition;
    (here && principal.sees(&key.subject)).then(|| Arc::from(key.subject.as_str()))
}

/// The partitions neither this node nor, as far as it knows, any live peer serves.
fn unowned_partitions(node: &Node) -> Vec<u32> {
    (0..node.log_partitions())
        .filter(|p| node.serving(*p).is_none() && node.peers.owner_of(*p).is_none())
        .collect()
}

/// Header of a gathered list that misses partitions nobody served when it
/// was gathered: their numbers, comma-separated.
pub const UNSERVED_HEADER: &str = "x-reservoir-unserved-partitions";

/// Header of a node's part of a gathered list, for the node gathering it:
/// the partitions whose answers are in it, comma-separated.
pub const SERVED_HEADER: &str = "x-reservoir-served-partitions";

fn partition_list(partitions: &BTreeSet<u32>) -> Option<HeaderValue> {
    let list: Vec<String> = partitions.iter().map(u32::to_string).collect();
    HeaderValue::from_str(&list.join(",")).ok()
}

/// `answer` with [`SERVED_HEADER`], and [`UNSERVED_HEADER`] naming every
/// partition of the topic not in `served` (none: the header is absent).
fn noting_served(node: &Node, served: &BTreeSet<u32>, mut answer: Response) -> Response {
    let unserved: BTreeSet<u32> = (0..node.log_partitions())
        .filter(|p| !served.contains(p))
        .collect();
    let headers = answer.headers_mut();
    if let Some(value) = partition_list(served) {
        headers.insert(SERVED_HEADER, value);
    }
    if !unserved.is_empty() {
        if let Some(value) = partition_list(&unserved) {
            headers.insert(UNSERVED_HEADER, value);
        }
    }
    answer
}

fn unavailable(detail: impl Into<String>) -> ApiError {
    ApiError::unavailable(detail)
}

fn hops(headers: &HeaderMap) -> u32 {
    headers
        .get(HOPS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Where a request goes.
enum Target {
    /// A partition, and the id a reserve that succeeds is remembered by.
    Partition(u32, Option<ReservationId>),
    /// By reservation id, resolved below.
    Id(ReservationId),
    /// Anything else (health, metrics, OpenAPI, unknown paths, bodies we cannot
    /// read): answered by the local not-ready router or any local partition.
    Local,
    Partitions,
    /// `GET /v1/shards` without a route: a subject's routes may be anywhere.
    Shards,
}

async fn front(State(node): State<Arc<Node>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let limit = crate::shards::body_limit(parts.uri.path(), node.config.max_body_bytes);
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "request body is above the size limit",
            )
            .into_response()
        }
    };
    let partitions = node.log_partitions();
    let path = parts.uri.path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // The subject the request names, where the front reads it anyway.
    let mut subject: Option<Arc<str>> = None;
    let mut placed = |s: &str, r: &str| {
        subject = Some(Arc::from(s));
        log_partition_of_route(s, r, partitions)
    };
    let target = match (&parts.method, segments.as_slice()) {
        (&Method::POST, ["v1", "policies"]) => match serde_json::from_slice::<PolicyBody>(&bytes) {
            Ok(body) => Target::Partition(placed(&body.policy.subject, &body.policy.route), None),
            Err(_) => Target::Local,
        },
        (&Method::GET, ["v1", "policies", s, r])
        | (&Method::POST, ["v1", "policies", s, r, "rollback"]) => {
            match (percent_decode(s), percent_decode(r)) {
                (Some(s), Some(r)) => Target::Partition(placed(&s, &r), None),
                _ => Target::Local,
            }
        }
        (&Method::POST, ["v1", "reservations"]) => match reserve_target(&parts, &bytes) {
            Some((body, id)) => Target::Partition(placed(&body.subject, &body.route), id),
            None => Target::Local,
        },
        (_, ["v1", "reservations", id, ..]) if segments.len() <= 4 => {
            match percent_decode(id).and_then(|raw| ReservationId::new(&raw).ok()) {
                Some(id) => Target::Id(id),
                None => Target::Local,
            }
        }
        (&Method::GET, ["v1", "partitions"]) => Target::Partitions,
        (&Method::POST, ["v1", "shards"]) if node.shards.is_some() => {
            match serde_json::from_slice::<Placed>(&bytes) {
                Ok(body) => Target::Partition(placed(&body.subject, &body.route), None),
                Err(_) => Target::Local,
            }
        }
        (&Method::POST, ["v1", "shards", _, "reconcile"]) if node.shards.is_some() => {
            match serde_json::from_slice::<Presented>(&bytes) {
                Ok(body) => {
                    let key = body.shard.partition_key;
                    Target::Partition(placed(&key.subject, &key.route), None)
                }
                Err(_) => Target::Local,
            }
        }
        (&Method::GET, ["v1", "shards"]) if node.shards.is_some() => {
            match axum::extract::Query::<ShardsOf>::try_from_uri(&parts.uri) {
                Ok(axum::extract::Query(ShardsOf {
                    subject: s,
                    route: Some(r),
                })) => Target::Partition(placed(&s, &r), None),
                Ok(axum::extract::Query(ShardsOf { subject: s, .. })) => {
                    subject = Some(Arc::from(s));
                    Target::Shards
                }
                Err(_) => Target::Local,
            }
        }
        _ => Target::Local,
    };
    // The caller's scope and subject before anything is looked up (`gate`);
    // a request under a reservation id that no route takes is answered
    // locally (404 or 405), never by looking the id up.
    let target = match gate::scopes(&parts.method, &segments) {
        Some(allowed) => {
            let principal = parts.extensions.get::<Principal>();
            if let Some(refused) = auth::layer::refusal(principal, allowed, subject.as_deref()) {
                return refused;
            }
            target
        }
        None if matches!(target, Target::Id(_)) => Target::Local,
        None => target,
    };
    // Believed only from a peer (checking that hashes the bearer token, so
    // only when there is a hop count to believe).
    let hops = match hops(&parts.headers) {
        0 => 0,
        n if gate::from_peer(&node, &parts.headers) => n,
        _ => 0,
    };
    match target {
        Target::Local => local_any(&node, parts, bytes).await,
        Target::Partitions => all_partitions(&node, parts, bytes, hops).await,
        Target::Shards => all_shards(&node, parts, bytes, hops).await,
        Target::Partition(p, reserve_id) => {
            if let Some(id) = &reserve_id {
                // The cheap half of "an id is unique across the cluster":
                // one this node routed or found elsewhere is not reserved
                // again in another partition (the partition's writer
                // checks its own).
                if node.routed(id).is_some_and(|r| r.log_partition != p) {
                    return ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "exists_with_different_digest",
                        reservoir_core::Rejection::ExistsWithDifferentDigest { id: id.clone() }
                            .to_string(),
                    )
                    .into_response();
                }
            }
            let response = dispatch(&node, p, parts, bytes, hops).await;
            if let (Some(id), Some(subject), true) =
                (reserve_id, subject, response.status().is_success())
            {
                node.remember_id(
                    id,
                    Routed {
                        log_partition: p,
                        subject,
                    },
                );
            }
            response
        }
        Target::Id(id) => match find(&node, &id, hops, &parts).await {
            Ok(p) => dispatch(&node, p, parts, bytes, hops).await,
            Err(response) => response,
        },
    }
}

/// Where a policy body goes: `policy.subject`, `policy.route`.
#[derive(serde::Deserialize)]
struct PolicyBody<'a> {
    #[serde(borrow)]
    policy: Placed<'a>,
}

/// What the front reads of a body: the subject and route that place it, and
/// a reserve's `id` (any other field is left to the partition's router).
#[derive(serde::Deserialize)]
struct Placed<'a> {
    #[serde(borrow)]
    subject: Cow<'a, str>,
    #[serde(borrow)]
    route: Cow<'a, str>,
    /// Any JSON value: one that is no id leaves the reserve unplaced by id,
    /// and the partition's router answers it.
    #[serde(default)]
    id: Option<serde_json::Value>,
}

/// What the front reads of a reconcile body: the presented shard's partition.
#[derive(serde::Deserialize)]
struct Presented<'a> {
    #[serde(borrow)]
    shard: PresentedShard<'a>,
}

#[derive(serde::Deserialize)]
struct PresentedShard<'a> {
    #[serde(borrow)]
    partition_key: Placed<'a>,
}

/// The query of `GET /v1/shards`.
#[derive(serde::Deserialize)]
struct ShardsOf {
    subject: String,
    route: Option<String>,
}

/// What places a reserve and the id to remember it by (from the body, else
/// the `idempotency-key` header); one parse of the body.
fn reserve_target<'a>(
    parts: &axum::http::request::Parts,
    bytes: &'a Bytes,
) -> Option<(Placed<'a>, Option<ReservationId>)> {
    let placed = serde_json::from_slice::<Placed>(bytes).ok()?;
    let from_body = match &placed.id {
        Some(serde_json::Value::String(id)) => Some(id.as_str()),
        _ => None,
    };
    let id = from_body
        .or_else(|| {
            parts
                .headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
        })
        .and_then(|raw| ReservationId::new(raw).ok());
    Some((placed, id))
}

fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn rebuild(parts: axum::http::request::Parts, bytes: Bytes) -> Request {
    Request::from_parts(parts, Body::from(bytes))
}

async fn call(router: &Router, request: Request) -> Response {
    match router.clone().oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// Health, metrics, OpenAPI and requests we could not place: a local partition's
/// router if there is one (so a bad body gets its 4xx), else the idle router.
async fn local_any(node: &Node, parts: axum::http::request::Parts, bytes: Bytes) -> Response {
    let serving = {
        let slots = node.slots.read().expect("slots");
        slots.values().find_map(|slot| match &slot.state {
            super::SlotState::Serving(owned) => Some(owned.router.clone()),
            _ => None,
        })
    };
    let is_write = parts.method == Method::POST;
    match serving {
        Some(router) if is_write => call(&router, rebuild(parts, bytes)).await,
        _ => call(&node.idle, rebuild(parts, bytes)).await,
    }
}

/// The partition holding reservation `id`, or the answer to give.
async fn find(
    node: &Node,
    id: &ReservationId,
    hops: u32,
    parts: &axum::http::request::Parts,
) -> Result<u32, Response> {
    let anonymous = Principal::anonymous();
    let principal = parts.extensions.get::<Principal>().unwrap_or(&anonymous);
    let routed = node
        .routed(id)
        .filter(|r| principal.sees(&r.subject))
        .map(|r| r.log_partition);
    // The partition this node routed the id to is asked first: asking every
    // local partition looks the id up in each, a RocksDB read on every miss.
    if let Some(p) = routed {
        let slots = node.slots.read().expect("slots");
        if slots
            .get(&p)
            .is_some_and(|slot| slot_holds(node, slot, id, principal).is_some())
        {
            return Ok(p);
        }
    }
    if let Some(r) = locate_local(node, id, routed, principal) {
        return Ok(r.log_partition);
    }
    if let Some(p) = routed {
        return Ok(p);
    }
    if hops == 0 {
        let mut asks = tokio::task::JoinSet::new();
        let forwarded = principal_header(node, parts);
        for peer in node.peers.live() {
            let http = node.http.clone();
            let url = format!("{}/v1/cluster/locate/{id}", peer.url);
            let forwarded = forwarded.clone();
            asks.spawn(async move {
                let mut request = http.get(url);
                if let Some(v) = forwarded {
                    request = request.header(auth::forward::PRINCIPAL_HEADER, v);
                }
                let response = request
                    .header(HOPS_HEADER, "1")
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .ok()?;
                if !response.status().is_success() {
                    return None;
                }
                let body: serde_json::Value = response.json().await.ok()?;
                Some(Routed {
                    log_partition: body.get("log_partition")?.as_u64()? as u32,
                    subject: Arc::from(body.get("subject")?.as_str()?),
                })
            });
        }
        while let Some(answer) = asks.join_next().await {
            if let Ok(Some(routed)) = answer {
                let p = routed.log_partition;
                node.remember_id(id.clone(), routed);
                return Ok(p);
            }
        }
    }
    // Unknown everywhere we asked. That is a 404 only if every partition is
    // served: a partition being taken over may hold it.
    if !unowned_partitions(node).is_empty() {
        return Err(unavailable(format!(
            "reservation {id} not found while some partitions change owner; retry"
        ))
        .into_response());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_reservation",
        format!("unknown reservation {id}"),
    )
    .into_response())
}

/// Decides locally, forwards to the owner, or answers 503.
async fn dispatch(
    node: &Node,
    p: u32,
    parts: axum::http::request::Parts,
    bytes: Bytes,
    hops: u32,
) -> Response {
    if let Some(owned) = node.serving(p) {
        return call(&owned.router, rebuild(parts, bytes)).await;
    }
    if node.holds_slot(p) {
        return unavailable(format!(
            "partition {p} is being taken over by this node; retry"
        ))
        .into_response();
    }
    let owner = match node.peers.owner_of(p) {
        Some(owner) => Some(owner),
        // Gossip may not have heard of a takeover yet: ask the peers now.
        None => {
            status::refresh(node).await;
            node.peers.owner_of(p)
        }
    };
    let Some((url, _epoch)) = owner else {
        return unavailable(format!("partition {p} has no owner right now; retry")).into_response();
    };
    if hops >= MAX_HOPS {
        return unavailable(format!("partition {p} is moving (hop limit); retry")).into_response();
    }
    forward(node, &url, parts, bytes, hops + 1).await
}

async fn forward(
    node: &Node,
    url: &str,
    parts: axum::http::request::Parts,
    bytes: Bytes,
    hops: u32,
) -> Response {
    let target = format!(
        "{url}{}",
        parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
    );
    metrics::counter!("reservoir_cluster_forwarded_total").increment(1);
    let mut request = node
        .http
        .request(parts.method.clone(), target)
        .timeout(FORWARD_TIMEOUT)
        .header(HOPS_HEADER, hops.to_string())
        .body(bytes);
    for name in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = parts.headers.get(&name) {
            request = request.header(name, v.clone());
        }
    }
    if let Some(v) = parts.headers.get("idempotency-key") {
        request = request.header("idempotency-key", v.clone());
    }
    if let Some(v) = principal_header(node, &parts) {
        request = request.header(auth::forward::PRINCIPAL_HEADER, v);
    }
    let response = match request.send().await {
        Ok(r) => r,
        Err(err) => {
            return unavailable(format!("owner {url} unreachable: {err}; retry")).into_response()
        }
    };
    let status = response.status();
    // The owner's headers (content type, Retry-After, the rate-limit
    // headers, ...), except the ones that describe the hop itself.
    let mut headers = HeaderMap::new();
    for (name, value) in response.headers() {
        if !HOP_BY_HOP.contains(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    // Kept when the owner's answer already names who served it (a second
    // hop). Not on a 404: another subject's reservation answers exactly the
    // 404 of one that does not exist, which the front gives by itself.
    if status == StatusCode::NOT_FOUND {
        headers.remove("x-reservoir-served-by");
    } else {
        headers.entry("x-reservoir-served-by").or_insert_with(|| {
            HeaderValue::from_str(url).unwrap_or(HeaderValue::from_static("peer"))
        });
    }
    match response.bytes().await {
        Ok(body) => (status, headers, body).into_response(),
        Err(err) => unavailable(format!("owner {url} answer cut: {err}; retry")).into_response(),
    }
}

/// `GET /v1/partitions`: local partitions, plus every live peer's unless forwarded.
async fn all_partitions(
    node: &Node,
    parts: axum::http::request::Parts,
    bytes: Bytes,
    hops: u32,
) -> Response {
    gathered(node, parts, bytes, hops, "partitions", |answers| {
        let mut all: Vec<serde_json::Value> = Vec::new();
        for answer in answers {
            if let Ok(serde_json::Value::Array(items)) = serde_json::from_slice(&answer) {
                all.extend(items);
            }
        }
        serde_json::Value::Array(all)
    })
    .await
}

/// `GET /v1/shards?subject=` without a route: the subject's shards from
/// every partition.
async fn all_shards(
    node: &Node,
    parts: axum::http::request::Parts,
    bytes: Bytes,
    hops: u32,
) -> Response {
    gathered(node, parts, bytes, hops, "shards", |answers| {
        let mut shards: Vec<serde_json::Value> = Vec::new();
        let mut outstanding_units = 0u64;
        for answer in answers {
            let Ok(list) = serde_json::from_slice::<serde_json::Value>(&answer) else {
                continue;
            };
            if let Some(items) = list["shards"].as_array() {
                shards.extend(items.iter().cloned());
            }
            outstanding_units =
                outstanding_units.saturating_add(list["outstanding_units"].as_u64().unwrap_or(0));
        }
        serde_json::json!({"shards": shards, "outstanding_units": outstanding_units})
    })
    .await
}

/// [`gather`]'s answers merged into one, naming what nobody served
/// ([`UNSERVED_HEADER`]) and what was ([`SERVED_HEADER`]).
async fn gathered(
    node: &Node,
    parts: axum::http::request::Parts,
    bytes: Bytes,
    hops: u32,
    what: &str,
    merge: impl FnOnce(Vec<Bytes>) -> serde_json::Value,
) -> Response {
    match gather(node, parts, bytes, hops, what).await {
        Ok((answers, served)) => noting_served(node, &served, Json(merge(answers)).into_response()),
        Err(response) => response,
    }
}

/// The answers to one request of every partition this node serves and,
/// unless it was forwarded, of every live peer (asked with one hop, so each
/// answers for its own partitions), and the partitions they answered for
/// (each peer names its own in [`SERVED_HEADER`]). A local answer that is
/// not a success is the answer; a peer that does not answer with one makes
/// it a 503. The callers name every other partition as unserved
/// ([`UNSERVED_HEADER`]), so a partition that changed owner while gossip
/// did not know yet is named, not silently missed. One that moves while
/// the answers are gathered can still be counted twice: the answer is a
/// view, not a statement (`reservoir-replay` makes those).
async fn gather(
    node: &Node,
    parts: axum::http::request::Parts,
    bytes: Bytes,
    hops: u32,
    what: &str,
) -> Result<(Vec<Bytes>, BTreeSet<u32>), Response> {
    let routers: Vec<(u32, axum::Router)> = {
        let slots = node.slots.read().expect("slots");
        slots
            .iter()
            .filter_map(|(p, slot)| match &slot.state {
                super::SlotState::Serving(owned) => Some((*p, owned.router.clone())),
                _ => None,
            })
            .collect()
    };
    let mut answers = Vec::new();
    let mut served = BTreeSet::new();
    for (p, router) in routers {
        let request = rebuild(parts.clone(), bytes.clone());
        let response = call(&router, request).await;
        if !response.status().is_success() {
            return Err(response);
        }
        served.insert(p);
        answers.push(
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap_or_default(),
        );
    }
    if hops == 0 {
        let principal = principal_header(node, &parts);
        let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        for peer in node.peers.live() {
            let mut request = node.http.get(format!("{}{path}", peer.url));
            if let Some(v) = &principal {
                request = request.header(auth::forward::PRINCIPAL_HEADER, v.clone());
            }
            let answer = request
                .header(HOPS_HEADER, "1")
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            let body = match answer {
                Ok(r) if r.status().is_success() => {
                    served.extend(served_by(r.headers()));
                    r.bytes().await.ok()
                }
                _ => None,
            };
            match body {
                Some(body) => answers.push(body),
                None => {
                    return Err(
                        unavailable(format!("peer {} did not list its {what}", peer.url))
                            .into_response(),
                    )
                }
            }
        }
    }
    Ok((answers, served))
}

/// The partitions a peer's part of a gathered list answered for (none from
/// a peer that does not say).
fn served_by(headers: &reqwest::header::HeaderMap) -> Vec<u32> {
    headers
        .get(SERVED_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|list| {
            list.split(',')
                .filter_map(|p| p.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(idempotency_key: Option<&str>) -> axum::http::request::Parts {
        let mut request = axum::http::Request::post("/v1/reservations");
        if let Some(key) = idempotency_key {
            request = request.header("idempotency-key", key);
        }
        request.body(()).expect("request").into_parts().0
    }

    fn target(body: &str, idempotency_key: Option<&str>) -> Option<(u32, Option<String>)> {
        let bytes = Bytes::from(body.to_string());
        let (placed, id) = reserve_target(&parts(idempotency_key), &bytes)?;
        Some((
            log_partition_of_route(&placed.subject, &placed.route, 8),
            id.map(|id| id.as_str().to_string()),
        ))
    }

    #[test]
    fn a_reserve_is_placed_by_subject_and_route_and_remembered_by_its_id() {
        let p = log_partition_of_route("acme", "chat", 8);
        let body = r#"{"id":"r-1","subject":"acme","route":"chat","amount":5}"#;
        assert_eq!(target(body, Some("k-9")), Some((p, Some("r-1".into()))));
        // Without an id in the body, the idempotency key names it.
        let body = r#"{"subject":"acme","route":"chat"}"#;
        assert_eq!(target(body, Some("k-9")), Some((p, Some("k-9".into()))));
        assert_eq!(target(body, None), Some((p, None)));
        // An id that is not a string is the partition's router's to refuse.
        let body = r#"{"id":7,"subject":"acme","route":"chat"}"#;
        assert_eq!(target(body, None), Some((p, None)));
        // Escaped strings are placed by what they say.
        let body = r#"{"subject":"ac\u006de","route":"chat"}"#;
        assert_eq!(target(body, None), Some((p, None)));
    }

    #[test]
    fn a_reserve_without_a_placement_is_answered_locally() {
        assert_eq!(target(r#"{"route":"chat"}"#, None), None);
        assert_eq!(target(r#"{"subject":1,"route":"chat"}"#, None), None);
        assert_eq!(target("not json", None), None);
    }
}
