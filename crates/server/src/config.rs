//! Command line, environment and config file, resolved into one [`Config`].
//!
//! Precedence, highest first: a flag on the command line, its `RESERVOIR_*`
//! environment variable, the TOML file named by `--config`, the built-in default.
//! Clap handles the first two (every flag is declared with `env`); the file is
//! merged here, field by field, which is why every flag is an `Option` in [`ServeArgs`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use crate::auth::AuthConfig;
use crate::tls::TlsFiles;

#[derive(Debug, Parser)]
#[command(
    name = "reservoir",
    version,
    about = "Reservoir: an event-sourced capacity ledger for LLM rate limits"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: CliCommand,
}

#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Recover the ledger from the log and serve the HTTP API.
    Serve(Box<ServeArgs>),
    /// Run only the projector and the query API: follow a log another
    /// process writes (a Kafka topic, or a running `reservoir serve`'s
    /// embedded log), never claiming or appending.
    Project(Box<ProjectArgs>),
    /// Ask a running node about the cluster.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Create bearer tokens (see `reservoir_server::auth`).
    #[command(subcommand)]
    Token(crate::auth::cli::TokenCommand),
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Nodes, the partitions each owns, claim epochs and lag (`GET /v1/cluster`).
    Status {
        /// Any node's HTTP address.
        #[arg(long, env = "RESERVOIR_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// A bearer token with the operator scope.
        #[arg(long, env = "RESERVOIR_TOKEN")]
        token: Option<String>,
    },
}

/// Which event log the writer appends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogKind {
    /// RocksDB in `--data-dir`, one synced write per batch. No broker.
    Embedded,
    /// A Kafka topic on `--brokers` (one node).
    Kafka,
    /// In memory, lost on exit: for trying the API and for tests only.
    Memory,
}

