//! The tokens file: one `[[token]]` per principal, holding only the SHA-256 of
//! the token, never the token itself. Read at start, re-read when its content
//! changes ([`TokenStore::reload`]); `reservoir token create` appends to it.
//!
//! ```toml
//! [[token]]
//! principal = "acme-gateway"
//! scopes = ["gateway"]
//! subjects = ["acme"]            # exact subject names
//! subject_prefixes = ["acme-"]   # and/or name prefixes
//! sha256 = "9f86d081884c7d65…"   # hex SHA-256 of the whole token, `rsv_…`
//! ```
//!
//! A token is `rsv_` and 32 random bytes in hex (256 bits from the OS). The
//! presented token's SHA-256 picks a bucket by its first 4 bytes (that lookup's
//! timing says at most whether a stored hash shares 4 bytes of a hash the
//! caller computed itself, nothing about any token), and every hash in the
//! bucket is compared in full in constant time, without stopping at a match.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{Principal, Scope, Subjects};

/// Every token starts with this, so a leaked one is easy to recognise (and to scan for).
pub const TOKEN_PREFIX: &str = "rsv_";
/// Random bytes in a token.
pub const TOKEN_RANDOM_BYTES: usize = 32;
/// Most tokens one file may hold.
pub const MAX_TOKENS: usize = 100_000;
/// Largest tokens file read, bytes.
pub const MAX_TOKENS_FILE_BYTES: u64 = 64 << 20;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    #[serde(default)]
    pub token: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub principal: String,
    pub scopes: Vec<String>,
    #[serde(default)]
    pub subjects: Vec<String>,
    #[serde(default)]
    pub subject_prefixes: Vec<String>,
    pub sha256: String,
    /// Free text for people (when and why it was made); ignored.
    #[serde(default)]
    pub note: Option<String>,
}

pub type TokenHash = [u8; 32];

pub fn hash(token: &str) -> TokenHash {
    Sha256::digest(token.as_bytes()).into()
}

/// A fresh token from the operating system's random source.
pub fn generate() -> Result<String, String> {
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| format!("no random bytes from the OS: {e}"))?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

/// The principals of one version of the tokens file, by token hash.
#[derive(Debug, Default)]
pub struct TokenSet {
    /// By the first 4 bytes of the hash: (full hash, principal).
    buckets: HashMap<[u8; 4], Vec<(TokenHash, Principal)>>,
    len: usize,
}

fn bucket_of(hash: &TokenHash) -> [u8; 4] {
    [hash[0], hash[1], hash[2], hash[3]]
}

impl TokenSet {
    pub fn parse(text: &str) -> Result<TokenSet, String> {
        let file: TokenFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.token.len() > MAX_TOKENS {
            return Err(format!("more than {MAX_TOKENS} tokens"));
        }
        let mut set = TokenSet::default();
        for (i, entry) in file.token.into_iter().enumerate() {
            let at = |what: String| format!("token {} ({}): {what}", i + 1, entry.principal);
            if entry.principal.is_empty() {
                return Err(at("principal must not be empty".into()));
            }
            let mut scopes = BTreeSet::new();
            for raw in &entry.scopes {
                let scope = Scope::parse(raw).ok_or_else(|| {
                    at(format!(
                        "unknown scope {raw:?} (gateway, tenant-read, operator, metrics)"
                    ))
                })?;
                scopes.insert(scope);
            }
            if scopes.is_empty() {
                return Err(at("no scopes".into()));
            }
            let digest: TokenHash = hex::decode(&entry.sha256)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| at("sha256 must be 64 hex digits".into()))?;
            let principal = Principal {
                name: entry.principal.clone(),
                scopes,
                subjects: Subjects {
                    exact: entry.subjects.into_iter().collect(),
                    prefixes: entry.subject_prefixes,
                },
            };
            // The same token works through any node of a cluster only if
            // its principal fits the header it is forwarded in.
            let forwarded = super::forward::encoded_len(&principal);
            if forwarded > super::forward::MAX_PRINCIPAL_HEADER_BYTES {
                return Err(at(format!(
                    "its subjects take {forwarded} bytes as forwarded between cluster nodes, more than {}: name fewer (one subject prefix covers many)",
                    super::forward::MAX_PRINCIPAL_HEADER_BYTES
                )));
            }
            let bucket = set.buckets.entry(bucket_of(&digest)).or_default();
            if bucket.iter().any(|(stored, _)| *stored == digest) {
                return Err(at("the same token hash appears twice".into()));
            }
            bucket.push((digest, principal));
            set.len += 1;
        }
        Ok(set)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The principal of `token`, if the file holds its hash.
    pub fn verify(&self, token: &str) -> Option<&Principal> {
        let presented = hash(token);
        let mut found = None;
        for (stored, principal) in self.buckets.get(&bucket_of(&presented))? {
            if bool::from(stored.ct_eq(&presented)) {
                found = Some(principal);
            }
        }
        found
    }
}

