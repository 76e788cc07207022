//! Cluster mode: several `reservoir` nodes sharing one Kafka topic
//! (`reservoir serve --log kafka --cluster-group NAME`).
//!
//! - **Ownership** ([`membership`]): every node joins one Kafka consumer group on
//!   the event topic; the Kafka partitions the group assigns to a node are the
//!   ones it writes. On assignment it claims each partition
//!   ([`reservoir_log::kafka::KafkaLog::claim`]), rebuilds that partition's
//!   ledger partitions from the log up to its claim (the ordinary
//!   [`crate::recovery`] path over a one-partition view, [`owned::OnePartition`])
//!   and only then serves it; on revocation it stops routing requests to it at
//!   once and aborts its writer tasks. Whatever is lost in a race is caught by
//!   the log's fencing: a writer acknowledges a batch only after reading it back
//!   with no foreign claim before it.
//! - **Routing** ([`routing`]): any node accepts any request. Reserve, publish and
//!   policy reads name a subject and route, which fix the Kafka partition
//!   ([`reservoir_log::kafka::log_partition_of_route`]); requests by reservation
//!   id are resolved through the local writers, a cache of ids this node routed,
//!   and then by asking the live peers (`GET /v1/cluster/locate/{id}`). A request
//!   for a partition owned elsewhere is forwarded over HTTP to the owner with an
//!   `x-reservoir-hops` count (at most [`routing::MAX_HOPS`]); while a partition
//!   has no serving owner the caller gets a retryable 503 with `Retry-After`.
//! - **Status** ([`status`]): nodes learn each other's partitions by polling
//!   their peers' `GET /v1/cluster/node` (the `--peers` list); `GET /v1/cluster`
//!   and `reservoir cluster status` show nodes, partitions, claim epochs and lag.
//! - **Gauges** ([`gauges`]): the node's in-memory reservations and its
//!   emergency-shard gauges (labelled by log partition) follow the
//!   partitions it serves.
//!
//! - **Queries**: every node runs the projector over the whole topic (every
//!   Kafka partition, through the fence rule like any reader, so it does not
//!   matter which node wrote what) into `<data-dir>/projections`, on its own
//!   Kafka connection, and answers the query endpoints of [`crate::queries`]
//!   from it, locally: queries are never forwarded, and `?min_position=`
//!   (a write's `LP:OFFSET`, whichever node wrote it) waits for this node's
//!   projection. The partitions' routers share that projection for sizing.
//!   `reservoir project` ([`crate::project`]) runs the same projector alone.

pub mod gate;
pub mod gauges;
pub mod membership;
pub mod owned;
pub mod routing;
pub mod status;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use reservoir_core::ReservationId;
use reservoir_log::kafka::{BrokerQuirks, KafkaConfig, KafkaLog};
use reservoir_log::EventReader;

use crate::config::{ClusterConfig, Config};

/// Reservation ids this node remembers routing (id → Kafka partition). Past
/// this it forgets them all and asks the owners again.
pub const ID_CACHE_MAX_ENTRIES: usize = 1 << 20;

/// What a node does with one Kafka partition assigned to it.
pub enum SlotState {
    /// Claiming and rebuilding state: requests get 503 with Retry-After.
    TakingOver,
    /// Deciding: requests go to `owned`.
    Serving(Arc<owned::Owned>),
    /// Lost to a newer claim while the group still assigned it here (a zombie
    /// that woke up): requests get 503 until the group moves the partition.
    Fenced,
}

pub struct Slot {
    /// Increases with every take-over attempt, so a stale attempt never installs.
    pub attempt: u64,
    pub state: SlotState,
    pub since: Instant,
    pub claim_epoch: Option<u64>,
    pub last_error: Option<String>,
    /// Tasks to abort when the partition is revoked.
    pub tasks: Vec<tokio::task::AbortHandle>,
}

