//! What nodes know about each other, and how operators see it.
//!
//! - `GET /v1/cluster/node`: this node alone: its id, URL, writer id, the
//!   partitions the group assigns it, and for each its state (`taking_over`,
//!   `serving`, `fenced`), claim epoch and (with `?offsets=true`) the log end
//!   offset and lag (entries in the partition past what this node's state
//!   reaches: recovery progress while taking over, 0 while serving unless a
//!   foreign claim landed).
//! - `GET /v1/cluster`: every node (this one and each peer, asked now), every
//!   partition with its owner, and the partitions nobody serves.
//! - [`gossip`]: every [`GOSSIP_INTERVAL`] each node reads its peers'
//!   `/v1/cluster/node`; routing forwards to the peer that reports a partition
//!   serving with the highest claim epoch, and a peer silent for
//!   [`PEER_ALIVE_FOR`] counts as down. A request for a partition no known
//!   peer serves asks the peers again at once ([`refresh`]) before it is
//!   answered 503: right after a takeover the new owner serves before the next
//!   gossip round says so. `GET /v1/cluster` keeps what it heard too, so a
//!   node whose view shows a partition served also routes to its owner.
//! - [`print`]: `reservoir cluster status`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{Node, SlotState};

pub const GOSSIP_INTERVAL: Duration = Duration::from_millis(250);
pub const PEER_ALIVE_FOR: Duration = Duration::from_millis(1_500);
/// How long one peer status request may take.
pub const PEER_TIMEOUT: Duration = Duration::from_millis(1_000);

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartitionStatus {
    pub log_partition: u32,
    /// `taking_over`, `serving` or `fenced`.
    pub state: String,
    pub claim_epoch: Option<u64>,
    /// ms in this state.
    pub for_ms: u64,
    pub end_offset: Option<u64>,
    pub lag_entries: Option<u64>,
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node_id: String,
    pub url: String,
    pub writer_id: String,
    pub group: String,
    pub topic: String,
    pub log_partitions: u32,
    /// Whether the node has had its first assignment from the group.
    pub joined: bool,
    pub assigned: Vec<u32>,
    pub partitions: Vec<PartitionStatus>,
    /// Times this node left and rejoined the group to unstick an assignment.
    pub rejoins: u64,
    pub uptime_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeView {
    pub url: String,
    pub alive: bool,
    /// ms since this node last heard from it (0 for itself).
    pub last_seen_ms: Option<u64>,
    pub status: Option<NodeStatus>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartitionOwner {
    pub log_partition: u32,
    pub node_id: Option<String>,
    pub url: Option<String>,
    pub state: String,
    pub claim_epoch: Option<u64>,
    pub end_offset: Option<u64>,
    pub lag_entries: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterView {
    pub topic: String,
    pub log_partitions: u32,
    pub nodes: Vec<NodeView>,
    pub partitions: Vec<PartitionOwner>,
    /// Partitions no live node serves right now.
    pub unserved: Vec<u32>,
}

struct Peer {
    url: String,
    last_ok: Option<Instant>,
    status: Option<NodeStatus>,
    error: Option<String>,
}

/// The peers' last reported status.
pub struct Peers {
    peers: RwLock<Vec<Peer>>,
    /// When the last on-demand [`refresh`] started; one at a time, and callers
    /// that waited for a refresh started after they asked reuse its answers.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

impl Peers {
    pub fn new(urls: &[String], own_url: &str) -> Self {
        let own = own_url.trim_end_matches('/');
        let mut seen = BTreeSet::new();
        let peers = urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .filter(|u| u != own && seen.insert(u.clone()))
            .map(|url| Peer {
                url,
                last_ok: None,
                status: None,
                error: None,
            })
            .collect();
        Peers {
            peers: RwLock::new(peers),
            refreshed: tokio::sync::Mutex::new(None),
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.peers
            .read()
            .expect("peers")
            .iter()
            .map(|p| p.url.clone())
            .collect()
    }

    /// Statuses of the peers heard from recently.
    pub fn live(&self) -> Vec<NodeStatus> {
        self.peers
            .read()
            .expect("peers")
            .iter()
            .filter(|p| p.last_ok.is_some_and(|t| t.elapsed() < PEER_ALIVE_FOR))
            .filter_map(|p| p.status.clone())
            .collect()
    }

    /// The live peer serving `p` under the highest claim epoch.
    pub fn owner_of(&self, p: u32) -> Option<(String, u64)> {
        self.live()
            .into_iter()
            .filter_map(|s| {
                s.partitions
                    .iter()
                    .find(|ps| ps.log_partition == p && ps.state == "serving")
                    .map(|ps| (s.url.clone(), ps.claim_epoch.unwrap_or(0)))
            })
            .max_by_key(|(_, epoch)| *epoch)
    }

    /// Whether some live peer is taking `p` over (a caller should retry soon).
    pub fn anyone_holds(&self, p: u32) -> bool {
        self.live()
            .iter()
            .any(|s| s.partitions.iter().any(|ps| ps.log_partition == p))
    }

    /// Partitions assigned to no live node (this one included).
    pub fn orphans(&self, node: &Node) -> Vec<u32> {
        let mut held: BTreeSet<u32> = node.assigned.read().expect("assigned").clone();
        for s in self.live() {
            held.extend(s.assigned.iter().copied());
        }
        (0..node.log_partitions())
            .filter(|p| !held.contains(p))
            .collect()
    }

    /// Whether this node has the smallest id among the live nodes.
    pub fn smallest_live_id(&self, node: &Node) -> bool {
        self.live()
            .iter()
            .all(|s| node.cluster.node_id <= s.node_id)
    }

    fn record(&self, url: &str, result: Result<NodeStatus, String>) {
        let mut peers = self.peers.write().expect("peers");
        if let Some(peer) = peers.iter_mut().find(|p| p.url == url) {
            match result {
                Ok(status) => {
                    peer.last_ok = Some(Instant::now());
                    peer.status = Some(status);
                    peer.error = None;
                }
                Err(err) => peer.error = Some(err),
            }
        }
    }

    fn view(&self, url: &str) -> Option<(Option<Instant>, Option<String>)> {
        self.peers
            .read()
            .expect("peers")
            .iter()
            .find(|p| p.url == url)
            .map(|p| (p.last_ok, p.error.clone()))
    }
}

/// This node's status; with `offsets`, asks the log for each partition's end.
pub async fn local(node: &Node, offsets: bool) -> NodeStatus {
    let mut partitions = Vec::new();
    let views: Vec<_> = {
        let slots = node.slots.read().expect("slots");
        slots
            .iter()
            .map(|(p, slot)| {
                let (state, view) = match &slot.state {
                    SlotState::TakingOver => ("taking_over", None),
                    SlotState::Serving(owned) => ("serving", Some(owned.view.clone())),
                    SlotState::Fenced => ("fenced", None),
                };
                (
                    PartitionStatus {
                        log_partition: *p,
                        state: state.to_string(),
                        claim_epoch: slot.claim_epoch,
                        for_ms: slot.since.elapsed().as_millis() as u64,
                        end_offset: None,
                        lag_entries: None,
                        last_error: slot.last_error.clone(),
                    },
                    view,
                )
            })
            .collect()
    };
    for (mut status, view) in views {
        if offsets {
            let end = tokio::time::timeout(
                PEER_TIMEOUT,
                reservoir_log::EventReader::end_offset(&node.log, status.log_partition),
            )
            .await
            .ok()
            .and_then(Result::ok);
            status.end_offset = end;
            status.lag_entries = match (end, view) {
                (Some(end), Some(view)) => Some(end.saturating_sub(view.applied_to())),
                _ => None,
            };
        }
        partitions.push(status);
    }
    partitions.sort_by_key(|p| p.log_partition);
    NodeStatus {
        node_id: node.cluster.node_id.clone(),
        url: node.cluster.advertise_url.clone(),
        writer_id: node.writer_id.clone(),
        group: node.cluster.group.clone(),
        topic: node.config.topic.clone(),
        log_partitions: node.log_partitions(),
        joined: node.joined.load(std::sync::atomic::Ordering::Acquire),
        assigned: node
            .assigned
            .read()
            .expect("assigned")
            .iter()
            .copied()
            .collect(),
        partitions,
        rejoins: node.rejoins.load(std::sync::atomic::Ordering::Relaxed),
        uptime_ms: node.started.elapsed().as_millis() as u64,
    }
}

async fn fetch(
    http: &reqwest::Client,
    url: &str,
    offsets: bool,
    timeout: Duration,
) -> Result<NodeStatus, String> {
    let response = http
        .get(format!("{url}/v1/cluster/node?offsets={offsets}"))
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    response.json().await.map_err(|e| e.to_string())
}

/// Polls every peer's status until `stop`.
pub async fn gossip(node: Arc<Node>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(GOSSIP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        ask_peers(&node).await;
        super::gauges::zero_left_shards(&node);
    }
}

/// One round: every peer's status, asked now and recorded.
async fn ask_peers(node: &Node) {
    let mut tasks = tokio::task::JoinSet::new();
    for url in node.peers.urls() {
        let http = node.http.clone();
        tasks.spawn(async move {
            let result = fetch(&http, &url, false, PEER_TIMEOUT).await;
            (url, result)
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Ok((url, result)) = done {
            node.peers.record(&url, result);
        }
    }
}

/// Asks the peers now, outside the gossip rhythm (a request found no owner).
/// At most one round at a time; a caller that waited while a round started
/// after it asked takes that round's answers instead of starting another, so a
/// burst of requests during a takeover costs one round, not one each.
pub async fn refresh(node: &Node) {
    let asked = Instant::now();
    let mut last = node.peers.refreshed.lock().await;
    if last.is_some_and(|started| started >= asked) {
        return;
    }
    *last = Some(Instant::now());
    ask_peers(node).await;
}

/// `GET /v1/cluster`: this node and every peer, asked now.
pub async fn cluster(node: &Node) -> ClusterView {
    let mut nodes = vec![NodeView {
        url: node.cluster.advertise_url.clone(),
        alive: true,
        last_seen_ms: Some(0),
        status: Some(local(node, true).await),
        error: None,
    }];
    let mut tasks = tokio::task::JoinSet::new();
    for url in node.peers.urls() {
        let http = node.http.clone();
        tasks.spawn(async move {
            let result = fetch(&http, &url, true, Duration::from_secs(3)).await;
            (url, result)
        });
    }
    let mut answers = BTreeMap::new();
    while let Some(Ok((url, result))) = tasks.join_next().await {
        answers.insert(url, result);
    }
    for (url, result) in answers {
        let (last_ok, old_error) = node.peers.view(&url).unwrap_or((None, None));
        // Routing then knows what this view shows (the offsets do not matter
        // to it).
        node.peers.record(&url, result.clone());
        nodes.push(match result {
            Ok(status) => NodeView {
                url,
                alive: true,
                last_seen_ms: Some(0),
                status: Some(status),
                error: None,
            },
            Err(err) => NodeView {
                url,
                alive: false,
                last_seen_ms: last_ok.map(|t| t.elapsed().as_millis() as u64),
                status: None,
                error: Some(old_error.map_or(err.clone(), |o| format!("{err} (before: {o})"))),
            },
        });
    }
    let log_partitions = node.log_partitions();
    let mut partitions = Vec::new();
    let mut unserved = Vec::new();
    for p in 0..log_partitions {
        let best = nodes
            .iter()
            .filter_map(|n| n.status.as_ref())
            .filter_map(|s| {
                s.partitions
                    .iter()
                    .find(|ps| ps.log_partition == p)
                    .map(|ps| (s, ps))
            })
            .max_by_key(|(_, ps)| (ps.state == "serving", ps.claim_epoch));
        match best {
            Some((s, ps)) => {
                if ps.state != "serving" {
                    unserved.push(p);
                }
                partitions.push(PartitionOwner {
                    log_partition: p,
                    node_id: Some(s.node_id.clone()),
                    url: Some(s.url.clone()),
                    state: ps.state.clone(),
                    claim_epoch: ps.claim_epoch,
                    end_offset: ps.end_offset,
                    lag_entries: ps.lag_entries,
                });
            }
            None => {
                unserved.push(p);
                partitions.push(PartitionOwner {
                    log_partition: p,
                    node_id: None,
                    url: None,
                    state: "unowned".into(),
                    claim_epoch: None,
                    end_offset: None,
                    lag_entries: None,
                });
            }
        }
    }
    ClusterView {
        topic: node.config.topic.clone(),
        log_partitions,
        nodes,
        partitions,
        unserved,
    }
}

/// `reservoir cluster status`: asks `url` for `/v1/cluster` and prints it.
pub async fn print(url: &str, json: bool, token: Option<&str>) -> Result<(), String> {
    let url = url.trim_end_matches('/');
    let mut request = reqwest::Client::new().get(format!("{url}/v1/cluster"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!(
            "{url}/v1/cluster answered {}: {}",
            response.status(),
            response.text().await.unwrap_or_default()
        ));
    }
    let view: ClusterView = response.json().await.map_err(|e| e.to_string())?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&view).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!("topic {} ({} partitions)", view.topic, view.log_partitions);
    println!(
        "{:<24} {:<28} {:<6} {:<10} assigned",
        "node", "url", "alive", "seen_ms"
    );
    for n in &view.nodes {
        let (id, assigned) = match &n.status {
            Some(s) => (s.node_id.clone(), format!("{:?}", s.assigned)),
            None => ("?".into(), n.error.clone().unwrap_or_default()),
        };
        println!(
            "{:<24} {:<28} {:<6} {:<10} {}",
            id,
            n.url,
            n.alive,
            n.last_seen_ms.map_or("-".into(), |m| m.to_string()),
            assigned
        );
    }
    println!(
        "{:<9} {:<24} {:<12} {:>6} {:>10} {:>5}",
        "partition", "owner", "state", "epoch", "end", "lag"
    );
    let dash = || "-".to_string();
    for p in &view.partitions {
        println!(
            "{:<9} {:<24} {:<12} {:>6} {:>10} {:>5}",
            p.log_partition,
            p.node_id.clone().unwrap_or_else(dash),
            p.state,
            p.claim_epoch.map_or_else(dash, |e| e.to_string()),
            p.end_offset.map_or_else(dash, |e| e.to_string()),
            p.lag_entries.map_or_else(dash, |e| e.to_string()),
        );
    }
    if !view.unserved.is_empty() {
        println!("unserved: {:?}", view.unserved);
    }
    Ok(())
}
