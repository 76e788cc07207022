//! The gateways: calls from reserve to their end, the client behaviour
//! (an UNKNOWN step is retried as it was, with the same id; impatient
//! duplicates; copies the network delivers late), and the reference model
//! of what each gateway was told, checked against the ledger.

use super::*;

/// The phase a call is in: the request its gateway sends next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Reserve,
    Start,
    Settle,
    Release,
    Done,
}

impl Phase {
    pub(super) fn name(self) -> &'static str {
        match self {
            Phase::Reserve => "reserve",
            Phase::Start => "start",
            Phase::Settle => "settle",
            Phase::Release => "release",
            Phase::Done => "done",
        }
    }
}

/// The records the model check read from the node's idempotency index, with
/// the bytes they were decoded from. Every call is checked again after each
/// restart, and most of those checks find the same bytes in the index:
/// they are compared, not decoded again (decoding was a tenth of a run's CPU).
#[derive(Default)]
pub(super) struct RetiredSeen(HashMap<ReservationId, (Vec<u8>, Retired)>);

impl RetiredSeen {
    /// `id`'s record in `index`, decoded only if its bytes changed since the last look.
    fn get(
        &mut self,
        index: &RetiredIndex,
        id: &ReservationId,
    ) -> Result<Option<&Retired>, String> {
        let seen = &mut self.0;
        let Some(changed) = index.get_with(id, |bytes| match seen.get(id) {
            Some((old, _)) if old.as_slice() == bytes => Ok(None),
            _ => RetiredIndex::decode(id, bytes).map(|r| Some((bytes.to_vec(), r))),
        })?
        else {
            seen.remove(id);
            return Ok(None);
        };
        if let Some(fresh) = changed? {
            seen.insert(id.clone(), fresh);
        }
        Ok(seen.get(id).map(|(_, r)| r))
    }
}

/// What a gateway was last told about a reservation: the reference model.
#[derive(Clone, Debug)]
pub(super) struct Told {
    pub(super) key: PartitionKey,
    pub(super) state: ReservationState,
    pub(super) reserved_units: Units,
    pub(super) actual_units: Option<Units>,
}

/// One LLM call through a gateway, from reserve to its end.
pub(super) struct Call {
    pub(super) id: ReservationId,
    pub(super) gateway: usize,
    pub(super) tenant: usize,
    pub(super) route: Route,
    pub(super) digest: RequestDigest,
    pub(super) amount: Amount,
    pub(super) operation: OperationId,
    /// Plan: give the reservation back instead of starting the call.
    pub(super) release: bool,
    pub(super) phase: Phase,
    pub(super) key: Option<PartitionKey>,
    /// Fixed at the first settle attempt: a retry sends the same usage.
    pub(super) settle: Option<(Option<u64>, Option<Usage>)>,
    /// Simulated time the current step became UNKNOWN (its answer lost).
    pub(super) unknown_since: Option<u64>,
    /// Requests of this call in flight (two: an impatient duplicate).
    pub(super) in_flight: u32,
    /// Two copies of its reserve were in flight at once: a refusal of one
    /// does not say the other was not admitted (a refusal makes no record).
    pub(super) reserve_duplicated: bool,
    pub(super) told: Option<Told>,
    pub(super) refused: bool,
    /// Admitted from an emergency shard by the client gateway's fallback:
    /// (the shard, the units it holds).
    pub(super) local: Option<(usize, u64)>,
    /// The ledger was seen holding this call's record finished, as the model
    /// expects: a finished record never changes, so it is checked again only
    /// after the node was rebuilt from the log.
    pub(super) verified: bool,
}

