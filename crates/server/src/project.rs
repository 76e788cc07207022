//! `reservoir project`: the projector and the query API alone, in their own
//! process, following a log that other processes write.
//!
//! - `--log kafka`: the topic, through the fence rule like every reader. The
//!   process waits for the topic to exist rather than creating it, and reads
//!   through [`ReadOnly`], an `EventReader` only: a projector can never
//!   write a record or a claim, so it can never fence a writer.
//! - `--log embedded`: a running `reservoir serve`'s log directory, opened as a
//!   RocksDB *secondary* instance ([`SecondaryLog`]): no lock is taken (the
//!   server keeps its primary open), nothing is written to it, and new entries
//!   appear as the secondary catches up with the primary's write-ahead log.
//!
//! The projection database is `<data-dir>/projections` (the projector's own
//! data directory, never the server's). The process serves the query routes
//! of [`crate::queries`], `/healthz`, `/readyz` (200 once the projection is
//! open), `/metrics` and `/openapi.json` until SIGTERM or Ctrl-C.

use std::future::Future;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use rdkafka::consumer::{BaseConsumer, Consumer};
use reservoir_core::PartitionKey;
use reservoir_log::embedded::SecondaryLog;
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::{EventReader, LogEntry, LogError, Position};

use crate::api::{self, AppState};
use crate::config::{ProjectConfig, ProjectSource};
use crate::problem::ApiError;
use crate::{queries, telemetry};

/// Directory of the secondary instance's own files under `--data-dir`.
pub const SECONDARY_DIR: &str = "log-secondary";
/// How often a projector waiting for its Kafka topic to exist looks again.
pub const TOPIC_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Runs the projector and the query API until `shutdown` resolves.
pub async fn run(
    config: ProjectConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| format!("cannot create {}: {e}", config.data_dir.display()))?;
    match config.log.clone() {
        ProjectSource::Kafka { brokers, topic } => {
            let log = connect_kafka(&brokers, &topic, &config.kafka_properties).await?;
            serve(config, Arc::new(ReadOnly(log)), shutdown).await
        }
        ProjectSource::Embedded { log_dir } => {
            let secondary = config.data_dir.join(SECONDARY_DIR);
            let log = SecondaryLog::open(&log_dir, &secondary).map_err(|e| match e {
                LogError::Invalid(reason) => {
                    format!("{reason}; point --log-dir at a running server's <data-dir>/log")
                }
                e => e.to_string(),
            })?;
            tracing::info!(log_dir = %log_dir.display(), "following the embedded log as a RocksDB secondary");
            serve(config, Arc::new(log), shutdown).await
        }
    }
}

async fn serve<L: EventReader>(
    config: ProjectConfig,
    log: Arc<L>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let auth = crate::auth::Auth::open(&config.auth, config.listen, &config.data_dir)?;
    let tls = config.tls.as_ref().map(crate::tls::acceptor).transpose()?;
    crate::warn_clear_tokens(&auth, tls.is_some(), config.listen);
    auth.watch(crate::auth::DEFAULT_RELOAD_INTERVAL);
    let state = AppState::new(telemetry::install());
    let projector = queries::spawn(
        log,
        &config.data_dir,
        config.projection_retention,
        state.queries().clone(),
    );
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "projector listening");
    let grace = crate::tls::DEFAULT_SHUTDOWN_GRACE;
    let served = crate::tls::serve(listener, tls, router(state, auth), shutdown, grace).await;
    projector.stop().await;
    tracing::info!("stopped");
    served
}

/// The query routes plus health, readiness, metrics and the OpenAPI document;
/// every write route is absent (404), since this process never writes.
pub fn router(state: AppState, auth: Arc<crate::auth::Auth>) -> Router {
    let metrics_public = auth.metrics_public();
    let metrics = match auth.metrics_public() {
        true => get(api::metrics_text),
        false => crate::auth::require(crate::auth::METRICS, get(api::metrics_text)),
    };
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", metrics)
        .route("/openapi.json", get(move || openapi_json(metrics_public)))
        .merge(queries::routes())
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such resource (a projector serves only the query API)",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            auth,
            crate::auth::authenticate,
        ))
        .with_state(state)
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.queries().is_live() {
        Json(serde_json::json!({"status": "ready"})).into_response()
    } else {
        let mut e = ApiError::unavailable("opening the projection database");
        e.retry_after_s = Some(1);
        e.into_response()
    }
}

async fn openapi_json(metrics_public: bool) -> Response {
    use utoipa::OpenApi;
    let mut doc = queries::QueriesDoc::openapi();
    crate::auth::openapi::declare(&mut doc, metrics_public);
    Json(crate::openapi::constrained(doc)).into_response()
}

/// Connects to `topic` once it exists; never creates it (the writers do, with
/// their partition count).
async fn connect_kafka(
    brokers: &str,
    topic: &str,
    security: &[(String, String)],
) -> Result<KafkaLog, String> {
    let boot = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let reader_id = format!(
        "projector-{}-{}#{boot}",
        crate::hostname(),
        std::process::id()
    );
    let mut config = KafkaConfig::new(brokers, reader_id);
    config.client_overrides = security.to_vec();
    config.topic = topic.to_string();
    config.reader_fetch_min_bytes = KafkaConfig::FOLLOWER_FETCH_MIN_BYTES;
    let mut waiting_since: Option<Instant> = None;
    loop {
        let probe = config.clone();
        let partitions = tokio::task::spawn_blocking(move || topic_partitions(&probe))
            .await
            .map_err(|e| e.to_string())?;
        match partitions {
            Ok(n) if n > 0 => break,
            Ok(_) => {
                if waiting_since.is_none() {
                    tracing::warn!(%topic, "topic does not exist yet; waiting for a writer to create it");
                    waiting_since = Some(Instant::now());
                }
            }
            Err(err) => tracing::warn!(%err, "cannot read topic metadata; retrying"),
        }
        tokio::time::sleep(TOPIC_POLL_INTERVAL).await;
    }
    // The topic exists, so this does not create it.
    KafkaLog::connect(config)
        .await
        .map_err(|e| format!("cannot connect to Kafka: {e}"))
}

/// Partitions of the topic (0 when it does not exist), without creating it.
fn topic_partitions(config: &KafkaConfig) -> Result<usize, String> {
    let mut client = rdkafka::ClientConfig::new();
    client
        .set("bootstrap.servers", &config.brokers)
        .set("allow.auto.create.topics", "false")
        .set("log_level", "3");
    for (key, value) in &config.client_overrides {
        client.set(key, value);
    }
    let consumer: BaseConsumer = client.create().map_err(|e| format!("kafka client: {e}"))?;
    let metadata = consumer
        .fetch_metadata(Some(&config.topic), config.request_timeout)
        .map_err(|e| format!("metadata of {}: {e}", config.topic))?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == config.topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len()))
}

/// A log seen through reads only: an [`EventReader`] and not an
/// [`reservoir_log::EventLog`], so a projector cannot write a record or a
/// claim (and cannot fence a writer) through it.
pub struct ReadOnly<L>(pub L);

impl<L: EventReader> EventReader for ReadOnly<L> {
    fn log_partition_for(&self, key: &PartitionKey) -> u32 {
        self.0.log_partition_for(key)
    }

    fn log_partitions(&self) -> u32 {
        self.0.log_partitions()
    }

    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        self.0.read(log_partition, from_offset, max).await
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        self.0.end_offset(log_partition).await
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        self.0.wait_for(log_partition, offset, timeout).await
    }
}