#[derive(Clone, Debug, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (flags and environment win).
    #[arg(long, env = "RESERVOIR_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Directory of the embedded log (and local state). Default `./reservoir-data`.
    #[arg(long, env = "RESERVOIR_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// HTTP listen address. Default `127.0.0.1:8080`.
    #[arg(long, env = "RESERVOIR_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Event log: `embedded` (default) or `kafka`.
    #[arg(long, value_enum, env = "RESERVOIR_LOG")]
    pub log: Option<LogKind>,
    /// Kafka bootstrap servers (`HOST:PORT[,HOST:PORT]`), with `--log kafka`.
    #[arg(long, env = "RESERVOIR_BROKERS")]
    pub brokers: Option<String>,
    /// Kafka topic, with `--log kafka`. Default `reservoir.events`.
    #[arg(long, env = "RESERVOIR_TOPIC")]
    pub topic: Option<String>,
    /// A librdkafka security setting for every Kafka client, `KEY=VALUE`;
    /// repeat for several. Only `security.protocol`, `sasl.*` and `ssl.*`
    /// (e.g. `security.protocol=SASL_SSL`, `sasl.mechanism=SCRAM-SHA-512`,
    /// `ssl.ca.location=/etc/kafka/ca.pem`); put secrets in the `--config`
    /// file (`kafka_properties = [...]`), not on the command line.
    #[arg(long = "kafka-property")]
    pub kafka_properties: Option<Vec<String>>,
    /// Writer tasks; each owns the ledger partitions of a hash range of (subject, route). Default 16.
    /// Each shard has one batch in flight; the log groups concurrent shards' batches
    /// into one synced write, so more shards put more work behind each fsync.
    #[arg(long, env = "RESERVOIR_WRITER_SHARDS")]
    pub writer_shards: Option<usize>,
    /// Most commands one writer decides into one appended batch. Default 512.
    #[arg(long, env = "RESERVOIR_MAX_BATCH_COMMANDS")]
    pub max_batch_commands: Option<usize>,
    /// How often the lease/execution-limit sweeper looks for due reservations, ms. Default 1000.
    #[arg(long, env = "RESERVOIR_SWEEP_INTERVAL_MS")]
    pub sweep_interval_ms: Option<u64>,
    /// How often partitions with debt or below their burst are sent a Refill, ms. Default 1000.
    #[arg(long, env = "RESERVOIR_REFILL_INTERVAL_MS")]
    pub refill_interval_ms: Option<u64>,
    /// Largest request body accepted, bytes. Default 65536.
    #[arg(long, env = "RESERVOIR_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// After SIGTERM, how long open connections get to finish their requests
    /// before they are closed, ms. Default 10000. Commands already handed to
    /// a writer are decided and appended either way; a caller cut off retries
    /// with the same id.
    #[arg(long, env = "RESERVOIR_SHUTDOWN_GRACE_MS")]
    pub shutdown_grace_ms: Option<u64>,
    /// Cluster mode (with `--log kafka`): join this Kafka consumer group on the
    /// topic; the partitions the group assigns to this node are the ones it
    /// writes. Every node of one cluster names the same group.
    #[arg(long, env = "RESERVOIR_CLUSTER_GROUP")]
    pub cluster_group: Option<String>,
    /// Cluster mode: the URL other nodes reach this node's HTTP API at.
    /// Default `http://<listen>`.
    #[arg(long, env = "RESERVOIR_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// Cluster mode: the other nodes' URLs, comma separated (this node's own is ignored).
    #[arg(long, env = "RESERVOIR_PEERS", value_delimiter = ',')]
    pub peers: Option<Vec<String>>,
    /// Cluster mode: this node's name in status and claims. Default `<hostname>-<pid>`.
    #[arg(long, env = "RESERVOIR_NODE_ID")]
    pub node_id: Option<String>,
    /// Cluster mode: consumer-group session timeout, ms: a node silent this long
    /// loses its partitions. Default 10000.
    #[arg(long, env = "RESERVOIR_SESSION_TIMEOUT_MS")]
    pub session_timeout_ms: Option<u64>,
    /// Partitions of the topic when `reservoir` has to create it. Default 8.
    #[arg(long, env = "RESERVOIR_TOPIC_PARTITIONS")]
    pub topic_partitions: Option<u32>,
    /// Embedded log only: write a local snapshot of the ledger state this often
    /// (and at shutdown), so a restart replays only the log after it. 0 = never. Default 30.
    #[arg(long, env = "RESERVOIR_SNAPSHOT_INTERVAL_SECS")]
    pub snapshot_interval_secs: Option<u64>,
    /// Delete the projection's record of a reservation this long after it
    /// finished (log time); the log keeps it, `reservoir-replay` answers from
    /// it. 0 or unset = keep every record (about 600 bytes of disk each).
    #[arg(long, env = "RESERVOIR_PROJECTION_RETENTION_SECS")]
    pub projection_retention_secs: Option<u64>,
    /// Emergency shards: the ed25519 signing key file (64 hex digits, mode
    /// 0600). Default `<data-dir>/shard-signing.key`, generated on first start.
    #[arg(long, env = "RESERVOIR_SHARD_KEY_FILE")]
    pub shard_key_file: Option<PathBuf>,
    /// Emergency shards: how long after a shard's expiry a reconcile still
    /// remints its unused units, ms. Default 3600000 (1 h).
    #[arg(long, env = "RESERVOIR_SHARD_RECONCILE_GRACE_MS")]
    pub shard_reconcile_grace_ms: Option<u64>,
    /// TLS certificate chain (PEM) for the HTTP listener; with `--tls-key`.
    #[arg(long, env = "RESERVOIR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for the HTTP listener; with `--tls-cert`.
    #[arg(long, env = "RESERVOIR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Tokens file (TOML, SHA-256 hashes only; `reservoir token create` writes it).
    /// Default `<data-dir>/tokens.toml` if it exists; without one authentication is off,
    /// which only a loopback listen address allows.
    #[arg(long, env = "RESERVOIR_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Serve WITHOUT AUTHENTICATION even on a non-loopback address: anyone who
    /// reaches the port may publish policies and mint capacity.
    #[arg(long, env = "RESERVOIR_INSECURE_NO_AUTH")]
    #[serde(default)]
    pub insecure_no_auth: bool,
    /// Answer `/metrics` without a token.
    #[arg(long, env = "RESERVOIR_METRICS_PUBLIC")]
    #[serde(default)]
    pub metrics_public: bool,
    /// Cluster mode: file holding the node credential every node of the cluster
    /// shares (forwarded requests carry it and the original principal).
    #[arg(long, env = "RESERVOIR_NODE_TOKEN_FILE")]
    pub node_token_file: Option<PathBuf>,
    /// How often the tokens file is looked at for changes, ms. Default 1000.
    #[arg(long, env = "RESERVOIR_TOKENS_RELOAD_INTERVAL_MS")]
    pub tokens_reload_interval_ms: Option<u64>,
    /// When no tokens file exists yet: create `<data-dir>/tokens.toml` with an
    /// operator token and write the token to `<data-dir>/operator.token`
    /// (owner-only). `scripts/run` passes it.
    #[arg(long, env = "RESERVOIR_CREATE_OPERATOR_TOKEN")]
    #[serde(default)]
    pub create_operator_token: bool,
}

