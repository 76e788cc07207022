//! Partition ownership from a Kafka consumer group.
//!
//! Every node subscribes one consumer (group `--cluster-group`, client id
//! `reservoir@<advertised URL>`) to the event topic, with incremental
//! (`cooperative-sticky`) assignment: a membership change moves only the
//! partitions that must move, so only those are claimed and rebuilt, and a
//! node keeps deciding for the rest throughout the rebalance. (Eager `range`
//! assignment revoked every partition of every member on each change, and each
//! was claimed and replayed again.) Its rebalance callbacks tell the [`Node`]
//! what it got and what it lost, incrementally: revocation runs before
//! librdkafka gives the partitions up (the node stops deciding at once),
//! assignment after (the node claims and recovers). With tansu quirks the
//! eager `range` assignment stays: it is what tansu was tested with. The
//! consumer never reads records: assigned partitions are paused at once. A
//! dedicated thread polls it, which serves the callbacks and the heartbeats.
//!
//! **tansu 0.6 workaround** ([`watchdog`], run only with
//! `RESERVOIR_BROKER_QUIRKS=tansu`, see
//! [`reservoir_log::kafka::BrokerQuirks`]): when a member's session expires,
//! tansu starts a rebalance but, if the survivors rejoin with unchanged member
//! metadata, its SyncGroup hands back the *previous* generation's assignment,
//! so the dead member's partitions stay assigned to nobody alive. The watchdog
//! notices partitions that no live node (this one or a peer answering
//! `/v1/cluster/node`) holds for longer than twice the session timeout, and the
//! live node with the smallest id leaves and rejoins the group as a new member,
//! which makes tansu form a new generation from the leader's fresh assignment.
//! On Apache Kafka the group reassigns by itself; the watchdog does not run.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};
use reservoir_log::kafka::BrokerQuirks;
use tokio::sync::watch;

use super::Node;

/// How often the membership thread polls the consumer.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

struct GroupContext {
    node: Arc<Node>,
    /// Fault injection ([`REVOKE_DELAY_ENV`]): how long a *lost* assignment
    /// found on waking from a pause waits before this node stops deciding for
    /// it. Zero in production.
    lost_revoke_delay: std::time::Duration,
    /// Set by the poll loop when more than a session passed since its last
    /// poll (the process was paused); the next lost assignment clears it.
    woke_from_pause: std::sync::atomic::AtomicBool,
}

/// Environment variable (milliseconds) that delays acting on an assignment
/// lost while the process was paused: a fault injection for tests, standing
/// for a node whose revocation callback runs late after a pause (a stuck
/// thread, a VM freeze). Its
/// writers then keep appending under claims another node has taken over; the
/// log's fencing must keep every one of those records from counting and from
/// being acknowledged.
pub const REVOKE_DELAY_ENV: &str = "RESERVOIR_FAULT_LOST_REVOKE_DELAY_MS";

impl ClientContext for GroupContext {}

fn partitions(tpl: &TopicPartitionList) -> Vec<u32> {
    tpl.elements()
        .iter()
        .filter_map(|e| u32::try_from(e.partition()).ok())
        .collect()
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let lost = partitions(tpl);
                let woke = self.woke_from_pause.swap(false, Ordering::AcqRel);
                if woke && !self.lost_revoke_delay.is_zero() && consumer.assignment_lost() {
                    tracing::warn!(?lost, delay = ?self.lost_revoke_delay, "fault injection: acting late on a lost assignment");
                    std::thread::sleep(self.lost_revoke_delay);
                }
                tracing::info!(?lost, "group: partitions revoked");
                self.node.on_revoked(&lost);
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(err) => tracing::warn!(%err, "group: rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // The group only tells us what we own; records are read by the
            // writer's own log client.
            if let Err(err) = consumer.pause(tpl) {
                tracing::warn!(%err, "group: cannot pause assigned partitions");
            }
            let got = partitions(tpl);
            tracing::info!(?got, "group: partitions assigned");
            self.node.on_assigned(&got);
        }
    }
}

