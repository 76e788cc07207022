//! One Kafka partition owned by this node: claim it, rebuild its ledger
//! partitions from the log up to the claim, then serve it with its own writer
//! shards, sweeper and API router, until it is revoked or the log says the
//! claim is lost.
//!
//! The writer, recovery and API code are the single-node ones, unchanged: they
//! run over [`OnePartition`], a view of the Kafka log that shows one partition
//! as log partition 0 (positions keep the real partition number, so receipts
//! name it). A take-over that fails (broker down, lost claim race) retries with
//! backoff while the group still assigns the partition here; one whose claim is
//! lost later stops, and is retried only after the group had time to move it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reservoir_core::PartitionKey;
use reservoir_log::kafka::KafkaLog;
use reservoir_log::{Claim, EventLog, EventReader, LogEntry, LogError, Position, Record};
use tokio::sync::watch;

use super::{Node, SlotState};
use crate::writer::{self, Writers};
use crate::{api, app, recovery, sweeper, telemetry};

/// Longest wait between two take-over attempts of one partition.
pub const TAKE_OVER_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// A Kafka log seen as its partition `p` alone (log partition 0 here).
pub struct OnePartition {
    log: KafkaLog,
    p: u32,
    /// One past the last offset this node read (recovery) or appended: how far
    /// its state reaches into the partition.
    applied_to: AtomicU64,
    /// Told when an append is fenced or in doubt: the state must be rebuilt.
    trouble: watch::Sender<Option<String>>,
}

impl OnePartition {
    pub fn new(log: KafkaLog, p: u32) -> Self {
        OnePartition {
            log,
            p,
            applied_to: AtomicU64::new(0),
            trouble: watch::channel(None).0,
        }
    }

    pub fn applied_to(&self) -> u64 {
        self.applied_to.load(Ordering::Relaxed)
    }

    fn note(&self, offset: u64) {
        self.applied_to.fetch_max(offset + 1, Ordering::Relaxed);
    }
}

impl EventReader for OnePartition {
    fn log_partition_for(&self, _key: &PartitionKey) -> u32 {
        0
    }

    fn log_partitions(&self) -> u32 {
        1
    }

    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        assert_eq!(log_partition, 0, "a one-partition view");
        let entries = self.log.read(self.p, from_offset, max).await?;
        if let Some((last, _)) = entries.last() {
            self.note(last.offset);
        }
        Ok(entries)
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        assert_eq!(log_partition, 0, "a one-partition view");
        self.log.end_offset(self.p).await
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        assert_eq!(log_partition, 0, "a one-partition view");
        self.log.wait_for(self.p, offset, timeout).await
    }
}

impl EventLog for OnePartition {
    /// As the Kafka log's: the records are with the producer when `append`
    /// returns (the writer pipelines on it).
    fn ordered_appends(&self) -> bool {
        self.log.ordered_appends()
    }

    async fn confirm_claim(&self, log_partition: u32, claim: &Claim) -> Result<(), LogError> {
        assert_eq!(log_partition, 0, "a one-partition view");
        let confirmed = self.log.confirm_claim(self.p, claim).await;
        if let Err(err @ LogError::Fenced { .. }) = &confirmed {
            self.trouble.send_replace(Some(err.to_string()));
        }
        confirmed
    }

    fn append(
        &self,
        batch: Vec<Record>,
    ) -> impl std::future::Future<Output = Result<Vec<Position>, LogError>> + Send {
        let stray = batch
            .iter()
            .find(|r| self.log.log_partition_for(&r.key) != self.p)
            .map(|stray| {
                LogError::Invalid(format!(
                    "{} does not belong to log partition {}",
                    stray.key, self.p
                ))
            });
        // Called now, not when first polled: that fixes the batch's place in the log.
        let appended = match stray {
            Some(refused) => Err(refused),
            None => Ok(self.log.append(batch)),
        };
        async move {
            match appended?.await {
                Ok(positions) => {
                    if let Some(last) = positions.last() {
                        self.note(last.offset);
                    }
                    Ok(positions)
                }
                Err(err) => {
                    if matches!(err, LogError::Fenced { .. } | LogError::InDoubt { .. }) {
                        self.trouble.send_replace(Some(err.to_string()));
                    }
                    Err(err)
                }
            }
        }
    }
}

/// A partition this node serves.
pub struct Owned {
    pub log_partition: u32,
    pub claim_epoch: u64,
    pub router: axum::Router,
    pub writers: Writers,
    pub view: Arc<OnePartition>,
    pub serving_since: Instant,
    pub recovered_records: u64,
}

