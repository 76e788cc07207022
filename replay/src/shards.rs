//! Cross-partition checks of emergency shards: a shard is reminted at most
//! once, into a partition of the subject/route that issued it, from the
//! partition that issued it, with the allocation it was issued with. The
//! writer checks this across a subject/route's partitions when it
//! reconciles; the core's apply sees one partition at a time (a second
//! remint into another generation, or a remint naming a source that never
//! issued the shard, applies cleanly there), so the replay checks the log.

use std::collections::BTreeMap;

use reservoir_core::{Event, EventBody, PartitionKey, ShardId, Units};
use reservoir_log::Position;

use crate::engine::Finding;

/// Where an event is in the log.
#[derive(Clone, Debug)]
struct At {
    position: Position,
    event_index: u32,
    sequence: u64,
    key: PartitionKey,
}

/// The shards issued and reminted so far.
#[derive(Default)]
pub struct Shards {
    /// (issuing partition, shard) → its allocation.
    issued: BTreeMap<(PartitionKey, ShardId), Units>,
    /// (issuing partition, shard) → every remint of it: where, and the
    /// allocation it states.
    reminted: BTreeMap<(PartitionKey, ShardId), Vec<(At, Units)>>,
}

impl Shards {
    /// Notes an applied event (only shard events matter).
    pub fn note(&mut self, position: Position, key: &PartitionKey, index: u32, event: &Event) {
        match &event.body {
            EventBody::ShardIssued {
                shard_id, units, ..
            } => {
                self.issued.insert((key.clone(), shard_id.clone()), *units);
            }
            EventBody::ShardReminted {
                shard_id,
                source,
                issued_units,
                ..
            } => {
                let at = At {
                    position,
                    event_index: index,
                    sequence: event.sequence,
                    key: key.clone(),
                };
                self.reminted
                    .entry((source.clone(), shard_id.clone()))
                    .or_default()
                    .push((at, *issued_units));
            }
            _ => {}
        }
    }

    /// Every remint that no issue backs, that names another subject/route or
    /// allocation than the issue's, or that repeats an earlier one; each
    /// located at the remint.
    pub fn findings(&self) -> Vec<Finding> {
        let finding = |at: &At, kind, detail: String| Finding {
            log_partition: at.position.log_partition,
            offset: at.position.offset,
            partition: Some(at.key.to_string()),
            event_index: Some(at.event_index),
            sequence: Some(at.sequence),
            kind,
            detail,
        };
        let mut out = Vec::new();
        for ((source, id), remints) in &self.reminted {
            let issued = self.issued.get(&(source.clone(), id.clone()));
            for (n, (at, stated)) in remints.iter().enumerate() {
                let elsewhere = at.key.subject != source.subject || at.key.route != source.route;
                match issued {
                    None => out.push(finding(
                        at,
                        "shard_remint_unbacked",
                        format!("shard {id} reminted from {source}, which never issued it"),
                    )),
                    Some(_) if elsewhere => out.push(finding(
                        at,
                        "shard_remint_mismatch",
                        format!("shard {id} of {source} reminted into another subject/route"),
                    )),
                    Some(&units) if *stated != 0 && *stated != units => out.push(finding(
                        at,
                        "shard_remint_mismatch",
                        format!("shard {id} of {source}: reminted as an allocation of {stated}, issued with {units}"),
                    )),
                    Some(_) => {}
                }
                if n > 0 {
                    out.push(finding(
                        at,
                        "shard_reminted_twice",
                        format!(
                            "shard {id} of {source} reminted again (first into {})",
                            remints[0].0.key
                        ),
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(body: EventBody) -> Event {
        Event {
            further: Vec::new(),
            sequence: 1,
            at_ms: 1,
            body,
        }
    }

    fn remint(id: &ShardId, source: &PartitionKey, issued_units: Units) -> Event {
        event(EventBody::ShardReminted {
            shard_id: id.clone(),
            source: source.clone(),
            units: 200,
            issued_units,
            spent_units: 100,
            unknown_units: 0,
            excess_units: 0,
        })
    }

    #[test]
    fn a_shard_is_reminted_once_from_the_partition_that_issued_it() {
        let (g1, g2) = (
            PartitionKey::new("t", "r", "e", 1).unwrap(),
            PartitionKey::new("t", "r", "e", 2).unwrap(),
        );
        let other = PartitionKey::new("u", "r", "e", 1).unwrap();
        let id = ShardId::new("sh-1").unwrap();
        let at = |offset| Position {
            log_partition: 0,
            offset,
        };
        let kinds = |shards: &Shards| -> Vec<&'static str> {
            shards.findings().iter().map(|f| f.kind).collect()
        };
        let mut shards = Shards::default();
        let issue = event(EventBody::ShardIssued {
            shard_id: id.clone(),
            units: 300,
            gateway_id: "gw".into(),
            boot_epoch: 1,
            expires_at_ms: 10,
            fence_epoch: 1,
            signature: String::new(),
        });
        shards.note(at(1), &g1, 0, &issue);
        // Reminted into the next generation, as a reconcile after a switch does.
        shards.note(at(2), &g2, 0, &remint(&id, &g1, 300));
        assert!(kinds(&shards).is_empty(), "{:?}", shards.findings());
        // The same shard again, into another generation: the writer never
        // does; each partition's apply alone cannot tell.
        shards.note(at(3), &g1, 0, &remint(&id, &g1, 300));
        assert_eq!(kinds(&shards), ["shard_reminted_twice"]);
        // A source that never issued it, another subject, another allocation.
        let mut shards = Shards::default();
        shards.note(at(1), &g1, 0, &issue);
        shards.note(at(2), &g2, 0, &remint(&id, &g2, 300));
        shards.note(
            at(3),
            &other,
            0,
            &remint(&ShardId::new("sh-2").unwrap(), &g1, 0),
        );
        let mut odd = Shards::default();
        odd.note(at(1), &g1, 0, &issue);
        odd.note(at(2), &other, 0, &remint(&id, &g1, 300));
        odd.note(at(3), &g1, 0, &remint(&id, &g1, 299));
        assert_eq!(
            kinds(&shards),
            ["shard_remint_unbacked", "shard_remint_unbacked"]
        );
        assert_eq!(
            kinds(&odd),
            [
                "shard_remint_mismatch",
                "shard_remint_mismatch",
                "shard_reminted_twice"
            ]
        );
    }
}
