//! What the client gateway's tasks report, taken into the reference model
//! and the shards' tally, in the order they reported it.

use reservoir_client::{Error as ClientError, Settlement};
use serde_json::json;

use super::task::{settle_sent, Report};
use super::*;

impl World {
    /// What the clients' tasks reported, into the model: each client
    /// gateway's in turn, each in order.
    pub(in crate::run) fn client_reports(&mut self) {
        for i in 0..self.clients.len() {
            let reports = std::mem::take(&mut *self.clients[i].reports.lock().expect("reports"));
            self.take_reports(i, reports);
        }
    }

    /// Client gateway `i`'s reports.
    fn take_reports(&mut self, i: usize, reports: Vec<(usize, Report)>) {
        let now = self.now();
        for (c, report) in reports {
            let id = self.calls[c].id.clone();
            match report {
                Report::Told(receipt) => {
                    let state = serde_json::from_value(json!(receipt.state))
                        .expect("the client's states are the ledger's");
                    let key = PartitionKey {
                        subject: receipt.subject,
                        route: receipt.route,
                        accounting_epoch: receipt.accounting_epoch,
                        policy_generation: receipt.policy_generation,
                    };
                    let call = &mut self.calls[c];
                    if call.told.is_none() && receipt.held_units > 0 {
                        self.admitted[call.tenant] += 1;
                    }
                    self.note(format!("  {id} client told {state:?}"));
                    let call = &mut self.calls[c];
                    call.key = Some(key.clone());
                    call.told = Some(Told {
                        key,
                        state,
                        reserved_units: receipt.reserved_units,
                        actual_units: receipt.actual_units,
                    });
                }
                Report::Local { shard, units } => {
                    let Some(s) = self.shards.iter().position(|x| x.id == shard) else {
                        self.findings.push(finding(
                            Gate::ShardBooks,
                            format!("{id}: admitted from {shard}, a shard the ledger never issued"),
                        ));
                        continue;
                    };
                    self.calls[c].local = Some((s, units));
                    self.clients[i].local_open.insert(c);
                    self.admitted[self.calls[c].tenant] += 1;
                    let sim = &mut self.shards[s];
                    sim.open += units;
                    sim.admitted_offline = true;
                    if sim.consumed() > sim.units {
                        let detail = format!(
                            "shard {shard} of {} units: {} consumed or held across its books",
                            sim.units,
                            sim.consumed()
                        );
                        self.findings.push(finding(Gate::ShardDoubleSpent, detail));
                    }
                    self.count("client call admitted from a shard (the client's fallback)");
                    self.note(format!(
                        "  {id} client: admitted locally, {units} of {shard}"
                    ));
                }
                Report::Queued => self.note(format!("  {id} client: waits for its turn")),
                Report::Admitted => self.note(format!("  {id} client: its turn to start")),
                Report::GaveUp => {
                    // As a release: the client gives the reservation (or the
                    // shard's units) back in the background.
                    self.client_gives_back(c);
                    self.count("client caller stopped waiting for its turn");
                    self.note(format!("  {id} client: stopped waiting for its turn"));
                }
                Report::Started => {
                    if let Some(told) = self.calls[c].told.as_mut() {
                        told.state = ReservationState::Started;
                    }
                    self.note(format!("  {id} client started"));
                }
                Report::Dropped => {
                    self.count("client lease dropped mid-stream (settled in the background)");
                    self.note(format!("  {id} client: stream cut, lease dropped"));
                }
                Report::Unknown(step) => {
                    let since = self.clients[i].lost_since.get(&c).copied().unwrap_or(now);
                    if self.calls[c].unknown_since.is_none() {
                        self.calls[c].unknown_since = Some(since);
                        self.count("unknown");
                        self.count(match step {
                            "reserve" => "client reserve unknown (resolved by asking again)",
                            _ => "client settle unknown (sent again with the same amount)",
                        });
                    }
                    self.note(format!("  {id} client: {step} outcome unknown"));
                }
                Report::Resolved => {
                    if let Some(since) = self.calls[c].unknown_since.take() {
                        self.unknown_resolved_ms.push(now - since);
                    }
                    self.note(format!("  {id} client: resolved"));
                }
                Report::Refused => {
                    self.calls[c].refused = true;
                    self.count("reserve refused");
                    self.note(format!("  {id} client: refused"));
                }
                Report::Releasing => {
                    self.client_gives_back(c);
                    self.note(format!("  {id} client releases"));
                }
                Report::StartFailed(why) => {
                    // The client gives it back in the background: a
                    // release, or a settle at 0 (no input, no output) if
                    // the start did happen.
                    self.calls[c].release = true;
                    self.calls[c].settle = Some(settle_sent(&Settlement::never_ran(None)));
                    self.count("client start failed");
                    self.note(format!("  {id} client: start failed ({why})"));
                }
                Report::Settling(settlement) => {
                    self.calls[c].settle = Some(settle_sent(&settlement));
                    if let Some((s, units)) = self.calls[c].local {
                        self.clients[i].local_open.remove(&c);
                        let used = settlement.actual_units;
                        let shard = &mut self.shards[s];
                        shard.open -= units;
                        shard.used += used;
                        shard.spent += used.min(units);
                        if used > units {
                            self.count("local call settled above its hold");
                        }
                    }
                    self.note(format!("  {id} client settles {}", settlement.actual_units));
                }
                Report::Failed(step, error) => {
                    let code = error.code().unwrap_or("unavailable");
                    let admitted = self.calls[c].told.is_some();
                    match &error {
                        ClientError::Protocol(_) | ClientError::InvalidInput(_) => {
                            self.findings.push(finding(
                                Gate::UnexpectedAnswer,
                                format!("{id} client {step}: {error}"),
                            ));
                        }
                        ClientError::Rejected { status: 500.., .. } => {
                            self.findings.push(finding(
                                Gate::WriterBroke,
                                format!("{id} client {step}: {error}"),
                            ));
                        }
                        // The gateway holds the ledger's receipt for it.
                        ClientError::Rejected { .. }
                            if code == "unknown_reservation" && admitted =>
                        {
                            self.findings.push(finding(
                                Gate::UnexpectedAnswer,
                                format!("{id} client {step}: the ledger admitted it, now: {error}"),
                            ));
                        }
                        ClientError::Unavailable(_) => {
                            self.count("client step failed: unavailable")
                        }
                        _ => self.count("client step failed: rejected"),
                    }
                    // A definitive answer ends an unknown step: the gateway
                    // learnt what became of it.
                    if !matches!(error, ClientError::Unavailable(_)) {
                        if let Some(since) = self.calls[c].unknown_since.take() {
                            self.unknown_resolved_ms.push(now - since);
                        }
                    }
                    self.note(format!("  {id} client {step} failed: {code}"));
                }
                Report::Ended => {
                    self.clients[i].open -= 1;
                    self.calls[c].phase = Phase::Done;
                }
            }
        }
    }

    /// Call `c` gives its reservation back: released at the ledger, or its
    /// shard's units returned to the book.
    fn client_gives_back(&mut self, c: usize) {
        self.calls[c].release = true;
        if let Some((s, units)) = self.calls[c].local {
            self.shards[s].open -= units;
            if let Some(side) = self.client_of(c) {
                side.local_open.remove(&c);
            }
        }
    }
}