impl World {
    /// The next request of some gateway: a retry of an UNKNOWN step first,
    /// else the next step of an open call, else a new call; now and then an
    /// impatient duplicate of a request still in flight (a client that timed
    /// out and sent it again).
    pub(super) fn gateway_request(&mut self, quiet: bool) -> Option<(Origin, usize, Request)> {
        let g = self.rng.index(GATEWAYS);
        if self.gateways[g].cut_off > 0 {
            // Cut off from the ledger: its calls wait (it admits from its
            // shards meanwhile, see `shards`).
            return None;
        }
        let of_gateway = |flying: bool| -> Vec<usize> {
            (0..self.calls.len())
                .filter(|&c| {
                    let call = &self.calls[c];
                    call.gateway == g && call.phase != Phase::Done && (call.in_flight > 0) == flying
                })
                .collect()
        };
        let open = of_gateway(false);
        let flying = of_gateway(true);
        if !quiet && !flying.is_empty() && self.rng.chance(60) {
            let c = flying[self.rng.index(flying.len())];
            self.count("duplicate request");
            return Some(self.send(c));
        }
        let unknown = open
            .iter()
            .copied()
            .find(|&c| self.calls[c].unknown_since.is_some());
        let c = match unknown {
            Some(c) if quiet || self.rng.chance(800) => c,
            _ if quiet => return None,
            _ if self.open_calls[g] < CALLS_PER_GATEWAY
                && (open.is_empty() || self.rng.chance(400)) =>
            {
                self.new_call(g)
            }
            _ if open.is_empty() => return None,
            _ => open[self.rng.index(open.len())],
        };
        Some(self.send(c))
    }

    /// Call `c`'s request for its phase (the same one again on a retry).
    pub(super) fn send(&mut self, c: usize) -> (Origin, usize, Request) {
        let request = self.request_of(c);
        let call = &mut self.calls[c];
        call.in_flight += 1;
        if call.in_flight > 1 && call.phase == Phase::Reserve {
            call.reserve_duplicated = true;
        }
        let phase = call.phase;
        if !self.quiet && self.rng.chance(30) {
            // The network keeps a copy and delivers it much later.
            let due = self.round + self.rng.range(1, 40) as usize;
            self.delayed.push((due, c, phase));
            let call = &mut self.calls[c];
            if phase == Phase::Reserve {
                call.reserve_duplicated = true;
            }
            self.count("request delayed in the network");
        }
        let call = &self.calls[c];
        let (subject, route) = (TENANTS[call.tenant].name, call.route.name());
        let shard = self.node.writers.shard_of(subject, route);
        (Origin::Call(c, phase), shard, request)
    }

    pub(super) fn new_call(&mut self, g: usize) -> usize {
        let c = self.push_call(g);
        self.open_calls[g] += 1;
        c
    }

    /// A new call of gateway `g` (its tenant, route and sizes drawn now), in the model.
    pub(super) fn push_call(&mut self, g: usize) -> usize {
        let c = self.calls.len();
        let tenant = self.rng.index(TENANTS.len());
        let route = ROUTES[self.rng.index(ROUTES.len())];
        let (amount, inputs) = match route {
            Route::Chat => {
                let input = self.rng.range(100, 3_000);
                let max_tokens = self.rng.range(100, 1_500);
                (
                    Amount::Sized {
                        counted_input_tokens: input,
                        max_tokens: Some(max_tokens),
                    },
                    format!("chat {input} {max_tokens}"),
                )
            }
            Route::Embed => {
                let units = self.rng.range(200, 2_000);
                (Amount::Units(units), format!("embed {units}"))
            }
        };
        let id = ReservationId::new(format!("g{g}-c{c}")).expect("a plain reservation id");
        let digest = RequestDigest(Sha256::digest(inputs.as_bytes()).into());
        let operation = OperationId::new(format!("op-{c}")).expect("a plain operation id");
        let release = self.rng.chance(200);
        self.calls.push(Call {
            id,
            gateway: g,
            tenant,
            route,
            digest,
            amount,
            operation,
            release,
            phase: Phase::Reserve,
            key: None,
            settle: None,
            unknown_since: None,
            in_flight: 0,
            reserve_duplicated: false,
            told: None,
            refused: false,
            local: None,
            verified: false,
        });
        self.demand[tenant] += 1;
        self.count("calls");
        c
    }

    pub(super) fn request_of(&mut self, c: usize) -> Request {
        let phase = self.calls[c].phase;
        if phase == Phase::Settle && self.calls[c].settle.is_none() {
            let settle = self.usage_for(c);
            self.calls[c].settle = Some(settle);
        }
        self.request_for(c, phase)
    }

