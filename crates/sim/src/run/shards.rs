//! Emergency shards, end to end: each gateway asks the ledger for shards of
//! `embed` (tokens), now and then of `chat` (requests, with input and output
//! tokens beside them: a shard carves the primary dimension only, so its
//! calls hold and report one unit each), is now and then cut off from
//! the ledger for some rounds (a network partition: nothing it sends
//! arrives, no answer reaches it) and admits from its shards meanwhile
//! through the client crate's real [`ShardBook`] (the client's
//! [`Fallback`]), reconciles each shard once it is back (a lost answer
//! retried with the same receipts, now and then an impatient duplicate),
//! and restarts (a new boot epoch: its book and its shards' receipts are
//! gone, the units stay retired with the ledger).
//!
//! The ledger's answers, and the shard gates, are in `shard_answers`.
//!
//! Bodies go the way HTTP would carry them: the server's issue and reconcile
//! translations (`reservoir_server::shards::http::{issue_request,
//! reconcile_request}`) read the JSON the client builds, and the writer's
//! answers reach the client through the server's views. Only the socket is
//! missing.
//!
//! The sim keeps its own tally of what every shard's local calls did, across
//! every book that held it, and holds the books and the ledger's records
//! to it (the gates `shard_books`, `shard_double_spent`, `duplicate_remint`
//! and `remint_unbacked`). A shard offered to a second gateway, or to its own
//! gateway after a restart, must be refused; so must a reconcile that
//! presents a shard under the new boot epoch.

use reservoir_client::shards::{Reconcile, ShardDocument as HeldDocument};
use reservoir_client::{Fallback, LocalHold, ReserveRequest, Settlement, ShardBook};
use reservoir_server::clock::ManualClock;
use reservoir_server::shards::bodies::{IssueShardBody, ReconcileBody};
use reservoir_server::shards::http::{issue_request, reconcile_request};
use reservoir_server::shards::ShardSigner;

use super::*;

/// How long after its expiry the simulated ledger still remints a shard's
/// unused units (short, so late reconciles happen within a run).
pub(super) const GRACE_MS: u64 = 60_000;
/// Unreconciled shards a gateway keeps at most.
const SHARDS_PER_GATEWAY: usize = 3;
/// The seed of the ledger's signing key (a fixed key: a run's documents,
/// signatures included, are the same on every replay).
const SIGNING_SEED: [u8; 32] = [42; 32];

/// The signer every node of a run shares, from [`SIGNING_SEED`].
pub(super) fn signer() -> Arc<ShardSigner> {
    Arc::new(ShardSigner::from_seed(SIGNING_SEED))
}

/// One gateway process's side of the shards.
pub(super) struct Gateway {
    pub(super) boot_epoch: u64,
    /// Shared with the client gateway's `Client`, whose fallback it is.
    pub(super) book: Arc<ShardBook>,
    /// Rounds left cut off from the ledger (0: reachable).
    pub(super) cut_off: u32,
    local_calls: u64,
}

impl Gateway {
    pub(super) fn new(g: usize, boot_epoch: u64, public_key: &str, clock: &ManualClock) -> Self {
        let clock = clock.clone();
        let now = Arc::new(move || {
            use reservoir_server::clock::Clock;
            clock.now_ms()
        });
        let book = ShardBook::new(&gateway_id(g), boot_epoch, public_key)
            .expect("the run's own public key")
            .with_clock(now);
        Gateway {
            boot_epoch,
            book: Arc::new(book),
            cut_off: 0,
            local_calls: 0,
        }
    }
}

/// Who presents a shard the ledger must refuse (`Origin::ShardProbe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Presenter {
    /// Its own gateway after a restart, under the new boot epoch.
    Restarted,
    /// Another gateway (`--stolen-shards`), under its own id and epoch.
    Other(usize),
}

