//! # reservoir-server
//!
//! The `reservoir` binary's library: everything between HTTP and the event log.
//!
//! - [`writer`]: shard tasks, each the single writer of its ledger partitions. A
//!   shard decides a batch of queued commands with `reservoir_core::decide`,
//!   appends the batch with one `EventLog::append` (group commit), and replies only
//!   after the log acknowledged; a failed append undoes the batch (503, retryable).
//! - [`recovery`]: rebuilds the shards from the log before the server is ready.
//! - [`sweeper`]: lease expiry, hard execution limit and refill, by sending commands.
//! - [`api`]: the command routes, problem+json errors ([`problem`]) and the
//!   OpenAPI document; [`views`]: what they answer; [`app`]: the state every
//!   handler shares.
//! - [`clock`]: the only source of time; [`sizing`]: how a reserve without
//!   units is sized, behind the `Sizer` the writer calls.
//! - [`queries`]: the read side: a projector following the same log into
//!   `<data-dir>/projections`, and the query endpoints over it (`?min_position=`).
//! - [`auth`]: bearer tokens, principals and scopes, checked on every route
//!   and passed along between cluster nodes.
//! - [`tls`]: optional TLS (rustls) on the HTTP listener.
//! - [`telemetry`]: Prometheus metrics. [`config`]: flags, environment, TOML file.
//! - [`cluster`]: several nodes on one Kafka topic (consumer-group ownership,
//!   claims, routing between nodes, `GET /v1/cluster`); every node also runs
//!   the projector over the whole topic and answers the queries itself.
//! - [`project`]: `reservoir project`, the projector and query API alone,
//!   following a Kafka topic or a running server's embedded log read-only.
//!
//! [`start`] runs a server on any [`EventLog`] until its shutdown future resolves;
//! the binary passes SIGTERM/Ctrl-C, tests pass a channel; [`start_with_clock`]
//! the same on a given clock. `README.md` beside `src/` follows one reserve
//! through these modules, hop by hop.

pub mod api;
pub mod app;
pub mod auth;
pub mod bodies;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod memory;
pub mod openapi;
pub mod problem;
pub mod project;
pub mod queries;
pub mod ratelimit;
pub mod recovery;
pub mod shards;
pub mod sizing;
pub mod snapshot;
pub mod sweeper;
pub mod telemetry;
pub mod tls;
pub mod views;
pub mod writer;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use reservoir_log::EventLog;
use tokio::sync::watch;

pub use config::Config;

/// This machine's name (`/etc/hostname`), for writer and node ids.
pub fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "node".into())
}

/// A server started by [`start`].
pub struct RunningServer {
    pub addr: SocketAddr,
    /// Resolves when the server stopped (after the shutdown future resolved and
    /// every writer finished its batch), with an error if recovery failed.
    pub done: tokio::task::JoinHandle<Result<(), String>>,
}