/// The tokens file and the set last read from it, shared by every request.
#[derive(Clone)]
pub struct TokenStore {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    path: PathBuf,
    current: RwLock<Arc<TokenSet>>,
    read: Mutex<Reads>,
}

/// What the reloads have read.
struct Reads {
    /// The bytes `current` was parsed from: a reload parses only what changed.
    applied: Vec<u8>,
    /// Other bytes, read by the last look: a change is applied only when the
    /// next look reads the same bytes again, so a file caught in the middle
    /// of a write (emptied by `>`, half written) is never applied; it would
    /// revoke the tokens it has not reached yet.
    seen: Option<Vec<u8>>,
}

impl TokenStore {
    pub fn open(path: PathBuf) -> Result<TokenStore, String> {
        let bytes = read(&path)?;
        let set = parse_bytes(&path, &bytes)?;
        Ok(TokenStore {
            inner: Arc::new(StoreInner {
                path,
                current: RwLock::new(Arc::new(set)),
                read: Mutex::new(Reads {
                    applied: bytes,
                    seen: None,
                }),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub fn current(&self) -> Arc<TokenSet> {
        self.inner
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the file. A change is applied when two looks in a row read
    /// the same bytes (the watcher looks every reload interval), so a file
    /// caught mid-write is never applied; a file that cannot be read or
    /// parsed leaves the tokens as they were (logged and counted), so a
    /// half-edited file never locks everyone out. Returns whether the tokens
    /// changed.
    pub fn reload(&self) -> bool {
        let bytes = match read(&self.inner.path) {
            Ok(b) => b,
            Err(err) => return failed(err),
        };
        let mut reads = self.inner.read.lock().unwrap_or_else(|e| e.into_inner());
        if reads.applied == bytes {
            reads.seen = None;
            return false;
        }
        if reads.seen.as_ref() != Some(&bytes) {
            reads.seen = Some(bytes);
            return false;
        }
        match parse_bytes(&self.inner.path, &bytes) {
            Ok(set) => {
                tracing::info!(path = %self.inner.path.display(), tokens = set.len(), "tokens file reloaded");
                metrics::counter!("reservoir_tokens_reloads_total").increment(1);
                *self
                    .inner
                    .current
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
                reads.applied = bytes;
                reads.seen = None;
                true
            }
            Err(err) => failed(err),
        }
    }
}

fn failed(err: String) -> bool {
    tracing::error!(%err, "tokens file not reloaded; the tokens read before stay in force");
    metrics::counter!("reservoir_tokens_reload_failures_total").increment(1);
    false
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("cannot read tokens file {}: {e}", path.display()))?
        .len();
    if len > MAX_TOKENS_FILE_BYTES {
        return Err(format!(
            "tokens file {} is above {MAX_TOKENS_FILE_BYTES} bytes",
            path.display()
        ));
    }
    std::fs::read(path).map_err(|e| format!("cannot read tokens file {}: {e}", path.display()))
}

fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<TokenSet, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| format!("tokens file {} is not UTF-8", path.display()))?;
    TokenSet::parse(text).map_err(|e| format!("invalid tokens file {}: {e}", path.display()))
}

/// What `reservoir token create` adds.
pub struct NewToken<'a> {
    pub principal: &'a str,
    pub scopes: &'a [String],
    pub subjects: &'a [String],
    pub subject_prefixes: &'a [String],
}

/// Generates a token, appends its hash to `path` (created owner-only, 0600)
/// and returns the token. The file is parsed again with the new entry before
/// anything is written, so a bad entry never lands.
pub fn create(path: &Path, new: &NewToken) -> Result<String, String> {
    let token = generate()?;
    append(path, new, &token)?;
    Ok(token)
}

/// Appends the hash of `token` for `new` to `path` (see [`create`]).
pub fn append(path: &Path, new: &NewToken, token: &str) -> Result<(), String> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let quote = |items: &[String]| -> String {
        let quoted: Vec<String> = items.iter().map(|s| toml_string(s)).collect();
        format!("[{}]", quoted.join(", "))
    };
    let mut entry = String::new();
    if !existing.is_empty() && !existing.ends_with('\n') {
        entry.push('\n');
    }
    entry.push_str(&format!(
        "\n[[token]]\nprincipal = {}\nscopes = {}\nsubjects = {}\nsubject_prefixes = {}\nsha256 = \"{}\"\n",
        toml_string(new.principal),
        quote(new.scopes),
        quote(new.subjects),
        quote(new.subject_prefixes),
        hex::encode(hash(token)),
    ));
    TokenSet::parse(&format!("{existing}{entry}"))?;
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    file.write_all(entry.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A TOML basic string (JSON's escapes are a subset TOML accepts).
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// Writes `text` to a new owner-only (0600) file; fails if `path` exists.
pub fn write_private(path: &Path, text: &str) -> Result<(), String> {
    let mut options = std::fs::OpenOptions::new();
    options.create_new(true).write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
