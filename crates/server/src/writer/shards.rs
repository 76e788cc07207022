//! Emergency shards, the writer's side: issue a signed shard out of a
//! subject/route's active partition, reconcile one (remint its unused units
//! into whatever partition is active now, once), and list them. The rules are
//! in [`crate::shards`]; core decides the books (`IssueShard`, `RemintShard`).
//!
//! A shard is recorded in the partition it was issued from (`shards_issued`,
//! which that partition keeps for its whole life, so it is never dropped from
//! memory) and its reconcile in the partition the units were reminted into
//! (`shards_reminted`). Every partition of a subject/route lives in this
//! shard, so "was it reconciled already" is a scan of those partitions, even
//! when the active generation changed between two reconciles.

use std::sync::Arc;

use reservoir_core::partition::{IssuedShard, RemintedShard};
use reservoir_core::{decide, Command, PartitionKey, Rejection, ShardId, TimestampMs, Units};

use super::pipeline::{Batch, Pending, Shard};
use super::protocol::{Answer, Failure};
use crate::shards::{
    outcome_units, ReceiptTotals, ReconcileOutcome, ShardDocument, ShardSigner, ShardStatus,
};

/// What `POST /v1/shards` asks for, checked by the HTTP layer.
#[derive(Debug)]
pub struct IssueShard {
    pub subject: String,
    pub route: String,
    pub shard_id: ShardId,
    pub units: Units,
    pub gateway_id: String,
    pub boot_epoch: u64,
    pub ttl_ms: u64,
    pub signer: Arc<ShardSigner>,
}

/// What `POST /v1/shards/{id}/reconcile` asks for, signature already verified.
#[derive(Debug)]
pub struct ReconcileShard {
    pub presented: ShardDocument,
    /// Who presents it (must be the gateway and boot epoch it is bound to).
    pub gateway_id: String,
    pub boot_epoch: u64,
    pub totals: ReceiptTotals,
    pub grace_ms: u64,
}

fn conflict(code: &'static str, detail: impl Into<String>) -> Pending {
    Pending::Ready(Err(Failure::Conflict {
        code,
        detail: detail.into(),
    }))
}

impl Shard {
    /// The partitions of one subject/route.
    fn partitions_of<'a>(
        &'a self,
        subject: &'a str,
        route: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a PartitionKey, &'a reservoir_core::Partition)> + 'a {
        self.state
            .partitions
            .iter()
            .filter(move |(k, _)| k.subject == subject && route.is_none_or(|r| k.route == r))
            .map(|(k, ps)| (k, &ps.partition))
    }

    fn find_issued(
        &self,
        subject: &str,
        route: &str,
        id: &ShardId,
    ) -> Option<(PartitionKey, IssuedShard)> {
        self.partitions_of(subject, Some(route))
            .find_map(|(k, p)| p.shards_issued.get(id).map(|s| (k.clone(), s.clone())))
    }

    fn find_reminted(
        &self,
        subject: &str,
        route: &str,
        id: &ShardId,
    ) -> Option<(PartitionKey, RemintedShard)> {
        self.partitions_of(subject, Some(route))
            .find_map(|(k, p)| p.shards_reminted.get(id).map(|r| (k.clone(), r.clone())))
    }