/// Binds, answers `/healthz` at once and `/readyz` with 503 while it recovers
/// from `log`, then serves until `shutdown` resolves. `writer_id` and the
/// claim epoch the writer holds in each log partition (`claim_epochs[p]`) are
/// stamped on every record; claim the log before calling this, so recovery
/// reads up to and including the claim.
pub async fn start<L: EventLog>(
    config: Config,
    log: Arc<L>,
    writer_id: String,
    claim_epochs: Vec<u64>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, String> {
    start_with_clock(
        config,
        log,
        writer_id,
        claim_epochs,
        clock::system(),
        shutdown,
    )
    .await
}

/// [`start`] on a given clock: every time the writer records and every
/// "is it due" the sweepers ask comes from it (tests drive a
/// [`clock::ManualClock`]).
pub async fn start_with_clock<L: EventLog>(
    config: Config,
    log: Arc<L>,
    writer_id: String,
    claim_epochs: Vec<u64>,
    clock: clock::SharedClock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, String> {
    config.validate()?;
    let auth = auth::Auth::open(&config.auth, config.listen, &config.data_dir)?;
    let tls = config.tls.as_ref().map(tls::acceptor).transpose()?;
    warn_clear_tokens(&auth, tls.is_some(), config.listen);
    let retired = Arc::new(writer::RetiredIndex::open(
        &config.data_dir.join("retired"),
    )?);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let state = app::AppState::new(telemetry::install());
    state.set_shards(app::ShardSettings::load(&config)?);
    auth.watch(
        config
            .auth
            .reload_interval
            .unwrap_or(auth::DEFAULT_RELOAD_INTERVAL),
    );
    let app = api::router(state.clone(), config.max_body_bytes, auth);
    state.estimators().set_dir(&config.data_dir);
    // The read side follows the same log in its own database.
    let projector = queries::spawn(
        log.clone(),
        &config.data_dir,
        config.projection_retention,
        state.queries().clone(),
    );
    let grace = config.shutdown_grace;
    let http = tokio::spawn(async move { tls::serve(listener, tls, app, shutdown, grace).await });

    let serving = async move {
        let mut claim_epochs = claim_epochs;
        let mut http = http;
        // Runs until shutdown or a fatal log error; after a log partition was
        // left in doubt by a failed append, re-claims the log and runs again
        // on state rebuilt from it (the records that landed count).
        loop {
            let started = std::time::Instant::now();
            // The last snapshot this process wrote, each time: at start, and
            // after a re-claim, as a restart would. Its cut holds only
            // committed state (a shard left in doubt never answers a
            // snapshot), so the log after it, the in-doubt records included
            // if they landed, completes it.
            let snapshot = config
                .snapshot_interval
                .and_then(|_| snapshot::read(&config.data_dir));
            let recovered =
                match recovery::recover(&*log, config.writer_shards, snapshot, &retired).await {
                    Ok(r) => r,
                    Err(err) => {
                        tracing::error!(%err, "recovery failed; not ready");
                        http.abort();
                        return Err(format!("recovery failed: {err}"));
                    }
                };
            tracing::info!(
                records = recovered.records,
                events = recovered.events,
                skipped = recovered.skipped_records,
                evicted = recovered.evicted,
                in_memory = recovered.index.len(),
                from_snapshot = recovered.from_snapshot,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "recovered from the log"
            );
            let (stop_tx, stop_rx) = watch::channel(false);
            let (fatal_tx, mut fatal_rx) = watch::channel(None::<String>);
            let (in_doubt_tx, mut in_doubt_rx) = watch::channel(None::<String>);
            let index = Arc::new(std::sync::RwLock::new(recovered.index));
            let counted = Arc::downgrade(&index);
            telemetry::count_in_memory(move || {
                counted.upgrade().map_or(0, |index| {
                    index.read().unwrap_or_else(|e| e.into_inner()).len()
                })
            });
            let snapshots = config.snapshot_interval.map(|every| Snapshotter {
                retired: retired.clone(),
                log: log.clone(),
                data_dir: config.data_dir.clone(),
                writer_id: writer_id.clone(),
                claim_epochs: claim_epochs.clone(),
                every,
            });
            let (writers, shard_tasks) = writer::spawn(writer::WriterSetup {
                gauge_partition: None,
                log: log.clone(),
                states: recovered.shards,
                index,
                retired: retired.clone(),
                writer_id: writer_id.clone(),
                claim_epochs: claim_epochs.clone(),
                max_batch_commands: config.max_batch_commands,
                stop: stop_rx.clone(),
                fatal: fatal_tx,
                in_doubt: Some(in_doubt_tx),
                clock: clock.clone(),
                sizer: state.sizer(),
            });
            let sweeper = tokio::spawn(sweeper::run(
                writers.clone(),
                clock.clone(),
                config.sweep_interval,
                config.refill_interval,
                stop_rx.clone(),
            ));
            let periodic = snapshots
                .clone()
                .map(|s| tokio::spawn(s.run(writers.clone(), stop_rx.clone())));
            state.set_ready(writers);

            // Shutdown: HTTP stops taking connections and waits for in-flight
            // requests (each waits for its batch); then sweepers and writers stop,
            // writers after deciding and appending everything already queued.
            // A fatal log error stops the server too (crash-only: a restart reopens
            // the log and recovers); the batch that hit it was already answered 503.
            let mut in_doubt = None;
            let served = tokio::select! {
                r = &mut http => r.map_err(|e| e.to_string()).and_then(|r| r),
                failed = fatal_rx.wait_for(|f| f.is_some()) => {
                    let reason = match failed {
                        Ok(reason) => reason.clone().unwrap_or_default(),
                        Err(_) => "a writer task ended unexpectedly".to_string(),
                    };
                    tracing::error!(%reason, "log failed; stopping so a restart can recover from the log");
                    http.abort();
                    Err(format!("log failed: {reason}"))
                }
                doubt = in_doubt_rx.wait_for(|f| f.is_some()) => {
                    in_doubt = Some(match doubt {
                        Ok(reason) => reason.clone().unwrap_or_default(),
                        Err(_) => "a writer task ended unexpectedly".to_string(),
                    });
                    Ok(())
                }
            };
            state.set_not_ready();
            let _ = stop_tx.send(true);
            let _ = sweeper.await;
            if let Some(periodic) = periodic {
                let _ = periodic.await;
            }
            let mut states = Vec::new();
            for task in shard_tasks {
                match task.await {
                    Ok(state) => states.push(state),
                    Err(err) => return Err(format!("writer task failed: {err}")),
                }
            }
            if let Some(reason) = in_doubt {
                // The writers are stopped (their state dropped): take the log
                // again and rebuild from it.
                tracing::warn!(%reason, "log in doubt after a failed append; re-claiming and rebuilding from the log");
                metrics::counter!("reservoir_log_reclaims_total").increment(1);
                for p in 0..log.log_partitions() {
                    match log.reclaim(p).await {
                        Ok(claim) if claim.writer_id == writer_id => {
                            if let Some(epoch) = claim_epochs.get_mut(p as usize) {
                                *epoch = claim.epoch;
                            }
                        }
                        Ok(claim) => {
                            http.abort();
                            return Err(format!(
                                "re-claimed log partition {p} as {} instead of {writer_id}",
                                claim.writer_id
                            ));
                        }
                        Err(err) => {
                            tracing::error!(%err, "cannot re-claim the log; stopping");
                            http.abort();
                            return Err(format!("log failed: {reason}; re-claim failed: {err}"));
                        }
                    }
                }
                continue;
            }
            // Every writer has stopped: the log's end is an exact cut.
            if let (Some(s), true) = (snapshots, served.is_ok()) {
                let parts: Vec<_> = states.iter().map(snapshot::capture).collect();
                if let Err(err) = s.write(parts).await {
                    tracing::warn!(%err, "no snapshot at shutdown");
                }
            }
            tracing::info!("stopped");
            return served;
        }
    };
    let done = tokio::spawn(async move {
        let served = serving.await;
        // The projection database closes before `done` resolves, so a restart
        // in the same process can open it again.
        projector.stop().await;
        served
    });
    Ok(RunningServer { addr, done })
}

/// Bearer tokens over plain HTTP beyond loopback can be read on the way.
pub fn warn_clear_tokens(auth: &auth::Auth, tls: bool, listen: SocketAddr) {
    if auth.enabled() && !tls && !listen.ip().is_loopback() {
        tracing::warn!(%listen, "bearer tokens travel in clear: give --tls-cert and --tls-key, or terminate TLS in front of this server");
    }
}

/// Writes local snapshots of the writers' state (see [`snapshot`]).
struct Snapshotter<L> {
    /// Synced before every snapshot: what a snapshot no longer holds in memory
    /// must be on disk.
    retired: Arc<writer::RetiredIndex>,
    log: Arc<L>,
    data_dir: std::path::PathBuf,
    writer_id: String,
    claim_epochs: Vec<u64>,
    every: std::time::Duration,
}

impl<L> Clone for Snapshotter<L> {
    fn clone(&self) -> Self {
        Snapshotter {
            retired: self.retired.clone(),
            log: self.log.clone(),
            data_dir: self.data_dir.clone(),
            writer_id: self.writer_id.clone(),
            claim_epochs: self.claim_epochs.clone(),
            every: self.every,
        }
    }
}

type Captured = (
    Vec<snapshot::SnapPartition>,
    Vec<(String, String, reservoir_core::PartitionKey)>,
);

impl<L: EventLog> Snapshotter<L> {
    async fn run(self, writers: writer::Writers, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let mut parts = Vec::new();
            // The cut is read before any shard is asked (see `snapshot`).
            let cuts = match self.cuts().await {
                Ok(c) => c,
                Err(err) => {
                    tracing::warn!(%err, "snapshot skipped");
                    continue;
                }
            };
            let mut complete = true;
            for shard in 0..writers.shards() {
                match writers.call(shard, writer::Request::Snapshot).await {
                    Ok(writer::Answer::Snapshot(state)) => parts.push(snapshot::capture(&state)),
                    _ => complete = false,
                }
            }
            if complete {
                if let Err(err) = self.write_with(cuts, parts).await {
                    tracing::warn!(%err, "snapshot failed");
                }
            }
        }
    }

    async fn cuts(&self) -> Result<Vec<snapshot::Cut>, String> {
        let mut cuts = Vec::new();
        for p in 0..self.log.log_partitions() {
            cuts.push(snapshot::Cut {
                log_partition: p,
                next_offset: self.log.end_offset(p).await.map_err(|e| e.to_string())?,
                claim_writer_id: self.writer_id.clone(),
                claim_epoch: self.claim_epochs.get(p as usize).copied().unwrap_or(0),
            });
        }
        Ok(cuts)
    }

    async fn write(&self, parts: Vec<Captured>) -> Result<(), String> {
        let cuts = self.cuts().await?;
        self.write_with(cuts, parts).await
    }

    async fn write_with(
        &self,
        cuts: Vec<snapshot::Cut>,
        parts: Vec<Captured>,
    ) -> Result<(), String> {
        let mut snap = snapshot::Snapshot {
            format: snapshot::FORMAT.to_string(),
            cuts,
            partitions: Vec::new(),
            active: Vec::new(),
        };
        for (partitions, active) in parts {
            snap.partitions.extend(partitions);
            snap.active.extend(active);
        }
        let dir = self.data_dir.clone();
        let started = std::time::Instant::now();
        let retired = self.retired.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            retired.sync().map_err(std::io::Error::other)?;
            snapshot::write(&dir, &snap)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        tracing::info!(
            bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshot written"
        );
        Ok(())
    }
}
