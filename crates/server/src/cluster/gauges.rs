//! A cluster node's gauges. Several partitions' writers run in one process
//! and share its metrics: the writers count the reservations they hold into
//! one node-wide gauge (a take-over's recovered records were never added, a
//! revoked partition's never taken away), and each sets the emergency-shard
//! gauges of its writer shards under its log partition's label (which stay
//! at their last value when the partition leaves). [`refresh`], every gossip
//! round, sets the node-wide gauge to what the partitions it serves hold and
//! zeroes the shard gauges of partitions it served before and serves no more.

use super::{Node, SlotState};

/// Sets `reservoir_reservations_in_memory` to the records the node's serving
/// partitions hold, and the shard gauges of partitions no longer served to 0.
pub fn refresh(node: &Node) {
    let serving: Vec<(u32, usize)> = {
        let slots = node.slots.read().expect("slots");
        slots
            .iter()
            .filter_map(|(p, slot)| match &slot.state {
                SlotState::Serving(owned) => {
                    Some((*p, owned.writers.index.read().expect("index lock").len()))
                }
                _ => None,
            })
            .collect()
    };
    let in_memory: usize = serving.iter().map(|(_, records)| records).sum();
    metrics::gauge!("reservoir_reservations_in_memory").set(in_memory as f64);
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