/// One node: its log client, its partitions, its view of the peers.
pub struct Node {
    pub config: Config,
    pub cluster: ClusterConfig,
    pub log: KafkaLog,
    pub writer_id: String,
    pub runtime: tokio::runtime::Handle,
    /// Partitions the consumer group currently assigns to this node.
    pub assigned: RwLock<BTreeSet<u32>>,
    pub slots: RwLock<HashMap<u32, Slot>>,
    pub peers: status::Peers,
    pub http: reqwest::Client,
    pub id_cache: Mutex<HashMap<ReservationId, Routed>>,
    /// Set once the node has had its first assignment from the group.
    pub joined: AtomicBool,
    /// Asks the membership thread to leave and rejoin the group (see
    /// [`membership::watchdog`]).
    pub rejoin: AtomicBool,
    pub rejoins: AtomicU64,
    next_attempt: AtomicU64,
    /// A not-ready router for `/healthz`, `/metrics`, `/openapi.json` and
    /// the queries.
    pub idle: axum::Router,
    /// This node's projection of the whole topic (see [`crate::queries`]).
    pub queries: crate::queries::QueryHandle,
    /// The idempotency index of every partition this node owns (ids are
    /// unique across the cluster); rewritten by each take-over's replay.
    pub retired: Arc<crate::writer::RetiredIndex>,
    pub started: Instant,
    /// Tokens and the node credential, shared by every router of the node.
    pub auth: Arc<crate::auth::Auth>,
    /// The emergency-shard key and grace, with `--shard-key-file` only:
    /// every node must sign and verify with the same key (one generated per
    /// data directory would not verify on the partition's next owner), so
    /// without it every shard route answers 501 `shards_not_in_cluster_mode`.
    pub shards: Option<crate::app::ShardSettings>,
    /// Partitions this node has served: their shard gauges are zeroed while
    /// it serves them no more (see [`gauges`]).
    pub gauged: Mutex<BTreeSet<u32>>,
}

impl Node {
    pub fn log_partitions(&self) -> u32 {
        self.log.log_partitions()
    }

    /// The serving state of a local partition, if this node decides for it.
    pub fn serving(&self, p: u32) -> Option<Arc<owned::Owned>> {
        match self.slots.read().expect("slots").get(&p) {
            Some(Slot {
                state: SlotState::Serving(owned),
                ..
            }) => Some(owned.clone()),
            _ => None,
        }
    }

    /// Whether this node is taking `p` over right now (so a caller should retry).
    pub fn holds_slot(&self, p: u32) -> bool {
        self.slots.read().expect("slots").contains_key(&p)
    }

    /// Rebalance: partitions newly assigned. Starts a take-over for each.
    pub fn on_assigned(self: &Arc<Self>, partitions: &[u32]) {
        self.joined.store(true, Ordering::Release);
        self.assigned
            .write()
            .expect("assigned")
            .extend(partitions.iter().copied());
        for &p in partitions {
            self.start_take_over(p);
        }
    }

    /// Rebalance: partitions revoked (or lost). Stops deciding for them before
    /// returning: they leave the routing table and their writer tasks are aborted
    /// (queued requests are answered 503 by the dropped reply channels).
    pub fn on_revoked(&self, partitions: &[u32]) {
        let mut assigned = self.assigned.write().expect("assigned");
        let mut slots = self.slots.write().expect("slots");
        for p in partitions {
            assigned.remove(p);
            if let Some(slot) = slots.remove(p) {
                for task in slot.tasks {
                    task.abort();
                }
                tracing::info!(
                    log_partition = p,
                    "partition revoked: stopped deciding for it"
                );
            }
        }
    }