/// Which log `reservoir project` follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProjectLogKind {
    /// The embedded log of a running `reservoir serve` (`--log-dir`), read as
    /// a RocksDB secondary instance: no lock taken, nothing written to it.
    Embedded,
    /// A Kafka topic on `--brokers`, read through the log's fence rule.
    Kafka,
}

/// `reservoir project`: same precedence as `serve` (flag, `RESERVOIR_*`
/// environment, `--config` TOML file, default). The data directory and the
/// listen address have their own variables (`RESERVOIR_PROJECTOR_*`), so a
/// projector started in a server's environment does not take the server's
/// directory or port; the log settings share the server's.
#[derive(Clone, Debug, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectArgs {
    /// TOML file with any of the settings below (flags and environment win).
    #[arg(long, env = "RESERVOIR_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Directory of the projection database (`<data-dir>/projections`), not
    /// the server's. Default `./reservoir-projector`.
    #[arg(long, env = "RESERVOIR_PROJECTOR_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// HTTP listen address of the query API. Default `127.0.0.1:8081`.
    #[arg(long, env = "RESERVOIR_PROJECTOR_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Log to follow: `embedded` (default) or `kafka`.
    #[arg(long, value_enum, env = "RESERVOIR_LOG")]
    pub log: Option<ProjectLogKind>,
    /// With `--log embedded`: the server's embedded log directory
    /// (`<server data-dir>/log`), or the server's data directory itself.
    /// Default `./reservoir-data/log`.
    #[arg(long, env = "RESERVOIR_LOG_DIR")]
    pub log_dir: Option<PathBuf>,
    /// Kafka bootstrap servers (`HOST:PORT[,HOST:PORT]`), with `--log kafka`.
    #[arg(long, env = "RESERVOIR_BROKERS")]
    pub brokers: Option<String>,
    /// Kafka topic, with `--log kafka`. Default `reservoir.events`.
    #[arg(long, env = "RESERVOIR_TOPIC")]
    pub topic: Option<String>,
    /// A librdkafka security setting for every Kafka client, `KEY=VALUE`;
    /// repeat for several. Only `security.protocol`, `sasl.*` and `ssl.*`
    /// (e.g. `security.protocol=SASL_SSL`, `sasl.mechanism=SCRAM-SHA-512`,
    /// `ssl.ca.location=/etc/kafka/ca.pem`); put secrets in the `--config`
    /// file (`kafka_properties = [...]`), not on the command line.
    #[arg(long = "kafka-property")]
    pub kafka_properties: Option<Vec<String>>,
    /// As `reservoir serve --projection-retention-secs`.
    #[arg(long, env = "RESERVOIR_PROJECTION_RETENTION_SECS")]
    pub projection_retention_secs: Option<u64>,
    /// TLS certificate chain (PEM) for the HTTP listener; with `--tls-key`.
    #[arg(long, env = "RESERVOIR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for the HTTP listener; with `--tls-cert`.
    #[arg(long, env = "RESERVOIR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Tokens file (TOML, SHA-256 hashes only; `reservoir token create` writes it).
    /// Without one authentication is off, which only a loopback listen address allows.
    #[arg(long, env = "RESERVOIR_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Serve WITHOUT AUTHENTICATION even on a non-loopback address.
    #[arg(long, env = "RESERVOIR_INSECURE_NO_AUTH")]
    #[serde(default)]
    pub insecure_no_auth: bool,
    /// Answer `/metrics` without a token.
    #[arg(long, env = "RESERVOIR_METRICS_PUBLIC")]
    #[serde(default)]
    pub metrics_public: bool,
}

