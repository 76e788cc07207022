//! What the front asks of a caller before it places a request.
//!
//! The router of the partition that decides a request checks the caller's
//! scope and subject (see [`crate::auth`]). The front places the request
//! first, and placing can answer by itself: an id no partition holds is its
//! 404, a partition without an owner its 503, a list a peer would not give
//! its 503. So before any of that the caller must hold the route's scope,
//! and the subject the path or body names, and an anonymous or
//! wrong-scope caller gets the 401 or 403 a single node gives, whatever the
//! ledger holds and wherever it is. Only then may a reservation of another
//! subject answer the 404 of one that does not exist (the owner's, never
//! naming who served it).

use axum::http::{HeaderMap, Method};

use super::Node;
use crate::auth::{self, Scope};

/// The scopes the route asks for (the table of `api.rs` and `shards/http.rs`),
/// for the requests the front places; `None` for the ones it answers locally.
pub fn scopes(method: &Method, segments: &[&str]) -> Option<&'static [Scope]> {
    match (method, segments) {
        (&Method::POST, ["v1", "policies"]) => Some(auth::OPERATOR),
        (&Method::POST, ["v1", "policies", _, _, "rollback"]) => Some(auth::OPERATOR),
        (&Method::GET, ["v1", "policies", _, _]) => Some(auth::SUBJECT_READ),
        (&Method::POST, ["v1", "reservations"]) => Some(auth::GATEWAY),
        (&Method::GET, ["v1", "reservations", _]) => Some(auth::SUBJECT_READ),
        (&Method::POST, ["v1", "reservations", _, "start" | "settle" | "release"]) => {
            Some(auth::GATEWAY)
        }
        (&Method::GET, ["v1", "partitions"]) => Some(auth::OPERATOR),
        (&Method::POST, ["v1", "shards"]) => Some(auth::SHARD_WRITE),
        (&Method::POST, ["v1", "shards", _, "reconcile"]) => Some(auth::SHARD_WRITE),
        (&Method::GET, ["v1", "shards"]) => Some(auth::SUBJECT_READ),
        _ => None,
    }
}

/// Whether the request comes from a peer: it carries the node credential,
/// or authentication is off. Only a peer's hop count is believed; anyone
/// else's request is a first hop (a client's `x-reservoir-hops: 1` would
/// otherwise stop the front asking its peers).
pub fn from_peer(node: &Node, headers: &HeaderMap) -> bool {
    let Some(credential) = node.auth.node_credential() else {
        return !node.auth.enabled();
    };
    auth::layer::bearer(headers)
        .ok()
        .flatten()
        .is_some_and(|token| credential.matches(token))
}