    /// Call `c`'s request in `phase`: always the same one (a settle's usage
    /// is fixed at its first attempt).
    pub(super) fn request_for(&self, c: usize, phase: Phase) -> Request {
        let call = &self.calls[c];
        let key = || {
            call.key
                .clone()
                .expect("a call past its reserve knows its partition")
        };
        match phase {
            Phase::Reserve => Request::Reserve {
                subject: TENANTS[call.tenant].name.to_string(),
                route: call.route.name().to_string(),
                id: call.id.clone(),
                digest: call.digest,
                amount: call.amount,
            },
            Phase::Start => Request::Act {
                key: key(),
                command: Command::Start {
                    id: call.id.clone(),
                    operation_id: call.operation.clone(),
                },
            },
            Phase::Release => Request::Act {
                key: key(),
                command: Command::Release {
                    id: call.id.clone(),
                },
            },
            Phase::Settle => {
                let (actual_units, mut usage) = call
                    .settle
                    .clone()
                    .expect("a settle's usage is fixed before it is sent");
                if self.plant == Some(Plant::InputUncounted) {
                    // What is sent, not what the gateway (the model) meant.
                    if let Some(u) = usage.as_mut().filter(|u| u.reported_input_tokens.is_none()) {
                        u.counted_input_tokens = None;
                    }
                }
                Request::Settle {
                    key: key(),
                    id: call.id.clone(),
                    operation_id: Some(call.operation.clone()),
                    actual_units,
                    usage,
                }
            }
            Phase::Done => unreachable!("a finished call sends nothing"),
        }
    }

    /// What a `chat` call sized `(counted_input_tokens, max_tokens)` used:
    /// (output tokens, up to 2.5 times its limit; the input the provider
    /// reports, up to 200 above the gateway's count).
    pub(super) fn draw_use(
        &mut self,
        counted_input_tokens: u64,
        max_tokens: Option<u64>,
    ) -> (u64, u64) {
        let max = max_tokens.unwrap_or(crate::node::DEFAULT_OUTPUT_TOKENS);
        let output = self.rng.range(0, max * 5 / 2);
        (output, counted_input_tokens + self.rng.range(0, 200))
    }

    /// What the call really used: below or above what it reserved.
    pub(super) fn usage_for(&mut self, c: usize) -> (Option<u64>, Option<Usage>) {
        let (route, amount) = (self.calls[c].route, self.calls[c].amount);
        match (route, amount) {
            (
                Route::Chat,
                Amount::Sized {
                    counted_input_tokens,
                    max_tokens,
                },
            ) => {
                let (output, reported) = self.draw_use(counted_input_tokens, max_tokens);
                if self.stream_cancel && self.rng.chance(150) {
                    let sizing = (counted_input_tokens, max_tokens);
                    return self.cancelled_stream(c, sizing, reported, output);
                }
                (
                    None,
                    Some(Usage {
                        model: None,
                        output_tokens: Some(output),
                        counted_input_tokens: Some(counted_input_tokens),
                        reported_input_tokens: Some(reported),
                        cache_read_input_tokens: None,
                    }),
                )
            }
            (_, Amount::Units(units)) => (Some(self.rng.range(0, units * 2)), None),
            (route, amount) => unreachable!("{route:?} calls are not sized as {amount:?}"),
        }
    }

    pub(super) fn deliver_to_call(&mut self, c: usize, sent: Phase, reply: Reply, lost: bool) {
        let now = self.now();
        self.calls[c].in_flight -= 1;
        let phase = self.calls[c].phase;
        let what = format!("  {} {}", self.calls[c].id, sent.name());
        let outcome = if lost {
            "LOST".to_string()
        } else {
            outcome_of(&reply)
        };
        if sent != phase {
            self.late_duplicate(c, reply, lost, format!("{what} -> {outcome}"));
            return;
        }
        self.note(format!("{what} -> {outcome}"));
        let unknown = lost || matches!(reply, Err(Failure::Unavailable(_)));
        if unknown {
            let call = &mut self.calls[c];
            if call.unknown_since.is_none() {
                call.unknown_since = Some(now);
                self.count("unknown");
            }
            return;
        }
        if let Some(since) = self.calls[c].unknown_since.take() {
            self.unknown_resolved_ms.push(now - since);
        }
        match reply {
            Ok(Answer::Reservation {
                key, reservation, ..
            }) => self.learned(c, key, *reservation),
            Err(Failure::Rejected { rejection, .. }) => self.rejected(c, phase, rejection),
            Err(Failure::Internal(msg)) => {
                self.findings
                    .push(finding(Gate::WriterBroke, format!("{what}: {msg}")));
            }
            other => self.findings.push(finding(
                Gate::UnexpectedAnswer,
                format!("{what}: {other:?}"),
            )),
        }
    }