/// Resolved settings of `reservoir project`.
#[derive(Clone, Debug)]
pub struct ProjectConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub log: ProjectSource,
    pub projection_retention: Option<Duration>,
    pub auth: AuthConfig,
    /// `Some`: TLS on the listener (see [`crate::tls`]).
    pub tls: Option<TlsFiles>,
    /// librdkafka security settings (see [`kafka_properties`]).
    pub kafka_properties: Vec<(String, String)>,
}

/// `--projection-retention-secs`: 0 or none keeps every record.
fn retention(secs: Option<u64>) -> Option<Duration> {
    secs.filter(|s| *s > 0).map(Duration::from_secs)
}

/// The log a projector follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProjectSource {
    /// An embedded log directory (the one holding RocksDB's `CURRENT`).
    Embedded {
        log_dir: PathBuf,
    },
    Kafka {
        brokers: String,
        topic: String,
    },
}

impl ProjectArgs {
    /// Reads `--config` if given and resolves every setting.
    pub fn resolve(self) -> Result<ProjectConfig, String> {
        let file = match &self.config {
            Some(path) => read_toml::<ProjectArgs>(path)?,
            None => ProjectArgs::default(),
        };
        let data_dir = self
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from("./reservoir-projector"));
        let listen = self
            .listen
            .or(file.listen)
            .unwrap_or_else(|| "127.0.0.1:8081".parse().expect("valid default address"));
        let log = match self.log.or(file.log).unwrap_or(ProjectLogKind::Embedded) {
            ProjectLogKind::Kafka => {
                if self.log_dir.is_some() || file.log_dir.is_some() {
                    return Err("--log-dir is for --log embedded, not kafka".to_string());
                }
                let brokers = self
                    .brokers
                    .or(file.brokers)
                    .filter(|b| !b.trim().is_empty())
                    .ok_or("--log kafka needs --brokers HOST:PORT")?;
                let topic = self
                    .topic
                    .or(file.topic)
                    .unwrap_or_else(|| Config::default().topic);
                if topic.is_empty() {
                    return Err("--topic must not be empty".to_string());
                }
                ProjectSource::Kafka { brokers, topic }
            }
            ProjectLogKind::Embedded => {
                if self.brokers.is_some() || file.brokers.is_some() {
                    return Err(
                        "--brokers is for --log kafka; the embedded log is read from --log-dir"
                            .to_string(),
                    );
                }
                let given = self
                    .log_dir
                    .or(file.log_dir)
                    .unwrap_or_else(|| Config::default().data_dir.join("log"));
                // A server's data directory names its log directory `log`.
                let log_dir =
                    if !given.join("CURRENT").exists() && given.join("log/CURRENT").exists() {
                        given.join("log")
                    } else {
                        given
                    };
                if same_dir(&data_dir, &log_dir)
                    || same_dir(&data_dir, log_dir.parent().unwrap_or(Path::new(".")))
                {
                    return Err(format!(
                        "--data-dir {} is the server's data directory; the projector needs its own (the server keeps its projection database there)",
                        data_dir.display()
                    ));
                }
                ProjectSource::Embedded { log_dir }
            }
        };
        let kafka_properties = kafka_properties(self.kafka_properties.or(file.kafka_properties))?;
        let tls = tls_files(
            self.tls_cert.or(file.tls_cert),
            self.tls_key.or(file.tls_key),
        )?;
        Ok(ProjectConfig {
            data_dir,
            listen,
            log,
            tls,
            kafka_properties,
            projection_retention: retention(
                self.projection_retention_secs
                    .or(file.projection_retention_secs),
            ),
            auth: AuthConfig {
                tokens_file: self.tokens_file.or(file.tokens_file),
                insecure_no_auth: self.insecure_no_auth || file.insecure_no_auth,
                metrics_public: self.metrics_public || file.metrics_public,
                ..AuthConfig::default()
            },
        })
    }
}