    /// Begins (or restarts) taking over `p` if the group still assigns it here.
    pub fn start_take_over(self: &Arc<Self>, p: u32) {
        if !self.assigned.read().expect("assigned").contains(&p) {
            return;
        }
        let attempt = self.next_attempt.fetch_add(1, Ordering::Relaxed) + 1;
        let mut slots = self.slots.write().expect("slots");
        if let Some(old) = slots.remove(&p) {
            for task in old.tasks {
                task.abort();
            }
        }
        let task = self
            .runtime
            .spawn(owned::take_over(self.clone(), p, attempt));
        slots.insert(
            p,
            Slot {
                attempt,
                state: SlotState::TakingOver,
                since: Instant::now(),
                claim_epoch: None,
                last_error: None,
                tasks: vec![task.abort_handle()],
            },
        );
    }

    /// Runs `f` on the slot of `p` if it is still the one of `attempt`.
    pub fn with_slot<T>(&self, p: u32, attempt: u64, f: impl FnOnce(&mut Slot) -> T) -> Option<T> {
        let mut slots = self.slots.write().expect("slots");
        match slots.get_mut(&p) {
            Some(slot) if slot.attempt == attempt => Some(f(slot)),
            _ => None,
        }
    }

    pub fn remember_id(&self, id: ReservationId, routed: Routed) {
        let mut cache = self.id_cache.lock().expect("id cache");
        if cache.len() >= ID_CACHE_MAX_ENTRIES {
            cache.clear();
        }
        cache.insert(id, routed);
    }

    /// Where this node last routed `id`: its partition and subject.
    pub fn routed(&self, id: &ReservationId) -> Option<Routed> {
        self.id_cache.lock().expect("id cache").get(id).cloned()
    }
}

/// Where a reservation id went: its log partition, and its subject (a
/// caller that does not see the subject is not sent there by the id alone:
/// ids are chosen by clients, and another tenant's may be the same).
#[derive(Clone, Debug)]
pub struct Routed {
    pub log_partition: u32,
    pub subject: Arc<str>,
}