/// Claims `p`, recovers it and serves it; retries while `attempt` is current.
pub async fn take_over(node: Arc<Node>, p: u32, attempt: u64) {
    let mut backoff = Duration::from_millis(200);
    loop {
        match try_take_over(&node, p, attempt).await {
            Ok(()) => return,
            Err(err) => {
                tracing::warn!(log_partition = p, %err, "take-over failed; retrying");
                if node
                    .with_slot(p, attempt, |slot| slot.last_error = Some(err.clone()))
                    .is_none()
                {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(TAKE_OVER_BACKOFF_MAX);
            }
        }
    }
}

async fn try_take_over(node: &Arc<Node>, p: u32, attempt: u64) -> Result<(), String> {
    let started = Instant::now();
    let claim = node.log.claim(p).await.map_err(|e| format!("claim: {e}"))?;
    node.with_slot(p, attempt, |slot| slot.claim_epoch = Some(claim.epoch))
        .ok_or("revoked while claiming")?;
    let view = Arc::new(OnePartition::new(node.log.clone(), p));
    let shards = node.config.writer_shards;
    let recovered = recovery::recover(&*view, shards, None, &node.retired)
        .await
        .map_err(|e| format!("recovery: {e}"))?;
    let records = recovered.records;
    let index = Arc::new(std::sync::RwLock::new(recovered.index));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (fatal_tx, mut fatal_rx) = watch::channel(None::<String>);
    let state = app::AppState::new(telemetry::install());
    // Emergency shards only with a configured key (see `Node::shards`).
    if let Some(shards) = &node.shards {
        state.set_shards(shards.clone());
    }
    // Sizing reads the node's projection of the whole topic, and the
    // estimator settings older versions kept beside the log, as one node does.
    state.queries().share(&node.queries);
    state.estimators().set_dir(&node.config.data_dir);
    let clock = crate::clock::system();
    node.gauged.lock().expect("gauged").insert(p);
    let (writers, shard_tasks) = writer::spawn(writer::WriterSetup {
        gauge_partition: Some(p),
        log: view.clone(),
        states: recovered.shards,
        index,
        retired: node.retired.clone(),
        writer_id: node.writer_id.clone(),
        claim_epochs: vec![claim.epoch],
        max_batch_commands: node.config.max_batch_commands,
        stop: stop_rx.clone(),
        fatal: fatal_tx,
        in_doubt: None,
        clock: clock.clone(),
        sizer: state.sizer(),
    });
    let sweeper = tokio::spawn(sweeper::run(
        writers.clone(),
        clock,
        node.config.sweep_interval,
        node.config.refill_interval,
        stop_rx,
    ));
    state.set_ready(writers.clone());
    let owned = Arc::new(Owned {
        log_partition: p,
        claim_epoch: claim.epoch,
        router: api::router(state, node.config.max_body_bytes, node.auth.clone()),
        writers,
        view: view.clone(),
        serving_since: Instant::now(),
        recovered_records: records,
    });
    let mut tasks: Vec<_> = shard_tasks.iter().map(|t| t.abort_handle()).collect();
    tasks.push(sweeper.abort_handle());
    let installed = node.with_slot(p, attempt, |slot| {
        slot.state = SlotState::Serving(owned);
        slot.since = Instant::now();
        slot.last_error = None;
        slot.tasks.extend(tasks.iter().cloned());
    });
    if installed.is_none() {
        for task in tasks {
            task.abort();
        }
        return Ok(());
    }
    tracing::info!(
        log_partition = p,
        epoch = claim.epoch,
        records,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "took over partition: serving"
    );
    // Serve until the log says the claim is lost or in doubt. (Revocation
    // aborts this task together with the writers.)
    let mut trouble = view.trouble.subscribe();
    let reason = tokio::select! {
        r = fatal_rx.wait_for(|f| f.is_some()) => r.map(|r| r.clone().unwrap_or_default()).unwrap_or_else(|_| "writer stopped".into()),
        r = trouble.wait_for(|t| t.is_some()) => r.map(|r| r.clone().unwrap_or_default()).unwrap_or_else(|_| "log view dropped".into()),
    };
    let _ = stop_tx.send(true);
    let fenced = reason.contains("fenced");
    tracing::warn!(log_partition = p, %reason, fenced, "stopped deciding for partition");
    let still = node.with_slot(p, attempt, |slot| {
        for task in slot.tasks.drain(1..) {
            task.abort();
        }
        slot.state = if fenced {
            SlotState::Fenced
        } else {
            SlotState::TakingOver
        };
        slot.since = Instant::now();
        slot.last_error = Some(reason.clone());
    });
    if still.is_none() {
        return Ok(());
    }
    // In doubt: rebuild at once. Fenced: another node claimed it, so the group
    // is moving it (or this node was paused); give the group time to say so
    // before claiming it back, which would fence that node in turn.
    let wait = if fenced {
        node.cluster.session_timeout * 2
    } else {
        Duration::from_millis(200)
    };
    tokio::time::sleep(wait).await;
    if node.with_slot(p, attempt, |_| ()).is_some() {
        node.start_take_over(p);
    }
    Ok(())
}