/// `KEY=VALUE` librdkafka settings, only the security ones (`security.protocol`,
/// `sasl.*`, `ssl.*`): the others are the log's to choose.
pub fn kafka_properties(raw: Option<Vec<String>>) -> Result<Vec<(String, String)>, String> {
    raw.unwrap_or_default()
        .iter()
        .map(|item| {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("--kafka-property {item:?} is not KEY=VALUE"))?;
            let key = key.trim();
            let security =
                key == "security.protocol" || key.starts_with("sasl.") || key.starts_with("ssl.");
            if !security || value.is_empty() {
                return Err(format!(
                    "--kafka-property {key}: only security.protocol, sasl.* and ssl.* with a value"
                ));
            }
            Ok((key.to_string(), value.to_string()))
        })
        .collect()
}

/// `--tls-cert` and `--tls-key`: both or neither.
fn tls_files(cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<Option<TlsFiles>, String> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles { cert, key })),
        (None, None) => Ok(None),
        _ => Err("--tls-cert and --tls-key go together".to_string()),
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Fully resolved settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub log: LogKind,
    pub brokers: Option<String>,
    pub topic: String,
    pub writer_shards: usize,
    pub max_batch_commands: usize,
    pub sweep_interval: Duration,
    pub refill_interval: Duration,
    pub max_body_bytes: usize,
    /// After the shutdown signal, the longest the listener waits for open
    /// connections (see [`crate::tls::serve`]).
    pub shutdown_grace: Duration,
    /// `None`: no snapshots (always for logs other than the embedded one).
    pub snapshot_interval: Option<Duration>,
    /// `Some`: the projections' retention rule (see `ProjectorConfig::retention`).
    pub projection_retention: Option<Duration>,
    /// `Some`: cluster mode (see [`crate::cluster`]).
    pub cluster: Option<ClusterConfig>,
    pub topic_partitions: u32,
    /// `None`: `<data_dir>/shard-signing.key` (see `crate::shards::signing`).
    pub shard_key_file: Option<PathBuf>,
    /// After a shard's expiry plus this, a reconcile remints nothing (see `crate::shards`).
    pub shard_reconcile_grace: Duration,
    /// Tokens, node credential, and whether running open is allowed (see [`crate::auth`]).
    pub auth: AuthConfig,
    /// `Some`: TLS on the listener (see [`crate::tls`]).
    pub tls: Option<TlsFiles>,
    /// librdkafka security settings for every Kafka client (see [`kafka_properties`]).
    pub kafka_properties: Vec<(String, String)>,
}

/// Cluster-mode settings.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub group: String,
    pub advertise_url: String,
    pub peers: Vec<String>,
    pub node_id: String,
    pub session_timeout: Duration,
}

