//! Between cluster nodes: the shared node credential and the original caller.
//!
//! A node forwarding a request sends `Authorization: Bearer <node token>` and
//! the caller's [`Principal`] in [`PRINCIPAL_HEADER`] (hex of its JSON). The
//! receiving node honours that header only when the bearer is the node
//! credential (see `layer::principal_of`), so a client cannot name a principal
//! for itself, and a node passes on exactly the principal it authenticated:
//! the owner decides with the caller's scopes and subjects, not the node's.
//! Without a principal header the node credential is the `node` scope alone
//! (peer status and reservation-id lookups).

use std::path::Path;

use axum::http::HeaderValue;
use subtle::ConstantTimeEq;

use super::tokens::{hash, TokenHash};
use super::Principal;

pub const PRINCIPAL_HEADER: &str = "x-reservoir-principal";
/// Longest principal header accepted, bytes.
pub const MAX_PRINCIPAL_HEADER_BYTES: usize = 16 * 1024;
/// Shortest node credential accepted, characters.
pub const MIN_NODE_TOKEN_CHARS: usize = 32;

/// The cluster's shared node credential (read from `--node-token-file`).
pub struct NodeCredential {
    token: String,
    hash: TokenHash,
}

impl NodeCredential {
    pub fn read(path: &Path) -> Result<NodeCredential, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read node token {}: {e}", path.display()))?;
        NodeCredential::new(text.trim())
    }

    pub fn new(token: &str) -> Result<NodeCredential, String> {
        if token.chars().count() < MIN_NODE_TOKEN_CHARS || !token.is_ascii() {
            return Err(format!(
                "the node token must be at least {MIN_NODE_TOKEN_CHARS} ASCII characters (`reservoir token generate` makes one)"
            ));
        }
        Ok(NodeCredential {
            token: token.to_string(),
            hash: hash(token),
        })
    }

    pub fn matches(&self, presented: &str) -> bool {
        bool::from(self.hash.ct_eq(&hash(presented)))
    }

    /// `Authorization` for a request to a peer.
    pub fn authorization(&self) -> String {
        format!("Bearer {}", self.token)
    }
}

/// Bytes of `principal` in [`PRINCIPAL_HEADER`]: a token whose principal
/// is longer than [`MAX_PRINCIPAL_HEADER_BYTES`] could not be forwarded,
/// so the tokens file refuses it (see `tokens::TokenSet::parse`).
pub fn encoded_len(principal: &Principal) -> usize {
    serde_json::to_vec(principal).map_or(usize::MAX, |json| json.len() * 2)
}

pub fn encode(principal: &Principal) -> Option<HeaderValue> {
    let json = serde_json::to_vec(principal).ok()?;
    HeaderValue::from_str(&hex::encode(json)).ok()
}

pub fn decode(value: &HeaderValue) -> Option<Principal> {
    if value.len() > MAX_PRINCIPAL_HEADER_BYTES {
        return None;
    }
    let bytes = hex::decode(value.as_bytes()).ok()?;
    serde_json::from_slice(&bytes).ok()
}
