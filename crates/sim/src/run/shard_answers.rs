//! The ledger's answers to the shards' requests, and the shard gates.
//!
//! An issue answer installs the document in the gateway's book (or, offered
//! to a second gateway or a restarted one, must be refused); a reconcile
//! answer records what the ledger reminted or took as debt; a probe shows
//! the reconcile of a gateway the shard is not bound to (a restarted one,
//! or with `--stolen-shards` a second one) refused. After every round
//! `check_shards` holds each book and every shard's reminted units to the
//! simulator's own tally of the local calls (the gates `shard_books`,
//! `shard_double_spent`, `duplicate_remint` and `remint_unbacked`). The
//! requests themselves, and the gateways' side, are in `shards`.

use reservoir_client::shards::{Reconcile, ReconcileOutcome, ShardDocument as HeldDocument};
use reservoir_core::partition::RemintedShard;
use reservoir_server::shards::bodies::{ReconcileView, ShardDocumentView};

use super::shards::gateway_id;
use super::*;

/// Coverage: a stolen shard's reconcile that found the ledger unavailable.
pub const STOLEN_UNAVAILABLE: &str = "second gateway's reconcile: ledger unavailable";
/// Coverage: a stolen shard's reconcile still unsent when the run ended.
pub const STOLEN_UNSENT: &str = "second gateway's reconcile: unsent when the run ended";

impl World {
    /// The answer to shard `s`'s request sent in phase `sent`. A gateway cut
    /// off does not hear it; an answer to a copy whose twin already moved
    /// the shard on (or whose process restarted) changes nothing.
    pub(super) fn deliver_to_shard(
        &mut self,
        s: usize,
        sent: ShardPhase,
        reply: Reply,
        lost: bool,
    ) {
        let shard = &self.shards[s];
        let lost = lost || self.gateways[shard.gateway].cut_off > 0;
        let verb = if sent == ShardPhase::Asking {
            "issue"
        } else {
            "reconcile"
        };
        let what = format!("  shard {} {verb}", shard.id);
        let outcome = if lost {
            "LOST".to_string()
        } else {
            outcome_of(&reply)
        };
        self.note(format!("{what} -> {outcome}"));
        if lost || self.shards[s].phase != sent {
            return;
        }
        match (sent, reply) {
            (_, Err(Failure::Unavailable(_))) => {}
            (_, Err(Failure::Internal(msg))) => {
                self.findings
                    .push(finding(Gate::WriterBroke, format!("{what}: {msg}")));
            }
            (ShardPhase::Asking, Ok(Answer::Shard { document, .. })) => {
                self.shard_issued(s, &document)
            }
            // Not enough available, or debt outstanding: no shard.
            (ShardPhase::Asking, Err(Failure::Rejected { .. })) => {
                self.shards[s].phase = ShardPhase::Abandoned;
                self.count("shard refused by the ledger");
            }
            (ShardPhase::Reconciling, Ok(Answer::Reconciled(outcome))) => {
                self.shard_reconciled(s, &outcome)
            }
            (_, other) => self.findings.push(finding(
                Gate::UnexpectedAnswer,
                format!("{what}: {other:?}"),
            )),
        }
    }