/// Upper bounds on the tunables: a limit has a name and a unit.
pub const MAX_WRITER_SHARDS: usize = 256;
pub const MAX_BATCH_COMMANDS_LIMIT: usize = 16_384;
pub const MAX_BODY_BYTES_LIMIT: usize = 1 << 20;
pub const MAX_TOPIC_PARTITIONS: u32 = 1_024;
pub const MAX_PEERS: usize = 64;

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./reservoir-data"),
            listen: "127.0.0.1:8080".parse().expect("valid default address"),
            log: LogKind::Embedded,
            brokers: None,
            topic: "reservoir.events".to_string(),
            writer_shards: 16,
            max_batch_commands: 512,
            sweep_interval: Duration::from_millis(1_000),
            refill_interval: Duration::from_millis(1_000),
            max_body_bytes: 64 * 1024,
            shutdown_grace: crate::tls::DEFAULT_SHUTDOWN_GRACE,
            // A restart replays at most this much of the log after the snapshot
            // (about 2 s at 10,000 cycles/s, see bench-results/bounded-state.md).
            snapshot_interval: Some(Duration::from_secs(30)),
            projection_retention: None,
            cluster: None,
            topic_partitions: 8,
            shard_key_file: None,
            shard_reconcile_grace: Duration::from_secs(3_600),
            auth: AuthConfig::default(),
            tls: None,
            kafka_properties: Vec::new(),
        }
    }
}