pub(super) fn gateway_id(g: usize) -> String {
    format!("gw-{g}")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ShardPhase {
    /// Issue asked, not answered yet (retried as it was).
    Asking,
    /// In its gateway's book.
    Held,
    /// Reconcile begun: the body is fixed, retried until answered.
    Reconciling,
    Reconciled,
    /// Refused by the ledger, expired before it arrived, or lost with a
    /// restarted gateway: the ledger keeps its units retired.
    Abandoned,
}

/// One shard as the simulator follows it.
pub(super) struct SimShard {
    pub(super) id: String,
    pub(super) gateway: usize,
    pub(super) boot_epoch: u64,
    pub(super) tenant: usize,
    pub(super) route: Route,
    pub(super) units: u64,
    pub(super) ttl_ms: u64,
    pub(super) phase: ShardPhase,
    pub(super) document: Option<HeldDocument>,
    /// The reconcile body, fixed at its first attempt.
    body: Option<serde_json::Value>,
    /// What its local calls did, across every book that held it: units
    /// reported used by settles (above a hold too), what settles took of
    /// their holds, the holds of calls whose usage is unknown (or that died
    /// with their process), and holds still open.
    pub(super) used: u64,
    pub(super) spent: u64,
    pub(super) unknown: u64,
    pub(super) open: u64,
    pub(super) admitted_offline: bool,
}

impl SimShard {
    /// Units the shard's calls consumed or hold: never above its allocation.
    pub(super) fn consumed(&self) -> u64 {
        self.spent + self.unknown + self.open
    }
}

/// A call admitted from a shard while its gateway was cut off.
pub(super) struct LocalCall {
    id: String,
    gateway: usize,
    shard: usize,
    units: u64,
    hold: Box<dyn LocalHold>,
}

impl World {
    /// The shards' part of a round, before the waves: cut-offs end or begin,
    /// gateways restart, local calls end or are admitted, reconciles begin,
    /// new shards are asked for. In the quiet drain every gateway is
    /// reachable, every local call ends and every held shard is reconciled.
    pub(super) fn shard_round(&mut self, quiet: bool) {
        // The client gateway's cut-offs are drawn in `client_round`, and
        // end here with the others'.
        for g in 0..self.gateways.len() {
            let gateway = &mut self.gateways[g];
            if gateway.cut_off > 0 && (quiet || gateway.cut_off == 1) {
                gateway.cut_off = 0;
                gateway.book.note_ledger_reachable();
                self.note(format!("  gw-{g} reaches the ledger again"));
            } else if gateway.cut_off > 0 {
                gateway.cut_off -= 1;
            }
        }
        if !quiet && self.rng.chance(8) {
            let g = self.rng.index(GATEWAYS);
            self.restart_gateway(g);
        }
        if !quiet && self.rng.chance(40) {
            let g = self.rng.index(GATEWAYS);
            if self.gateways[g].cut_off == 0 {
                let rounds = self.rng.range(2, 8) as u32;
                self.gateways[g].cut_off = rounds;
                self.note(format!(
                    "  gw-{g} cut off from the ledger for {rounds} rounds"
                ));
                self.count("gateway cut off from the ledger");
            }
        }
        let mut i = 0;
        while i < self.local_calls.len() {
            let reachable = self.gateways[self.local_calls[i].gateway].cut_off == 0;
            if quiet || reachable || self.rng.chance(500) {
                let call = self.local_calls.swap_remove(i);
                self.end_local_call(call);
            } else {
                i += 1;
            }
        }
        for g in 0..GATEWAYS {
            if self.gateways[g].cut_off > 0 {
                for _ in 0..self.rng.range(0, 2) {
                    self.admit_locally(g);
                }
            }
        }
        // What the client gateway's tasks did since they last reported (they
        // run whenever the world awaits, the sweeper's collection included):
        // a call its client admitted from a shard holds it open in the book
        // before the world hears of it.
        self.client_reports();
        for s in 0..self.shards.len() {
            let shard = &self.shards[s];
            let reachable = self.gateways[shard.gateway].cut_off == 0;
            if shard.phase != ShardPhase::Held || !reachable {
                continue;
            }
            let open = shard.open > 0 || self.local_calls.iter().any(|c| c.shard == s);
            let due = quiet || shard.admitted_offline || self.rng.chance(15);
            if !open && due {
                self.begin_reconcile(s);
            }
        }
        if !quiet && self.rng.chance(60) {
            let g = self.rng.index(GATEWAYS);
            self.ask_for_shard(g);
        }
    }

    /// Gateway `g` asks the ledger for a shard (of a random tenant and
    /// route), if it is reachable and holds fewer than it keeps.
    pub(super) fn ask_for_shard(&mut self, g: usize) {
        let live = self
            .shards
            .iter()
            .filter(|s| s.gateway == g && s.boot_epoch == self.gateways[g].boot_epoch)
            .filter(|s| !matches!(s.phase, ShardPhase::Reconciled | ShardPhase::Abandoned))
            .count();
        if self.gateways[g].cut_off == 0 && live < SHARDS_PER_GATEWAY {
            let boot_epoch = self.gateways[g].boot_epoch;
            let id = format!("gw-{g}-b{boot_epoch}-s{}", self.shards.len());
            let tenant = self.rng.index(TENANTS.len());
            let route = self.shard_route();
            let units = match route {
                Route::Embed => self.rng.range(500, 3_000),
                // Requests: a few calls' worth.
                Route::Chat => self.rng.range(1, 4),
            };
            self.shards.push(SimShard {
                id,
                gateway: g,
                boot_epoch,
                tenant,
                route,
                units,
                ttl_ms: self.rng.range(30_000, 600_000),
                phase: ShardPhase::Asking,
                document: None,
                body: None,
                used: 0,
                spent: 0,
                unknown: 0,
                open: 0,
                admitted_offline: false,
            });
        }
    }

    /// The route of a new shard, or of a local call no shard was picked
    /// for: now and then `chat` (see `RunConfig::chat_shards`).
    fn shard_route(&mut self) -> Route {
        match self.chat_shards && self.rng.chance(250) {
            true => Route::Chat,
            false => Route::Embed,
        }
    }

    /// A gateway process restarts: its open local calls die with it (their
    /// holds count as consumed: the calls may have run), its book is gone,
    /// and a new process with the next boot epoch starts. The old shards
    /// must be refused to the new book and their reconcile under the new
    /// boot epoch refused by the ledger. With the plant, the new process
    /// keeps the old boot epoch and installs the old documents again.
    pub(super) fn restart_gateway(&mut self, g: usize) {
        self.count("gateway restart");
        let mut i = 0;
        while i < self.local_calls.len() {
            if self.local_calls[i].gateway == g {
                let call = self.local_calls.swap_remove(i);
                let shard = &mut self.shards[call.shard];
                shard.open -= call.units;
                shard.unknown += call.units;
            } else {
                i += 1;
            }
        }
        let planted = self.plant == Some(Plant::ShardAfterRestart);
        let old = self.gateways[g].boot_epoch;
        let boot_epoch = if planted { old } else { old + 1 };
        let public_key = self.signer.public_key_hex();
        self.gateways[g] = Gateway::new(g, boot_epoch, &public_key, &self.node.clock);
        self.note(format!("  gw-{g} restarts, boot epoch {boot_epoch}"));
        for s in 0..self.shards.len() {
            let shard = &self.shards[s];
            if shard.gateway != g || shard.boot_epoch != old {
                continue;
            }
            let phase = shard.phase;
            let Some(document) = shard.document.clone() else {
                // Asked, not answered: the new process does not know of it.
                self.shards[s].phase = ShardPhase::Abandoned;
                continue;
            };
            if !matches!(phase, ShardPhase::Held | ShardPhase::Reconciling) {
                continue;
            }
            let installed = self.gateways[g].book.install(document.clone());
            match (installed, planted) {
                (Ok(()), true) => {
                    self.shards[s].phase = ShardPhase::Held;
                    self.shards[s].body = None;
                    self.count("planted: old shard installed after a restart");
                    continue;
                }
                (Err(reservoir_client::shards::ShardRefused::OtherBootEpoch(_)), false) => {
                    self.count("shard refused to its restarted gateway");
                }
                (Err(reservoir_client::shards::ShardRefused::Expired), true) => {}
                (other, _) => {
                    self.findings.push(finding(
                        Gate::ShardDoubleSpent,
                        format!(
                            "shard {} offered to gw-{g} after its restart: {other:?}",
                            self.shards[s].id
                        ),
                    ));
                }
            }
            self.shards[s].phase = ShardPhase::Abandoned;
            self.count("shard abandoned by a restart");
            if planted {
                // Under the same boot epoch the ledger cannot tell the two apart.
                continue;
            }
            // The new process presents the old shard anyway: refused.
            self.present_unbound(s, Presenter::Restarted, document);
        }
    }

    /// A gateway shard `s` is not bound to presents it to the ledger (a
    /// reconcile under its own id and boot epoch, no receipts), sent in the
    /// next wave: the restarted process of its own gateway, or a second
    /// gateway whose book refused it.
    pub(super) fn present_unbound(&mut self, s: usize, by: Presenter, document: HeldDocument) {
        let g = match by {
            Presenter::Restarted => self.shards[s].gateway,
            Presenter::Other(h) => h,
        };
        // Planted: the body names the identity the document is bound to.
        let (id, boot_epoch) = match self.plant == Some(Plant::BindingFromDocument) {
            true => (document.gateway_id.clone(), document.gateway_boot_epoch),
            false => (gateway_id(g), self.gateways[g].boot_epoch),
        };
        let body = serde_json::json!({
            "shard": document,
            "gateway_id": id,
            "gateway_boot_epoch": boot_epoch,
            "receipts": [],
        });
        if let Some(request) = self.reconcile_of(s, body) {
            let writer = self.writer_of(s);
            self.probes
                .push((Origin::ShardProbe(s, by), writer, request));
        }
    }

    /// A call of a cut-off gateway, admitted from its book or refused.
    fn admit_locally(&mut self, g: usize) {
        // The gateway's shards in its book; which one the book takes a
        // call from is told by whose reserved units grow.
        let candidates: Vec<usize> = (0..self.shards.len())
            .filter(|&s| self.shards[s].gateway == g && self.shards[s].phase == ShardPhase::Held)
            .collect();
        // Mostly a tenant and route the gateway holds a shard for; now and
        // then any.
        let (tenant, route) = match candidates.is_empty() || self.rng.chance(200) {
            true => (self.rng.index(TENANTS.len()), self.shard_route()),
            false => {
                let s = &self.shards[candidates[self.rng.index(candidates.len())]];
                (s.tenant, s.route)
            }
        };
        let units = match route {
            Route::Embed => self.rng.range(100, 1_500),
            // A route that limits requests holds one per call.
            Route::Chat => 1,
        };
        let gateway = &mut self.gateways[g];
        gateway.local_calls += 1;
        let id = format!("gw-{g}-b{}-l{}", gateway.boot_epoch, gateway.local_calls);
        let request = ReserveRequest::units(TENANTS[tenant].name, route.name(), units);
        let client_id = reservoir_client::ReservationId::new(id.clone()).expect("a plain id");
        let before: Vec<u64> = candidates
            .iter()
            .map(|&s| self.reserved_in_book(s))
            .collect();
        let Some(hold) = self.gateways[g].book.reserve(&client_id, &request, None) else {
            self.note(format!("  {id} local {units} -> refused"));
            self.count("local call refused (no shard)");
            return;
        };
        let taken = candidates
            .iter()
            .zip(before)
            .find(|&(&s, before)| self.reserved_in_book(s) == before + units)
            .map(|(&s, _)| s);
        let Some(s) = taken else {
            self.findings.push(finding(
                Gate::ShardBooks,
                format!("{id}: admitted locally, no shard's reserved units grew by {units}"),
            ));
            return;
        };
        let shard = &mut self.shards[s];
        shard.open += units;
        shard.admitted_offline = true;
        let line = format!("  {id} local {units} -> held by {}", shard.id);
        let chat = shard.route == Route::Chat;
        if shard.consumed() > shard.units {
            let detail = format!(
                "shard {} of {} units: {} consumed or held across its books",
                shard.id,
                shard.units,
                shard.consumed()
            );
            self.findings.push(finding(Gate::ShardDoubleSpent, detail));
        }
        self.note(line);
        self.count("local call admitted from a shard");
        if chat {
            self.count("local call admitted from a shard of chat");
        }
        self.local_calls.push(LocalCall {
            id,
            gateway: g,
            shard: s,
            units,
            hold,
        });
    }

    /// The writer shard that decides shard `s`'s requests.
    fn writer_of(&self, s: usize) -> usize {
        let shard = &self.shards[s];
        let tenant = TENANTS[shard.tenant].name;
        self.node.writers.shard_of(tenant, shard.route.name())
    }

    fn reserved_in_book(&self, s: usize) -> u64 {
        let shard = &self.shards[s];
        self.gateways[shard.gateway]
            .book
            .books(&shard.id)
            .map_or(0, |b| b.local_reserved_units)
    }

    /// A local call ends: settled (below, at or above its hold), released,
    /// or its usage unknown (the hold stays retired, never unused).
    fn end_local_call(&mut self, call: LocalCall) {
        let shard = &mut self.shards[call.shard];
        shard.open -= call.units;
        // A request counts one, or two when the call made another on the
        // way (above its hold); tokens up to half again the hold.
        let most = match shard.route {
            Route::Embed => call.units * 3 / 2,
            Route::Chat => 2,
        };
        let what = match self.rng.below(100) {
            0..=69 => {
                let used = self.rng.range(0, most);
                call.hold.settle(&Settlement {
                    actual_units: used,
                    operation_id: None,
                    usage: None,
                });
                shard.used += used;
                shard.spent += used.min(call.units);
                if used > call.units {
                    self.count("local call settled above its hold");
                }
                format!("settled {used}")
            }
            70..=84 => {
                call.hold.release();
                "released".to_string()
            }
            _ => {
                let book = &self.gateways[call.gateway].book;
                if !book.mark_usage_unknown(&call.id) {
                    self.findings.push(finding(
                        Gate::ShardBooks,
                        format!("{}: the book does not know the open call", call.id),
                    ));
                }
                shard.unknown += call.units;
                self.count("local call with unknown usage");
                "usage unknown".to_string()
            }
        };
        self.note(format!("  {} local -> {what}", call.id));
    }

    fn begin_reconcile(&mut self, s: usize) {
        let shard = &self.shards[s];
        match self.gateways[shard.gateway].book.begin_reconcile(&shard.id) {
            Ok(Reconcile::Send(body)) => {
                self.shards[s].body = Some(body);
                self.shards[s].phase = ShardPhase::Reconciling;
            }
            other => {
                let detail = format!("shard {}: begin reconcile: {other:?}", shard.id);
                self.findings.push(finding(Gate::UnexpectedAnswer, detail));
            }
        }
    }

    /// The writer's request for a reconcile body, through the server's own
    /// translation (`None`, with a finding: it refused a body it should take).
    fn reconcile_of(&mut self, s: usize, body: serde_json::Value) -> Option<Request> {
        let id = self.shards[s].id.clone();
        let translated = serde_json::from_value::<ReconcileBody>(body)
            .map_err(|e| e.to_string())
            .and_then(|body| {
                reconcile_request(&id, body, &self.signer, GRACE_MS).map_err(|e| format!("{e:?}"))
            });
        match translated {
            Ok(reconcile) => Some(Request::ReconcileShard(Box::new(reconcile))),
            Err(err) => {
                let detail = format!("shard {id}: reconcile body refused: {err}");
                self.findings.push(finding(Gate::UnexpectedAnswer, detail));
                None
            }
        }
    }

    /// Wave 0's shard requests: issues and reconciles of reachable gateways
    /// (now and then sent twice), and the probes a restart or a second
    /// gateway left.
    pub(super) fn shard_requests(&mut self) -> Vec<(Origin, usize, Request)> {
        let mut requests = std::mem::take(&mut self.probes);
        for s in 0..self.shards.len() {
            let shard = &self.shards[s];
            let due = matches!(shard.phase, ShardPhase::Asking | ShardPhase::Reconciling);
            if !due || self.gateways[shard.gateway].cut_off > 0 {
                continue;
            }
            let writer = self.writer_of(s);
            let copies = if !self.quiet && self.rng.chance(100) {
                self.count("shard request sent twice");
                2
            } else {
                1
            };
            for _ in 0..copies {
                let Some(request) = self.shard_request(s) else {
                    break;
                };
                requests.push((Origin::Shard(s, self.shards[s].phase), writer, request));
            }
        }
        requests
    }

    /// Shard `s`'s request for its phase, from the body the gateway sends
    /// (the same one on every retry).
    fn shard_request(&mut self, s: usize) -> Option<Request> {
        let shard = &self.shards[s];
        if shard.phase == ShardPhase::Reconciling {
            let body = shard
                .body
                .clone()
                .expect("a reconciling shard has its body");
            return self.reconcile_of(s, body);
        }
        let body = IssueShardBody {
            subject: TENANTS[shard.tenant].name.to_string(),
            route: shard.route.name().to_string(),
            units: shard.units,
            gateway_id: gateway_id(shard.gateway),
            gateway_boot_epoch: shard.boot_epoch,
            ttl_ms: shard.ttl_ms,
            shard_id: Some(shard.id.clone()),
        };
        match issue_request(body, self.signer.clone()) {
            Ok(issue) => Some(Request::IssueShard(Box::new(issue))),
            Err(err) => {
                let detail = format!("shard {}: issue body refused: {err:?}", shard.id);
                self.findings.push(finding(Gate::UnexpectedAnswer, detail));
                None
            }
        }
    }
}