    /// The issued document reaches the gateway through the server's view
    /// and the client's type, and goes into its book; now and then it is
    /// offered to another gateway too, whose book must refuse it.
    fn shard_issued(&mut self, s: usize, document: &reservoir_server::shards::ShardDocument) {
        let view = ShardDocumentView::from(document);
        let held: HeldDocument = serde_json::to_value(&view)
            .and_then(serde_json::from_value)
            .expect("the client reads the server's shard document");
        let shard = &self.shards[s];
        let g = shard.gateway;
        let asked = (shard.units, gateway_id(g), shard.boot_epoch);
        if (held.units, held.gateway_id.clone(), held.gateway_boot_epoch) != asked {
            let detail = format!("shard {}: asked {asked:?}, issued {held:?}", shard.id);
            self.findings.push(finding(Gate::ModelDisagrees, detail));
            return;
        }
        match self.gateways[g].book.install(held.clone()) {
            Ok(()) => {
                self.shards[s].phase = ShardPhase::Held;
                self.shards[s].document = Some(held.clone());
                self.count("shard issued");
                if self.shards[s].route == Route::Chat {
                    self.count("shard of chat issued");
                }
            }
            Err(reservoir_client::shards::ShardRefused::Expired) => {
                self.shards[s].phase = ShardPhase::Abandoned;
                self.count("shard expired before it arrived");
                return;
            }
            Err(err) => {
                let detail = format!(
                    "shard {}: the issued shard is refused: {err}",
                    held.shard_id
                );
                self.findings.push(finding(Gate::UnexpectedAnswer, detail));
                return;
            }
        }
        if self.rng.chance(250) {
            // Any other gateway, the client gateways' books among them (one
            // draw, whatever the number of gateways).
            let n = self.gateways.len();
            let h = (g + 1 + self.rng.index(n - 1)) % n;
            let installed = if self.plant == Some(Plant::IdentityCloned) {
                // gw-h runs under gw-g's id and boot epoch: its book is one
                // that gw-g's shards fit.
                let key = self.signer.public_key_hex();
                let clone = Gateway::new(g, self.shards[s].boot_epoch, &key, &self.node.clock);
                clone.book.install(held.clone())
            } else {
                self.gateways[h].book.install(held.clone())
            };
            match installed {
                Err(reservoir_client::shards::ShardRefused::OtherGateway(_)) => {
                    self.count("shard refused to a second gateway");
                    if h >= GATEWAYS {
                        self.count("shard refused to a client gateway's book");
                    }
                    if g >= GATEWAYS {
                        self.count("client gateway's shard refused to a second gateway");
                    }
                    if self.stolen_shards {
                        self.present_unbound(s, Presenter::Other(h), held);
                    }
                }
                other => {
                    let detail = format!(
                        "shard {} of gw-{g} offered to gw-{h}: {other:?}",
                        self.shards[s].id
                    );
                    self.findings.push(finding(Gate::ShardDoubleSpent, detail));
                }
            }
        }
    }

    /// The ledger's answer reaches the gateway's book (a second begin then
    /// answers it from the book), and is held to what the calls did.
    fn shard_reconciled(&mut self, s: usize, outcome: &reservoir_server::shards::ReconcileOutcome) {
        let view = ReconcileView::from(outcome);
        let told: ReconcileOutcome = serde_json::to_value(&view)
            .and_then(serde_json::from_value)
            .expect("the client reads the server's reconcile answer");
        let (g, id) = (self.shards[s].gateway, self.shards[s].id.clone());
        let book = &self.gateways[g].book;
        book.note_reconciled(&id, told.clone());
        match book.begin_reconcile(&id) {
            Ok(Reconcile::Done(again)) if again == told => {}
            other => {
                let detail = format!("shard {id}: reconciled, then the book says {other:?}");
                self.findings.push(finding(Gate::ShardBooks, detail));
            }
        }
        self.shards[s].phase = ShardPhase::Reconciled;
        self.count(match told.outcome.as_str() {
            "reminted" => "shard reconciled: unused units reminted",
            "overspent" => "shard reconciled: overspent, the excess is debt",
            _ => "shard reconciled: some units stay retired (late, or no room)",
        });
        if outcome.target.policy_generation != outcome.record.source.policy_generation {
            self.count("shard reconciled into a later generation");
        }
        let mut out = Vec::new();
        self.check_remint(s, &outcome.record, &mut out);
        self.findings.extend(out);
    }

    /// A gateway presented a shard not bound to it (a restarted gateway its
    /// predecessor's, or a second gateway another's): refused.
    pub(super) fn deliver_probe(&mut self, s: usize, by: Presenter, reply: Reply) {
        let (who, refused) = match by {
            Presenter::Restarted => (
                "the restarted gateway".to_string(),
                "old shard's reconcile refused after a restart",
            ),
            Presenter::Other(h) => (
                format!("gw-{h}, a second gateway"),
                "second gateway's reconcile refused by the ledger",
            ),
        };
        let what = format!("  shard {} reconcile by {who}", self.shards[s].id);
        self.note(format!("{what} -> {}", outcome_of(&reply)));
        match reply {
            Err(Failure::Conflict {
                code: "shard_binding_mismatch",
                ..
            }) => self.count(refused),
            Err(Failure::Unavailable(_)) => {
                // Counted for stolen shards only: a new key in the restart
                // probe's coverage would be missing from the gate's chunks.
                if matches!(by, Presenter::Other(_)) {
                    self.count(STOLEN_UNAVAILABLE);
                }
            }
            other => {
                let detail = format!("{}: {}", what.trim_start(), outcome_of(&other));
                self.findings.push(finding(Gate::RemintUnbacked, detail));
            }
        }
    }