    /// The answer to a copy of a request whose other copy's answer already
    /// moved the call on. Dropped, except one: a refusal is not a receipt (it
    /// makes no record), so the other copy of a refused reserve may have been
    /// admitted after it. The gateway then holds a reservation for a call it
    /// gave up, and gives it back.
    pub(super) fn late_duplicate(&mut self, c: usize, reply: Reply, lost: bool, line: String) {
        let call = &self.calls[c];
        let admitted_after_refusal = match (&reply, lost) {
            (Ok(Answer::Reservation { reservation, .. }), false) => {
                call.refused
                    && call.told.is_none()
                    && reservation.state == ReservationState::Reserved
            }
            _ => false,
        };
        if !admitted_after_refusal {
            self.note(format!("{line} (late duplicate, dropped)"));
            return;
        }
        self.note(format!(
            "{line} (late duplicate of a refused reserve: released)"
        ));
        self.count("refused, then admitted by a duplicate");
        let Ok(Answer::Reservation {
            key, reservation, ..
        }) = reply
        else {
            unreachable!("matched above");
        };
        let call = &mut self.calls[c];
        call.refused = false;
        call.release = true;
        self.open_calls[call.gateway] += 1;
        call.phase = Phase::Reserve;
        self.learned(c, key, *reservation);
    }

    /// A copy of a request delivered long after it was sent: nobody waits
    /// for its answer, but the answer must agree with the ledger's record:
    /// the same reservation, never a new one for an id already reserved
    /// (which may by now live only in the on-disk idempotency index).
    pub(super) fn late_copy(&mut self, c: usize, phase: Phase, reply: Reply) {
        let call = &self.calls[c];
        let line = format!(
            "  {} {} (late copy) -> {}",
            call.id,
            phase.name(),
            outcome_of(&reply)
        );
        let mut wrong = None;
        if let Ok(Answer::Reservation {
            key,
            reservation,
            created,
            ..
        }) = &reply
        {
            match &call.told {
                Some(told)
                    if *created
                        || told.key != *key
                        || told.reserved_units != reservation.reserved_units =>
                {
                    wrong = Some(format!(
                        "{}: a late copy of its {} was answered with {:?} in {key} (created: {created}), but it was told {:?} in {}",
                        call.id,
                        phase.name(),
                        reservation.state,
                        told.state,
                        told.key
                    ));
                }
                None if *created && call.refused => {
                    self.count("refused, then admitted by a late copy")
                }
                _ => {}
            }
        }
        if let Err(Failure::Internal(msg)) = &reply {
            self.findings
                .push(finding(Gate::WriterBroke, format!("{line}: {msg}")));
        }
        self.note(line);
        if let Some(wrong) = wrong {
            self.findings.push(finding(Gate::ModelDisagrees, wrong));
        }
    }

    /// The gateway learnt the reservation's record: the model takes it, and
    /// the call moves on from the state the ledger says it is in.
    pub(super) fn learned(&mut self, c: usize, key: PartitionKey, r: Reservation) {
        let first = self.calls[c].told.is_none();
        if first && r.held_units > 0 {
            let tenant = self.calls[c].tenant;
            self.admitted[tenant] += 1;
        }
        let phase = self.calls[c].phase;
        let next = match r.state {
            ReservationState::Reserved => match (phase, self.calls[c].release) {
                (Phase::Reserve, true) => Phase::Release,
                (Phase::Reserve, false) => Phase::Start,
                (phase, _) => phase,
            },
            ReservationState::Started | ReservationState::UsageUnknown => Phase::Settle,
            ReservationState::Expiring | ReservationState::Expired => {
                self.count("lease expired under a call");
                Phase::Done
            }
            _ => Phase::Done,
        };
        if self.plant == Some(Plant::DoubleRefund) && r.state == ReservationState::Released {
            self.plant_double_refund(c, &key, &r);
        }
        let call = &mut self.calls[c];
        call.told = Some(Told {
            key: key.clone(),
            state: r.state,
            reserved_units: r.reserved_units,
            actual_units: r.actual_units,
        });
        call.key = Some(key);
        self.set_phase(c, next);
    }