    pub(super) fn issue_shard(&mut self, batch: &mut Batch, req: IssueShard) -> Pending {
        let sr = (req.subject.clone(), req.route.clone());
        self.roll_epoch(batch, &sr);
        if let Some((key, issued)) = self.find_issued(&req.subject, &req.route, &req.shard_id) {
            // A retry (same id): the same document, if it asked for the same shard.
            let same = issued.units == req.units
                && issued.gateway_id == req.gateway_id
                && issued.boot_epoch == req.boot_epoch;
            return match same {
                true => Pending::Ready(Ok(Answer::Shard {
                    document: Box::new(ShardDocument::from_issued(&req.shard_id, &key, &issued)),
                    created: false,
                })),
                false => Pending::Ready(Err(
                    self.rejected(&key, Rejection::ExistsWithDifferentFields)
                )),
            };
        }
        let Some(key) = self.state.active.get(&sr).cloned() else {
            return Pending::Ready(Err(Failure::NoPolicy));
        };
        let now = self.now_for(&key);
        let Some(expires_at_ms) = now.checked_add(req.ttl_ms) else {
            return Pending::Ready(Err(Failure::Invalid {
                code: "invalid_input",
                detail: "ttl_ms overflows the clock".into(),
            }));
        };
        let log_partition = (self.log_partition_for)(&key) as usize;
        let fence_epoch = self.claim_epochs.get(log_partition).copied().unwrap_or(0);
        let mut document = ShardDocument {
            shard_id: req.shard_id.clone(),
            source: key.clone(),
            units: req.units,
            gateway_id: req.gateway_id.clone(),
            boot_epoch: req.boot_epoch,
            fence_epoch,
            issued_at_ms: now,
            expires_at_ms,
            signature: String::new(),
        };
        document.signature = req.signer.sign(&document);
        let command = Command::IssueShard {
            shard_id: req.shard_id.clone(),
            units: req.units,
            gateway_id: req.gateway_id,
            boot_epoch: req.boot_epoch,
            expires_at_ms,
            fence_epoch,
            signature: document.signature.clone(),
        };
        let events = match decide(&self.state.partitions[&key].partition, &command, now) {
            Ok(events) => events,
            Err(rejection) => return Pending::Ready(Err(self.rejected(&key, rejection))),
        };
        assert!(!events.is_empty(), "a new shard id decides a ShardIssued");
        self.commit_speculatively(batch, &key, events);
        // What the log now holds is exactly what was signed (the event's
        // writer time is the `now` signed over).
        let issued = &self.state.partitions[&key].partition.shards_issued[&req.shard_id];
        let recorded = ShardDocument::from_issued(&req.shard_id, &key, issued);
        assert_eq!(recorded, document, "the logged shard is the signed one");
        Pending::Ready(Ok(Answer::Shard {
            document: Box::new(document),
            created: true,
        }))
    }

    pub(super) fn reconcile_shard(&mut self, batch: &mut Batch, req: ReconcileShard) -> Pending {
        let source = req.presented.source.clone();
        let id = req.presented.shard_id.clone();
        let (subject, route) = (source.subject.clone(), source.route.clone());
        let Some(issued) = self
            .state
            .partitions
            .get(&source)
            .and_then(|ps| ps.partition.shards_issued.get(&id))
            .cloned()
        else {
            return Pending::Ready(Err(Failure::Invalid {
                code: "unknown_shard",
                detail: format!("no shard {} was issued from {source}", id.as_str()),
            }));
        };
        let logged = ShardDocument::from_issued(&id, &source, &issued);
        if logged != req.presented {
            return conflict(
                "shard_mismatch",
                "the presented shard differs from the one the ledger issued",
            );
        }
        if req.gateway_id != issued.gateway_id || req.boot_epoch != issued.boot_epoch {
            return conflict(
                "shard_binding_mismatch",
                format!(
                    "shard {} is bound to gateway {} boot epoch {}",
                    id.as_str(),
                    issued.gateway_id,
                    issued.boot_epoch
                ),
            );
        }
        if let Some((target, record)) = self.find_reminted(&subject, &route, &id) {
            // Reconciled once already: the same totals get the same answer and
            // remint nothing; other totals are refused.
            let (_, spent, unknown, _) = outcome_units(issued.units, req.totals, false);
            if (spent, unknown) != (record.spent_units, record.unknown_units) {
                return Pending::Ready(Err(
                    self.rejected(&target, Rejection::ExistsWithDifferentFields)
                ));
            }
            return Pending::Ready(Ok(Answer::Reconciled(Box::new(ReconcileOutcome {
                document: logged,
                target,
                record,
                created: false,
            }))));
        }
        let sr = (subject, route);
        self.roll_epoch(batch, &sr);
        let Some(target) = self.state.active.get(&sr).cloned() else {
            return Pending::Ready(Err(Failure::NoPolicy));
        };
        let now = self.now_for(&target);
        let late = now > issued.expires_at_ms.saturating_add(req.grace_ms);
        let (unused, spent, unknown, excess) = outcome_units(issued.units, req.totals, late);
        let command = Command::RemintShard {
            shard_id: id.clone(),
            source: source.clone(),
            issued_units: issued.units,
            unused_units: unused,
            spent_units: spent,
            unknown_units: unknown,
            excess_units: excess,
        };
        let events = match decide(&self.state.partitions[&target].partition, &command, now) {
            Ok(events) => events,
            Err(rejection) => return Pending::Ready(Err(self.rejected(&target, rejection))),
        };
        assert!(
            !events.is_empty(),
            "an unreconciled shard decides a ShardReminted"
        );
        self.commit_speculatively(batch, &target, events);
        let record = self.state.partitions[&target].partition.shards_reminted[&id].clone();
        Pending::Ready(Ok(Answer::Reconciled(Box::new(ReconcileOutcome {
            document: logged,
            target,
            record,
            created: true,
        }))))
    }