/// The running group membership; [`Membership::leave`] ends it.
pub struct Membership {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Membership {
    /// Leaves the group (revoking every local partition) and waits for it.
    pub async fn leave(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// The group's partition assignment: incremental, except on tansu (see the
/// module docs).
fn assignment_strategy(node: &Node) -> &'static str {
    match node.log.config().broker_quirks() {
        BrokerQuirks::Tansu => "range",
        BrokerQuirks::None => "cooperative-sticky",
    }
}

/// Joins the consumer group and starts the thread that polls it.
pub fn join(node: Arc<Node>) -> Result<Membership, String> {
    let session_ms = node.cluster.session_timeout.as_millis().max(1_000) as u64;
    let mut config = ClientConfig::new();
    config
        .set(
            "bootstrap.servers",
            node.config.brokers.clone().unwrap_or_default(),
        )
        .set("group.id", &node.cluster.group)
        .set(
            "client.id",
            format!("reservoir@{}", node.cluster.advertise_url),
        )
        .set("session.timeout.ms", session_ms.to_string())
        .set(
            "heartbeat.interval.ms",
            (session_ms / 10).max(100).to_string(),
        )
        .set(
            "max.poll.interval.ms",
            (session_ms * 2).max(10_000).to_string(),
        )
        .set("partition.assignment.strategy", assignment_strategy(&node))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "latest")
        .set("log_level", "4");
    for (key, value) in &node.config.kafka_properties {
        config.set(key, value);
    }
    let consumer: BaseConsumer<GroupContext> = config
        .create_with_context(GroupContext {
            node: node.clone(),
            lost_revoke_delay: std::env::var(REVOKE_DELAY_ENV)
                .ok()
                .and_then(|v| v.parse().ok())
                .map(std::time::Duration::from_millis)
                .unwrap_or_default(),
            woke_from_pause: std::sync::atomic::AtomicBool::new(false),
        })
        .map_err(|e| format!("cannot create the group consumer: {e}"))?;
    let topic = node.config.topic.clone();
    consumer
        .subscribe(&[&topic])
        .map_err(|e| format!("cannot subscribe to {topic}: {e}"))?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::Builder::new()
        .name("reservoir-group".into())
        .spawn(move || {
            let session = Duration::from_millis(session_ms);
            let mut last_poll = Instant::now();
            while !stopping.load(Ordering::Acquire) {
                if node.rejoin.swap(false, Ordering::AcqRel) {
                    tracing::warn!("group: leaving and rejoining as a new member");
                    consumer.unsubscribe();
                    if let Err(err) = consumer.subscribe(&[&topic]) {
                        tracing::error!(%err, "group: cannot subscribe again");
                    }
                    node.rejoins.fetch_add(1, Ordering::Relaxed);
                }
                if last_poll.elapsed() > session {
                    consumer
                        .context()
                        .woke_from_pause
                        .store(true, Ordering::Release);
                }
                if let Some(Err(err)) = consumer.poll(POLL_INTERVAL) {
                    tracing::debug!(%err, "group: poll");
                }
                last_poll = Instant::now();
            }
            // Unsubscribing revokes every partition (the callback stops them)
            // and leaves the group, so the others take over at once.
            consumer.unsubscribe();
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline && !node.assigned.read().expect("assigned").is_empty() {
                let _ = consumer.poll(POLL_INTERVAL);
            }
            drop(consumer);
        })
        .map_err(|e| e.to_string())?;
    Ok(Membership {
        stop,
        thread: Some(thread),
    })
}

/// Watches for partitions no live node holds (see the module docs) and asks
/// the membership thread to rejoin when this node is the one to fix it.
pub async fn watchdog(node: Arc<Node>, mut stop: watch::Receiver<bool>) {
    // The session must have expired on the broker before a rejoin can drop the
    // dead member; a peer counts as down after `PEER_ALIVE_FOR` already.
    let patience = node.cluster.session_timeout + Duration::from_secs(2);
    let mut orphaned_since: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if !node.joined.load(Ordering::Acquire) {
            continue;
        }
        let orphans = node.peers.orphans(&node);
        if orphans.is_empty() {
            orphaned_since = None;
            continue;
        }
        let since = *orphaned_since.get_or_insert_with(Instant::now);
        if since.elapsed() < patience || !node.peers.smallest_live_id(&node) {
            continue;
        }
        tracing::warn!(
            ?orphans,
            "partitions held by no live node; rejoining the group"
        );
        node.rejoin.store(true, Ordering::Release);
        orphaned_since = None;
    }
}