    pub(super) fn set_phase(&mut self, c: usize, next: Phase) {
        let call = &mut self.calls[c];
        if call.phase != Phase::Done && next == Phase::Done {
            self.open_calls[call.gateway] -= 1;
        }
        call.phase = next;
    }

    pub(super) fn rejected(&mut self, c: usize, phase: Phase, rejection: Rejection) {
        let expected = match (phase, &rejection) {
            (
                Phase::Reserve,
                Rejection::InsufficientCapacity { .. } | Rejection::DebtOutstanding { .. },
            ) => {
                self.calls[c].refused = true;
                self.count("reserve refused");
                true
            }
            (Phase::Start, Rejection::LeaseExpired { .. }) => true,
            (
                Phase::Start | Phase::Release,
                Rejection::WrongState {
                    state: ReservationState::Expiring | ReservationState::Expired,
                    ..
                },
            ) => true,
            _ => false,
        };
        if expected {
            if phase != Phase::Reserve {
                self.count("lease expired under a call");
            }
            self.set_phase(c, Phase::Done);
        } else {
            self.findings.push(finding(
                Gate::UnexpectedAnswer,
                format!("{} {}: {rejection:?}", self.calls[c].id, phase.name()),
            ));
        }
    }

    /// The planted double refund: a release in a closed generation is
    /// credited once more into the active one, as a move that never left.
    pub(super) fn plant_double_refund(&mut self, c: usize, key: &PartitionKey, r: &Reservation) {
        let call = &self.calls[c];
        let Some(line) = self
            .lines
            .iter()
            .find(|l| l.tenant == call.tenant && l.route == Route::Chat)
        else {
            return;
        };
        if call.route != Route::Chat
            || key.policy_generation >= line.generation
            || r.held_units == 0
        {
            return;
        }
        let active = PartitionKey {
            policy_generation: line.generation,
            ..key.clone()
        };
        let command = Command::MoveIn {
            move_id: MoveId::new(format!("mv-planted-{}", r.id)).expect("a plain move id"),
            from: key.clone(),
            units: r.held_units,
            debt_units: 0,
            further: r
                .further
                .iter()
                .map(|h| DimensionAmounts::Moved {
                    units: h.held_units,
                    debt_units: 0,
                })
                .collect(),
        };
        let shard = self.node.writers.shard_of(&key.subject, &key.route);
        self.planted.push_back((
            shard,
            Request::Act {
                key: active.clone(),
                command,
            },
            format!("refund of {} again into {active}", r.id),
        ));
    }