/// Runs a cluster node until `shutdown` resolves: connects to the topic, serves
/// HTTP, joins the group, and hands partitions over as the group decides.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    config.validate()?;
    let cluster = config.cluster.clone().ok_or("not in cluster mode")?;
    let brokers = config
        .brokers
        .clone()
        .ok_or("--log kafka needs --brokers HOST:PORT")?;
    // Unique per boot: a restarted node must not pass for its former self.
    let boot = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let writer_id = format!("{}@{}#{boot}", cluster.node_id, cluster.advertise_url);
    let mut kafka = KafkaConfig::new(brokers, writer_id.clone());
    kafka.client_overrides = config.kafka_properties.clone();
    kafka.topic = config.topic.clone();
    kafka.partitions_for_new_topic = config.topic_partitions;
    let log = KafkaLog::connect(kafka)
        .await
        .map_err(|e| format!("cannot connect to Kafka: {e}"))?;
    log.check_placement().await.map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // The projector reads through a connection of its own (its reads do not
    // move the writers' read-back consumers), under a reader id that never
    // claims; `ReadOnly` refuses appends.
    let mut reader = KafkaConfig::new(
        log.config().brokers.clone(),
        format!("projector-{writer_id}"),
    );
    reader.topic = config.topic.clone();
    reader.client_overrides = config.kafka_properties.clone();
    reader.reader_fetch_min_bytes = KafkaConfig::FOLLOWER_FETCH_MIN_BYTES;
    let reader = KafkaLog::connect(reader)
        .await
        .map_err(|e| format!("cannot connect the projector to Kafka: {e}"))?;
    if let Err(err) = std::fs::create_dir_all(&config.data_dir) {
        // The writers do not need it; the queries answer 503 until it exists.
        tracing::error!(%err, data_dir = %config.data_dir.display(), "cannot create the data directory for the projections");
    }
    // Read at start, so a bad key file stops the node here rather than
    // failing every take-over.
    let shards = config
        .shard_key_file
        .is_some()
        .then(|| crate::app::ShardSettings::load(&config))
        .transpose()
        .map_err(|e| format!("shard key: {e}"))?;
    let idle_state = crate::app::AppState::new(crate::telemetry::install());
    if let Some(shards) = &shards {
        // The public key on every node, even one that serves no partition.
        idle_state.set_shards(shards.clone());
    }
    let queries = idle_state.queries().clone();
    let projector = crate::queries::spawn(
        Arc::new(crate::project::ReadOnly(reader)),
        &config.data_dir,
        config.projection_retention,
        queries.clone(),
    );
    let auth = crate::auth::Auth::open(&config.auth, config.listen, &config.data_dir)?;
    crate::warn_clear_tokens(&auth, false, config.listen);
    if !auth.enabled() && auth.node_credential().is_some() {
        return Err("--node-token-file without a tokens file: with authentication off this node would forward every request to its peers as unrestricted; give every node --tokens-file too".to_string());
    }
    if auth.enabled() && auth.node_credential().is_none() {
        return Err("cluster mode with authentication needs --node-token-file (the credential nodes forward with; `reservoir token generate` makes one)".to_string());
    }
    auth.watch(
        config
            .auth
            .reload_interval
            .unwrap_or(crate::auth::DEFAULT_RELOAD_INTERVAL),
    );
    let idle = crate::api::router(idle_state, config.max_body_bytes, auth.clone());
    let retired = Arc::new(crate::writer::RetiredIndex::open(
        &config.data_dir.join("retired"),
    )?);
    // Every request to a peer carries the node credential (see `crate::auth::forward`).
    let mut peer_headers = reqwest::header::HeaderMap::new();
    if let Some(node) = auth.node_credential() {
        let mut value = reqwest::header::HeaderValue::from_str(&node.authorization())
            .map_err(|_| "the node token is not a valid header value".to_string())?;
        value.set_sensitive(true);
        peer_headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let http = reqwest::Client::builder()
        .default_headers(peer_headers)
        .pool_max_idle_per_host(64)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let peers = status::Peers::new(&cluster.peers, &cluster.advertise_url);
    let node = Arc::new(Node {
        config: config.clone(),
        cluster: cluster.clone(),
        log,
        writer_id,
        runtime: tokio::runtime::Handle::current(),
        assigned: RwLock::new(BTreeSet::new()),
        slots: RwLock::new(HashMap::new()),
        peers,
        http,
        id_cache: Mutex::new(HashMap::new()),
        joined: AtomicBool::new(false),
        rejoin: AtomicBool::new(false),
        rejoins: AtomicU64::new(0),
        next_attempt: AtomicU64::new(0),
        idle,
        queries,
        retired,
        started: Instant::now(),
        auth,
        shards,
        gauged: Mutex::new(BTreeSet::new()),
    });
    gauges::count_in_memory(&node);
    let app = routing::router(node.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let gossip = tokio::spawn(status::gossip(node.clone(), stop_rx.clone()));
    // A tansu workaround: on brokers that follow the protocol the group
    // reassigns a dead member's partitions by itself.
    let watchdog = (node.log.config().broker_quirks() == BrokerQuirks::Tansu)
        .then(|| tokio::spawn(membership::watchdog(node.clone(), stop_rx.clone())));
    let member = membership::join(node.clone())?;
    tracing::info!(%addr, node_id = %cluster.node_id, group = %cluster.group, advertise = %cluster.advertise_url, log_partitions = node.log_partitions(), "listening (cluster mode)");
    let served = crate::tls::serve(listener, None, app, shutdown, config.shutdown_grace).await;
    // Leave the group first, so the others take over without waiting for the
    // session to time out; leaving revokes (and aborts) every local partition.
    let _ = stop_tx.send(true);
    member.leave().await;
    let _ = gossip.await;
    if let Some(watchdog) = watchdog {
        let _ = watchdog.await;
    }
    projector.stop().await;
    tracing::info!("stopped");
    served
}
