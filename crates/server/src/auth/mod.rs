//! Who may do what: bearer tokens naming a [`Principal`] and its [`Scope`]s.
//!
//! | scope | may |
//! | --- | --- |
//! | `gateway` | reserve, start, settle, release and read reservations and policies of its subjects |
//! | `tenant-read` | balances, efficiency, diagnosis, policies and reservations of its subjects (tenants) |
//! | `operator` | publish and roll back policies, every read, cluster status |
//! | `metrics` | `/metrics` (public with `--metrics-public`) |
//!
//! A token lists its subjects (exact names and prefixes); `gateway` and
//! `tenant-read` reach only those, `operator` reaches every subject. Tokens are
//! kept only as SHA-256 hashes in a tokens file ([`tokens`]), re-read when its
//! content changes, and created by `reservoir token create`.
//!
//! Answers ([`layer`]): no or a bad token is 401 with `WWW-Authenticate:
//! Bearer`; a token without the route's scope, or naming a subject it does
//! not hold (in the path or the body), is 403, decided before anything is
//! looked up, so it is the same for a subject that exists and one that does
//! not. A reservation id of another subject answers exactly the 404 of an id
//! that does not exist.
//!
//! Between cluster nodes ([`forward`]): a forwarded request carries the node
//! credential and the original principal; the principal header is honoured
//! only with that credential, so a node passes on no more than it was given.
//!
//! Without a tokens file authentication is off; the server then refuses to
//! listen beyond loopback unless `--insecure-no-auth` says so (see [`Auth::open`]).

pub mod cli;
pub mod forward;
pub mod layer;
pub mod openapi;
pub mod tokens;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use layer::{authenticate, require};
pub use tokens::{TokenFile, TokenSet};

/// What a token allows (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    Gateway,
    TenantRead,
    Operator,
    Metrics,
    /// The node credential of a cluster: peer status and id lookups. Never in a tokens file.
    Node,
}

impl Scope {
    pub fn parse(raw: &str) -> Option<Scope> {
        match raw {
            "gateway" => Some(Scope::Gateway),
            "tenant-read" => Some(Scope::TenantRead),
            "operator" => Some(Scope::Operator),
            "metrics" => Some(Scope::Metrics),
            _ => None,
        }
    }

    /// Scopes that reach every subject.
    fn unlimited(self) -> bool {
        matches!(self, Scope::Operator | Scope::Node)
    }
}

/// Who may call a route (the router's table: `require(OPERATOR, post(...))`).
pub const OPERATOR: &[Scope] = &[Scope::Operator];
/// The reservation writes.
pub const GATEWAY: &[Scope] = &[Scope::Gateway];
/// Reads of one subject's policy or reservation.
pub const SUBJECT_READ: &[Scope] = &[Scope::Operator, Scope::Gateway, Scope::TenantRead];
/// A tenant's balances, efficiency and diagnosis.
pub const TENANT_READ: &[Scope] = &[Scope::Operator, Scope::TenantRead];
/// Issue and reconcile emergency shards (for the subject's gateways).
pub const SHARD_WRITE: &[Scope] = &[Scope::Operator, Scope::Gateway];
pub const METRICS: &[Scope] = &[Scope::Operator, Scope::Metrics];
/// Peer status and id lookups between nodes (and operators).
pub const NODE: &[Scope] = &[Scope::Operator, Scope::Node];

/// The subjects a token reaches: exact names and name prefixes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subjects {
    #[serde(default)]
    pub exact: BTreeSet<String>,
    #[serde(default)]
    pub prefixes: Vec<String>,
}

impl Subjects {
    pub fn contains(&self, subject: &str) -> bool {
        self.exact.contains(subject) || self.prefixes.iter().any(|p| subject.starts_with(p))
    }
}

/// Who is calling: a token's principal, or nobody (no `Authorization`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub name: String,
    pub scopes: BTreeSet<Scope>,
    pub subjects: Subjects,
}

impl Principal {
    /// No token given: reaches nothing but the public routes.
    pub fn anonymous() -> Principal {
        Principal {
            name: String::new(),
            scopes: BTreeSet::new(),
            subjects: Subjects::default(),
        }
    }

    /// Authentication is off: every scope, every subject.
    pub fn unrestricted() -> Principal {
        Principal {
            name: "unauthenticated".to_string(),
            scopes: [
                Scope::Gateway,
                Scope::TenantRead,
                Scope::Operator,
                Scope::Metrics,
            ]
            .into_iter()
            .collect(),
            subjects: Subjects {
                exact: BTreeSet::new(),
                prefixes: vec![String::new()],
            },
        }
    }

