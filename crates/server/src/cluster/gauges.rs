//! A cluster node's gauges. Several partitions' writers run in one process
//! and share its metrics. `reservoir_reservations_in_memory` is counted when
//! `/metrics` is rendered from the indexes of the partitions the node serves
//! ([`count_in_memory`]), so a take-over's recovered records are in it and a
//! revoked partition's are not. Each partition's writers set the
//! emergency-shard gauges of their writer shards under its log partition's
//! label, which stay at their last value when the partition leaves:
//! [`zero_left_shards`], every gossip round, zeroes those of partitions the
//! node served before and serves no more.

use std::sync::{Arc, Weak};

use super::{Node, SlotState};

/// Names the node's serving partitions as what the in-memory gauge counts.
pub fn count_in_memory(node: &Arc<Node>) {
    let node: Weak<Node> = Arc::downgrade(node);
    crate::telemetry::count_in_memory(move || {
        node.upgrade().map_or(0, |node| {
            serving(&node).iter().map(|(_, records)| records).sum()
        })
    });
}

/// The partitions the node serves, each with the records its writers hold.
fn serving(node: &Node) -> Vec<(u32, usize)> {
    let slots = node.slots.read().unwrap_or_else(|e| e.into_inner());
    slots
        .iter()
        .filter_map(|(p, slot)| match &slot.state {
            SlotState::Serving(owned) => Some((
                *p,
                owned
                    .writers
                    .index
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .len(),
            )),
            _ => None,
        })
        .collect()
}

/// Sets the shard gauges of partitions no longer served to 0.
pub fn zero_left_shards(node: &Node) {
    let serving = serving(node);
    let gauged = node.gauged.lock().expect("gauged");
    for p in gauged
        .iter()
        .filter(|p| !serving.iter().any(|(s, _)| s == *p))
    {
        for shard in 0..node.config.writer_shards {
            crate::writer::shards::set_shard_gauges(Some(*p), shard, [0.0; 3]);
        }
    }
}
