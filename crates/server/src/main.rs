//! `reservoir`: the command line entry point. `reservoir serve` claims the log,
//! recovers the ledger from it (embedded RocksDB log in `--data-dir` by default;
//! `--log kafka --brokers HOST:PORT` for one node on a Kafka topic, which claims
//! every partition of the topic; add `--cluster-group NAME` to run as one of
//! several nodes sharing the topic, see `reservoir_server::cluster`) and serves
//! the HTTP API until SIGTERM or Ctrl-C, finishing the batch in flight.
//! `reservoir project` runs only the projector and the query API, following a
//! Kafka topic or a running server's embedded log without writing to it (see
//! `reservoir_server::project`).
//! `reservoir cluster status --url URL` prints a node's view of the cluster.
//! `reservoir token create` makes a bearer token (see `reservoir_server::auth`).
//!
//! A panic anywhere aborts the process: a broken invariant must crash, and
//! recovery from the log is the only restart path (crash-only).

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use reservoir_log::embedded::EmbeddedLog;
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::EventReader;
use reservoir_server::config::{Cli, CliCommand, ClusterCommand, Config, LogKind};
use reservoir_server::hostname;

/// Every request allocates a little (JSON, headers, event strings) on two or
/// more threads at once; mimalloc's thread-local heaps cost a fraction of
/// glibc malloc's there (malloc and free were ~15% of the server's CPU under
/// `scripts/bench-http`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RESERVOIR_LOG_LEVEL")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));

    let cli = Cli::parse();
    if matches!(cli.command, CliCommand::Serve(_) | CliCommand::Project(_)) {
        reservoir_server::memory::start_trimming();
    }
    let args = match cli.command {
        CliCommand::Serve(args) => *args,
        CliCommand::Project(args) => {
            let config = match args.resolve() {
                Ok(c) => c,
                Err(err) => {
                    eprintln!("reservoir: {err}");
                    return ExitCode::from(2);
                }
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            // shutdown_signal() installs its handlers, so it runs inside the runtime.
            return match runtime
                .block_on(async { reservoir_server::project::run(config, shutdown_signal()).await })
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("reservoir: {err}");
                    ExitCode::FAILURE
                }
            };
        }
        CliCommand::Token(command) => {
            return match reservoir_server::auth::cli::run(command) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("reservoir: {err}");
                    ExitCode::FAILURE
                }
            };
        }
        CliCommand::Cluster(ClusterCommand::Status { url, json, token }) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            return match runtime.block_on(reservoir_server::cluster::status::print(
                &url,
                json,
                token.as_deref(),
            )) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("reservoir: {err}");
                    ExitCode::FAILURE
                }
            };
        }
    };
    let config = match args.resolve() {
        Ok(c) => c,
        Err(err) => {
            eprintln!("reservoir: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("reservoir: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(mut config: Config) -> Result<(), String> {
    if config.auth.create_operator_token
        && config.auth.tokens_file.is_none()
        && !config.auth.insecure_no_auth
    {
        reservoir_server::auth::cli::create_operator_token(&config.data_dir)?;
    }
    if config.log != LogKind::Embedded {
        // Snapshots assume this process alone writes the log.
        config.snapshot_interval = None;
    }
    let writer_id = format!("reservoir-{}-{}", hostname(), std::process::id());
    let server = match config.log {
        LogKind::Embedded => {
            let path = config.data_dir.join("log");
            std::fs::create_dir_all(&path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            let log = EmbeddedLog::open(&path, writer_id).map_err(|e| e.to_string())?;
            // Claim before recovery, so recovery reads up to and including the claim.
            let claim = log
                .claim(0)
                .await
                .map_err(|e| format!("cannot claim the embedded log: {e}"))?;
            tracing::info!(path = %path.display(), epoch = claim.epoch, "claimed the embedded log");
            let log = Arc::new(log);
            reservoir_server::start(
                config.clone(),
                log,
                claim.writer_id,
                vec![claim.epoch],
                shutdown_signal(),
            )
            .await?
        }
        LogKind::Kafka if config.cluster.is_some() => {
            return reservoir_server::cluster::run(config, shutdown_signal()).await;
        }
        LogKind::Kafka => {
            let brokers = config
                .brokers
                .clone()
                .ok_or("--log kafka needs --brokers HOST:PORT")?;
            let mut kafka = KafkaConfig::new(brokers, writer_id.clone());
            kafka.client_overrides = config.kafka_properties.clone();
            kafka.topic = config.topic.clone();
            kafka.partitions_for_new_topic = config.topic_partitions;
            let log = KafkaLog::connect(kafka)
                .await
                .map_err(|e| format!("cannot connect to Kafka: {e}"))?;
            log.check_placement().await.map_err(|e| e.to_string())?;
            // One node owns every log partition: claim each before recovery.
            let mut epochs = Vec::new();
            for p in 0..log.log_partitions() {
                let claim = log
                    .claim(p)
                    .await
                    .map_err(|e| format!("cannot claim log partition {p}: {e}"))?;
                epochs.push(claim.epoch);
            }
            tracing::info!(topic = %config.topic, partitions = epochs.len(), "claimed every Kafka log partition");
            reservoir_server::start(
                config.clone(),
                Arc::new(log),
                writer_id,
                epochs,
                shutdown_signal(),
            )
            .await?
        }
        LogKind::Memory => {
            let log = Arc::new(reservoir_log::memory::MemoryLog::new());
            let claim = log.claim(&writer_id);
            reservoir_server::start(
                config.clone(),
                log,
                writer_id,
                vec![claim.epoch],
                shutdown_signal(),
            )
            .await?
        }
    };
    tracing::info!(addr = %server.addr, log = ?config.log, data_dir = %config.data_dir.display(), "listening");
    server.done.await.map_err(|e| e.to_string())?
}

/// SIGTERM or Ctrl-C (SIGINT). The handlers are installed when this is
/// called, inside the runtime and before the listener opens, not when the
/// future is first polled: the server polls it from a task spawned after the
/// listener is bound, and a signal in between would kill the process with
/// the default action instead of shutting it down (the likely cause of a CI
/// run where a server stopped right after its first answers "exited with
/// signal: 15").
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let (mut interrupt, mut terminate) = signals;
            let interrupted = async {
                match interrupt.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending::<()>().await,
                }
            };
            let terminated = async {
                match terminate.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = interrupted => {}
                _ = terminated => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown signal: finishing the batch in flight");
    }
}