    /// Every shard issued from a partition of `subject` (and `route`, if given).
    pub(super) fn list_shards(&self, subject: &str, route: Option<&str>) -> Vec<ShardStatus> {
        let mut out = Vec::new();
        for (key, p) in self.partitions_of(subject, route) {
            for (id, issued) in &p.shards_issued {
                out.push(ShardStatus {
                    document: ShardDocument::from_issued(id, key, issued),
                    reconciled: self.find_reminted(&key.subject, &key.route, id),
                });
            }
        }
        out.sort_by(|a, b| {
            (a.document.issued_at_ms, a.document.shard_id.as_str())
                .cmp(&(b.document.issued_at_ms, b.document.shard_id.as_str()))
        });
        out
    }

    /// Sets this shard's gauges: units out on unreconciled shards, how many,
    /// and the age of the oldest (run on every sweep, so they hold after a
    /// restart too).
    pub(super) fn publish_shard_gauges(&self, now_ms: TimestampMs) {
        let reconciled: std::collections::HashSet<(&str, &str, &ShardId)> = self
            .state
            .partitions
            .iter()
            .flat_map(|(k, ps)| {
                ps.partition
                    .shards_reminted
                    .keys()
                    .map(move |id| (k.subject.as_str(), k.route.as_str(), id))
            })
            .collect();
        let (mut units, mut count, mut oldest) = (0u128, 0u64, None::<TimestampMs>);
        for (k, ps) in &self.state.partitions {
            for (id, s) in &ps.partition.shards_issued {
                if !reconciled.contains(&(k.subject.as_str(), k.route.as_str(), id)) {
                    units += u128::from(s.units);
                    count += 1;
                    oldest = Some(oldest.map_or(s.issued_at_ms, |o| o.min(s.issued_at_ms)));
                }
            }
        }
        let age_s = oldest.map_or(0, |o| now_ms.saturating_sub(o)) as f64 / 1_000.0;
        set_shard_gauges(
            self.gauge_partition,
            self.id,
            [units as f64, count as f64, age_s],
        );
    }
}

/// The gauges of emergency shards outstanding, by writer shard (and, in
/// cluster mode, by log partition): units, shards, oldest age in seconds.
pub fn set_shard_gauges(log_partition: Option<u32>, writer_shard: usize, values: [f64; 3]) {
    const NAMES: [&str; 3] = [
        "reservoir_shard_units_outstanding",
        "reservoir_shards_unreconciled",
        "reservoir_shard_oldest_unreconciled_age_seconds",
    ];
    let mut labels = vec![metrics::Label::new(
        "writer_shard",
        writer_shard.to_string(),
    )];
    if let Some(p) = log_partition {
        labels.push(metrics::Label::new("log_partition", p.to_string()));
    }
    for (name, value) in NAMES.into_iter().zip(values) {
        metrics::gauge!(name, labels.clone()).set(value);
    }
}