    /// A ledger's reconcile record of shard `s` against what its calls
    /// did: the receipts' totals recorded as sent, no more reminted than
    /// the calls left unused (an unknown call's hold is never unused), and
    /// use beyond the allocation recorded as debt.
    pub(super) fn check_remint(&self, s: usize, r: &RemintedShard, out: &mut Vec<Finding>) {
        let shard = &self.shards[s];
        let reported = (shard.units, shard.used, shard.unknown);
        if (r.issued_units, r.spent_units, r.unknown_units) != reported {
            out.push(finding(
                Gate::ModelDisagrees,
                format!(
                    "shard {}: the ledger recorded (issued, spent, unknown) {:?}, its calls reported {reported:?}",
                    shard.id,
                    (r.issued_units, r.spent_units, r.unknown_units)
                ),
            ));
        }
        let accounted = shard.used + shard.unknown;
        let unused = shard.units.saturating_sub(accounted);
        let excess = accounted.saturating_sub(shard.units);
        if r.units > unused || r.excess_units != excess {
            out.push(finding(
                Gate::RemintUnbacked,
                format!(
                    "shard {} of {} units, used {} and unknown {}: reminted {} (at most {unused}), excess recorded {} (owed {excess})",
                    shard.id, shard.units, shard.used, shard.unknown, r.units, r.excess_units
                ),
            ));
        }
    }

    /// After every round: each book balances and holds what its calls hold;
    /// a shard is reminted at most once across the subject/route's
    /// partitions; every record agrees with what the calls did.
    pub(super) fn check_shards(&self, live: &Partitions, out: &mut Vec<Finding>) {
        for shard in &self.shards {
            let gateway = &self.gateways[shard.gateway];
            // Reconciled shards stay in the book of the process that
            // reconciled them (a planted restart under the same boot epoch
            // starts a book without them).
            let held = matches!(shard.phase, ShardPhase::Held | ShardPhase::Reconciling);
            let reconciled = shard.phase == ShardPhase::Reconciled;
            if !(held || reconciled) || gateway.boot_epoch != shard.boot_epoch {
                continue;
            }
            let Some(b) = gateway.book.books(&shard.id) else {
                if reconciled {
                    continue;
                }
                out.push(finding(
                    Gate::ShardBooks,
                    format!("shard {}: not in its gateway's book", shard.id),
                ));
                continue;
            };
            let right = u128::from(b.local_available_units)
                + u128::from(b.local_reserved_units)
                + u128::from(b.local_spent_units)
                + u128::from(b.local_retired_units);
            if b.allocated_units != shard.units
                || u128::from(b.allocated_units) != right
                || b.local_reserved_units != shard.open
            {
                out.push(finding(
                    Gate::ShardBooks,
                    format!(
                        "shard {} of {} units, {} held by open calls: book {b:?}",
                        shard.id, shard.units, shard.open
                    ),
                ));
            }
        }
        let mut seen: BTreeMap<&str, &PartitionKey> = BTreeMap::new();
        for (key, p) in live {
            for (id, record) in &p.shards_reminted {
                if let Some(first) = seen.insert(id.as_str(), key) {
                    out.push(finding(
                        Gate::DuplicateRemint,
                        format!("shard {} reminted into {first} and {key}", id.as_str()),
                    ));
                }
                if let Some(s) = self.shards.iter().position(|s| s.id == id.as_str()) {
                    self.check_remint(s, record, out);
                }
            }
        }
    }

    /// Shard requests still to be answered (the quiet drain waits for them).
    pub(super) fn shards_unresolved(&self) -> usize {
        self.shards
            .iter()
            .filter(|s| matches!(s.phase, ShardPhase::Asking | ShardPhase::Reconciling))
            .count()
    }
}