    /// What the gateways did and were told must hold in the ledger:
    /// - a reservation the log debited is in the ledger (in memory or in the
    ///   idempotency index), in the partition the gateway was told;
    /// - with the units it was told, in the state it was told or one
    ///   reachable from it;
    /// - released only if its gateway released it, settled only if its
    ///   gateway settled it, and with exactly the usage the gateway reported
    ///   (whether or not the gateway learnt the outcome);
    /// - a reserve the gateway was told of was debited; a refused one was
    ///   not (unless another copy of it was in flight).
    pub(super) fn check_model(&mut self, live: &Partitions, out: &mut Vec<Finding>) {
        for c in 0..self.calls.len() {
            if self.calls[c].verified {
                continue;
            }
            let wrong = |what: String| {
                finding(
                    Gate::ModelDisagrees,
                    format!("{}: {what}", self.calls[c].id),
                )
            };
            let call = &self.calls[c];
            let Some(key) = self.mirror.debited_in(&call.id) else {
                if let Some(told) = &call.told {
                    out.push(wrong(format!(
                        "told {:?} in {}, the log never debited it",
                        told.state, told.key
                    )));
                }
                continue;
            };
            // The client falls back to a shard only when no attempt can
            // have reached the ledger: a call admitted from both counts twice.
            if let Some((s, _)) = call.local {
                out.push(wrong(format!(
                    "admitted from shard {}, and debited by the ledger in {key}",
                    self.shards[s].id
                )));
            }
            // A duplicate admitted after its copy's refusal, its answer lost,
            // holds its lease until it expires: a leak the gateway cannot
            // see, bounded by the lease.
            if call.refused && !call.reserve_duplicated {
                out.push(wrong("refused, but the log debited it".into()));
            }
            let record = match live.get(key).and_then(|p| p.reservations.get(&call.id)) {
                Some(r) => Some(r.clone()),
                None => match self.retired_seen.get(&self.node.retired, &call.id) {
                    Ok(Some(retired)) if retired.key == *key => Some(retired.reservation.clone()),
                    Ok(_) => None,
                    Err(err) => {
                        out.push(wrong(err));
                        continue;
                    }
                },
            };
            let Some(r) = record else {
                out.push(wrong(format!(
                    "debited in {key} by the log, the ledger has no record"
                )));
                continue;
            };
            let before = out.len();
            if let Some(told) = &call.told {
                let settled = matches!(
                    told.state,
                    ReservationState::Settled | ReservationState::SettledWithDebt
                );
                if told.key != *key
                    || r.reserved_units != told.reserved_units
                    || !reachable(told.state, r.state)
                    || (settled && r.actual_units != told.actual_units)
                {
                    out.push(wrong(format!(
                        "told {:?} in {} ({} units, actual {:?}), the ledger has {:?} in {key} ({} units, actual {:?})",
                        told.state, told.key, told.reserved_units, told.actual_units, r.state, r.reserved_units, r.actual_units
                    )));
                }
            }
            match r.state {
                ReservationState::Released if !call.release => {
                    out.push(wrong("released, but its gateway never released it".into()));
                }
                ReservationState::Settled | ReservationState::SettledWithDebt => {
                    match call.settle.as_ref().map(|s| self.expected_usage(c, s)) {
                        None => out.push(wrong("settled, but its gateway never settled it".into())),
                        Some(expected) => {
                            let settled: Vec<Option<u64>> = std::iter::once(r.actual_units)
                                .chain(r.further.iter().map(|h| h.actual_units))
                                .collect();
                            let expected: Vec<Option<u64>> =
                                expected.into_iter().map(Some).collect();
                            if settled != expected {
                                out.push(wrong(format!(
                                    "settled with {settled:?} per dimension, its gateway reported {expected:?}"
                                )));
                            }
                        }
                    }
                }
                _ => {}
            }
            if out.len() == before && r.state.is_terminal() {
                self.calls[c].verified = true;
            }
        }
    }

    /// What a settle with `(actual_units, usage)` spends in each dimension
    /// of the call's route, primary first: requests as given (1 in the
    /// client's settlement, 0 when the client gives back a started call
    /// it never made), else 1 derived; input as reported
    /// (the gateway's count if the provider reported none), output as
    /// reported (`chat`); the units given (`embed`).
    fn expected_usage(
        &self,
        c: usize,
        (actual_units, usage): &(Option<u64>, Option<Usage>),
    ) -> Vec<u64> {
        match (self.calls[c].route, actual_units, usage) {
            (Route::Embed, Some(units), _) => vec![*units],
            (Route::Chat, actual, Some(u)) => vec![
                actual.unwrap_or(1),
                u.reported_input_tokens
                    .or(u.counted_input_tokens)
                    .unwrap_or(0),
                u.output_tokens.unwrap_or(0),
            ],
            (route, actual, usage) => {
                unreachable!("{route:?} settles with {actual:?} and {usage:?}")
            }
        }
    }
}

/// Whether a record told in state `from` may since have moved to `to`.
pub(super) fn reachable(from: ReservationState, to: ReservationState) -> bool {
    let mut seen = vec![from];
    let mut i = 0;
    while i < seen.len() {
        for next in ReservationState::ALL {
            if seen[i].can_move_to(next) && !seen.contains(&next) {
                seen.push(next);
            }
        }
        i += 1;
    }
    seen.contains(&to)
}