impl ServeArgs {
    /// Reads `--config` if given and resolves every setting.
    pub fn resolve(self) -> Result<Config, String> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => ServeArgs::default(),
        };
        let base = Config::default();
        let listen = self.listen.or(file.listen).unwrap_or(base.listen);
        let cluster = self
            .cluster_group
            .or(file.cluster_group)
            .map(|group| ClusterConfig {
                group,
                advertise_url: self
                    .advertise_url
                    .or(file.advertise_url)
                    .unwrap_or_else(|| format!("http://{listen}")),
                peers: self.peers.or(file.peers).unwrap_or_default(),
                node_id: self
                    .node_id
                    .or(file.node_id)
                    .unwrap_or_else(|| format!("{}-{}", crate::hostname(), std::process::id())),
                session_timeout: Duration::from_millis(
                    self.session_timeout_ms
                        .or(file.session_timeout_ms)
                        .unwrap_or(10_000),
                ),
            });
        let kafka_properties =
            kafka_properties(self.kafka_properties.clone().or(file.kafka_properties))?;
        let tls = tls_files(
            self.tls_cert.clone().or(file.tls_cert),
            self.tls_key.clone().or(file.tls_key),
        )?;
        let config = Config {
            kafka_properties,
            tls,
            data_dir: self.data_dir.or(file.data_dir).unwrap_or(base.data_dir),
            listen,
            log: self.log.or(file.log).unwrap_or(base.log),
            brokers: self.brokers.or(file.brokers),
            topic: self.topic.or(file.topic).unwrap_or(base.topic),
            writer_shards: self
                .writer_shards
                .or(file.writer_shards)
                .unwrap_or(base.writer_shards),
            max_batch_commands: self
                .max_batch_commands
                .or(file.max_batch_commands)
                .unwrap_or(base.max_batch_commands),
            sweep_interval: self
                .sweep_interval_ms
                .or(file.sweep_interval_ms)
                .map(Duration::from_millis)
                .unwrap_or(base.sweep_interval),
            refill_interval: self
                .refill_interval_ms
                .or(file.refill_interval_ms)
                .map(Duration::from_millis)
                .unwrap_or(base.refill_interval),
            max_body_bytes: self
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(base.max_body_bytes),
            shutdown_grace: self
                .shutdown_grace_ms
                .or(file.shutdown_grace_ms)
                .map(Duration::from_millis)
                .unwrap_or(base.shutdown_grace),
            snapshot_interval: match self.snapshot_interval_secs.or(file.snapshot_interval_secs) {
                Some(0) => None,
                Some(secs) => Some(Duration::from_secs(secs)),
                None => base.snapshot_interval,
            },
            projection_retention: retention(
                self.projection_retention_secs
                    .or(file.projection_retention_secs),
            )
            .or(base.projection_retention),
            cluster,
            topic_partitions: self
                .topic_partitions
                .or(file.topic_partitions)
                .unwrap_or(base.topic_partitions),
            shard_key_file: self.shard_key_file.or(file.shard_key_file),
            shard_reconcile_grace: self
                .shard_reconcile_grace_ms
                .or(file.shard_reconcile_grace_ms)
                .map(Duration::from_millis)
                .unwrap_or(base.shard_reconcile_grace),
            auth: AuthConfig {
                tokens_file: self.tokens_file.or(file.tokens_file),
                insecure_no_auth: self.insecure_no_auth || file.insecure_no_auth,
                metrics_public: self.metrics_public || file.metrics_public,
                node_token_file: self.node_token_file.or(file.node_token_file),
                reload_interval: self
                    .tokens_reload_interval_ms
                    .or(file.tokens_reload_interval_ms)
                    .map(Duration::from_millis),
                create_operator_token: self.create_operator_token || file.create_operator_token,
            },
        };
        config.validate()?;
        Ok(config)
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_WRITER_SHARDS).contains(&self.writer_shards) {
            return Err(format!("writer-shards must be 1..={MAX_WRITER_SHARDS}"));
        }
        if !(1..=MAX_BATCH_COMMANDS_LIMIT).contains(&self.max_batch_commands) {
            return Err(format!(
                "max-batch-commands must be 1..={MAX_BATCH_COMMANDS_LIMIT}"
            ));
        }
        if !(1024..=MAX_BODY_BYTES_LIMIT).contains(&self.max_body_bytes) {
            return Err(format!(
                "max-body-bytes must be 1024..={MAX_BODY_BYTES_LIMIT}"
            ));
        }
        for (name, d) in [
            ("sweep-interval-ms", self.sweep_interval),
            ("refill-interval-ms", self.refill_interval),
            ("shutdown-grace-ms", self.shutdown_grace),
            (
                "tokens-reload-interval-ms",
                self.auth
                    .reload_interval
                    .unwrap_or(crate::auth::DEFAULT_RELOAD_INTERVAL),
            ),
        ] {
            if d.is_zero() || d > Duration::from_secs(3_600) {
                return Err(format!("{name} must be 1..=3600000"));
            }
        }
        if self.log == LogKind::Kafka && self.brokers.is_none() {
            return Err("--log kafka needs --brokers HOST:PORT".to_string());
        }
        if !(1..=MAX_TOPIC_PARTITIONS).contains(&self.topic_partitions) {
            return Err(format!(
                "topic-partitions must be 1..={MAX_TOPIC_PARTITIONS}"
            ));
        }
        if self.shard_reconcile_grace > Duration::from_secs(7 * 24 * 3_600) {
            return Err("shard-reconcile-grace-ms must be at most 604800000 (7 days)".to_string());
        }
        if let Some(cluster) = &self.cluster {
            if self.tls.is_some() {
                // Peers reach each other over the advertised http:// URLs.
                return Err("--tls-cert is not supported in cluster mode yet: terminate TLS in front of the nodes".to_string());
            }
            if self.log != LogKind::Kafka {
                return Err("--cluster-group needs --log kafka".to_string());
            }
            if cluster.group.is_empty() || cluster.node_id.is_empty() {
                return Err("cluster group and node id must not be empty".to_string());
            }
            if !cluster.advertise_url.starts_with("http://") {
                return Err("advertise-url must be http://HOST:PORT".to_string());
            }
            if cluster.peers.len() > MAX_PEERS
                || cluster.peers.iter().any(|p| !p.starts_with("http://"))
            {
                return Err(format!("peers: at most {MAX_PEERS} http:// URLs"));
            }
            let ms = cluster.session_timeout.as_millis();
            if !(1_000..=300_000).contains(&ms) {
                return Err("session-timeout-ms must be 1000..=300000".to_string());
            }
        }
        Ok(())
    }
}

fn read_file(path: &Path) -> Result<ServeArgs, String> {
    read_toml(path)
}

fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("invalid config {}: {e}", path.display()))
}