    /// A peer node presenting the node credential and no principal of a caller.
    pub fn node() -> Principal {
        Principal {
            name: "node".to_string(),
            scopes: [Scope::Node].into_iter().collect(),
            subjects: Subjects::default(),
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.scopes.is_empty() && self.name.is_empty()
    }

    /// Whether one of `allowed` is this principal's and reaches `subject`
    /// (`None`: a route that names no subject).
    pub fn may(&self, allowed: &[Scope], subject: Option<&str>) -> bool {
        allowed.iter().any(|scope| {
            self.scopes.contains(scope)
                && (scope.unlimited() || subject.is_none_or(|s| self.subjects.contains(s)))
        })
    }

    /// Whether this principal may see the things of `subject` at all (the
    /// check behind the 404 for another subject's reservation).
    pub fn sees(&self, subject: &str) -> bool {
        self.scopes.iter().any(|s| s.unlimited()) || self.subjects.contains(subject)
    }
}

/// Authentication settings, resolved from flags, environment and config file.
#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    /// The tokens file; `None`: `<data-dir>/tokens.toml` if it exists.
    pub tokens_file: Option<PathBuf>,
    /// Authentication off even beyond loopback.
    pub insecure_no_auth: bool,
    /// `/metrics` without a token.
    pub metrics_public: bool,
    /// A file holding the cluster's shared node credential.
    pub node_token_file: Option<PathBuf>,
    /// How often the tokens file is looked at for changes. Default 1 s.
    pub reload_interval: Option<Duration>,
    /// With no tokens file yet: create one holding an operator token (`scripts/run`).
    pub create_operator_token: bool,
}

/// The tokens file a data directory gets by default.
pub const DEFAULT_TOKENS_FILE: &str = "tokens.toml";
/// Where `--create-operator-token` writes the first operator token.
pub const OPERATOR_TOKEN_FILE: &str = "operator.token";
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The process's authentication: off, or a tokens file (and a node credential).
pub struct Auth {
    store: Option<tokens::TokenStore>,
    metrics_public: bool,
    node: Option<forward::NodeCredential>,
}

impl Auth {
    /// Authentication off (tests, and `--insecure-no-auth`).
    pub fn disabled() -> Arc<Auth> {
        Arc::new(Auth {
            store: None,
            metrics_public: true,
            node: None,
        })
    }

    /// Resolves `config` for a server listening on `listen` with `data_dir`:
    /// the tokens file if there is one (an explicit path must exist and
    /// parse), else off, which is refused beyond loopback unless
    /// `insecure_no_auth`.
    pub fn open(
        config: &AuthConfig,
        listen: SocketAddr,
        data_dir: &Path,
    ) -> Result<Arc<Auth>, String> {
        let node = match &config.node_token_file {
            Some(path) => Some(forward::NodeCredential::read(path)?),
            None => None,
        };
        if config.insecure_no_auth {
            tracing::warn!(%listen, "--insecure-no-auth: AUTHENTICATION IS OFF; anyone who reaches this port may publish policies and mint capacity");
            return Ok(Arc::new(Auth {
                store: None,
                metrics_public: true,
                node,
            }));
        }
        let path = match &config.tokens_file {
            Some(path) => Some(path.clone()),
            None => Some(data_dir.join(DEFAULT_TOKENS_FILE)).filter(|p| p.exists()),
        };
        let Some(path) = path else {
            if !listen.ip().is_loopback() {
                return Err(format!(
                    "refusing to listen on {listen} without authentication: give --tokens-file (create one with `reservoir token create`), or --insecure-no-auth to run open"
                ));
            }
            tracing::warn!(%listen, "authentication is off: no tokens file (--tokens-file, or {}/{DEFAULT_TOKENS_FILE}); only loopback can reach this server", data_dir.display());
            return Ok(Arc::new(Auth {
                store: None,
                metrics_public: true,
                node,
            }));
        };
        let store = tokens::TokenStore::open(path)?;
        tracing::info!(path = %store.path().display(), tokens = store.current().len(), "authentication on");
        Ok(Arc::new(Auth {
            store: Some(store),
            metrics_public: config.metrics_public,
            node,
        }))
    }

    pub fn enabled(&self) -> bool {
        self.store.is_some()
    }

    /// Re-reads the tokens file every `interval` while `self` lives.
    pub fn watch(self: &Arc<Self>, interval: Duration) {
        if self.store.is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(auth) = weak.upgrade() else { return };
                if let Some(store) = &auth.store {
                    let store = store.clone();
                    let _ = tokio::task::spawn_blocking(move || store.reload()).await;
                }
            }
        });
    }

    pub fn metrics_public(&self) -> bool {
        self.metrics_public
    }

    pub fn node_credential(&self) -> Option<&forward::NodeCredential> {
        self.node.as_ref()
    }
}
