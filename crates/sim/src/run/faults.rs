//! The ledger faults a round arms (failed and held appends, lost replies,
//! crashes, take-overs with a zombie), the snapshot taken meanwhile, and
//! the node healed afterwards.

use super::*;

/// What the coverage counts for an append the log kept only a prefix of
/// (`--torn-appends`), once the node re-claims after it.
pub const TORN_APPEND: &str = "append torn: a prefix kept, in doubt, re-claimed";

/// The fault a round arms.
#[derive(Default)]
pub(super) struct Fault {
    pub(super) name: String,
    /// Appends stay in flight until the waves are out.
    pub(super) hold: bool,
    /// The node dies with its batches in flight.
    pub(super) crash: bool,
    pub(super) take_over: bool,
    /// Replies lost on the way back, per mille.
    pub(super) drop_per_mille: u64,
}

impl World {
    /// At most one ledger fault per round, armed before the waves.
    pub(super) fn arm_fault(&mut self, quiet: bool) -> Fault {
        let mut fault = Fault::default();
        let roll = if quiet { 0 } else { self.rng.below(100) };
        fault.name = match roll {
            0..=54 => "none".to_string(),
            55..=62 => {
                let n = self.rng.range(1, 3) as usize;
                self.node.log.inner.fail_next_appends(n);
                format!("fail next {n} appends")
            }
            63..=68 if self.torn_appends && self.rng.chance(500) => {
                let per_mille = self.rng.range(1, 999);
                self.node.log.inner.tear_next_append(Some(per_mille));
                format!("next append of several torn ({per_mille}‰ kept), in doubt")
            }
            63..=68 => {
                self.node.log.inner.fail_next_append_in_doubt();
                "next append in doubt".to_string()
            }
            69..=70 => {
                self.node.log.inner.fail_next_append_fatally();
                "next append fails fatally".to_string()
            }
            71..=80 => {
                fault.hold = true;
                "appends held in flight".to_string()
            }
            81..=85 => {
                (fault.hold, fault.crash) = (true, true);
                "crash mid-batch".to_string()
            }
            86..=88 if self.zombies && self.zombie.is_none() => {
                fault.take_over = true;
                "another process takes the log over; the old one runs on".to_string()
            }
            _ => {
                fault.drop_per_mille = 300;
                "30% of replies lost".to_string()
            }
        };
        fault
    }

    /// A snapshot every shard answered for is "written"; one a shard failed
    /// (its batch's append failed, the node crashed) is not.
    pub(super) fn finish_snapshot(&mut self) {
        let Some((cut, parts)) = self.taking.take() else {
            return;
        };
        if parts.iter().any(Option::is_none) {
            self.note("  snapshot not written: a shard did not answer".into());
            return;
        }
        let mut snapshot = reservoir_server::snapshot::Snapshot {
            format: reservoir_server::snapshot::FORMAT.to_string(),
            cuts: vec![cut],
            partitions: Vec::new(),
            active: Vec::new(),
        };
        for (partitions, active) in parts.into_iter().flatten() {
            snapshot.partitions.extend(partitions);
            snapshot.active.extend(active);
        }
        let next_offset = snapshot.cuts[0].next_offset;
        self.note(format!(
            "  snapshot written, cut at log offset {next_offset}"
        ));
        self.count("snapshot written");
        self.node.snapshot = Some(snapshot);
    }

    /// The zombie runs one round less; it is killed once fenced or out of
    /// rounds. Returns the panic messages of its tasks.
    pub(super) async fn age_zombie(&mut self) -> Vec<String> {
        let Some(zombie) = self.zombie.as_mut() else {
            return Vec::new();
        };
        let stopped = zombie.stopped();
        zombie.rounds_left = zombie.rounds_left.saturating_sub(1);
        if stopped.is_none() && zombie.rounds_left > 0 {
            return Vec::new();
        }
        let zombie = self.zombie.take().expect("checked");
        match &stopped {
            Some(reason) if reason.contains("fenced") || reason.contains("injected") => {
                self.count("zombie fenced");
                self.note(format!("  the zombie stopped: {reason}"));
            }
            Some(reason) => self.findings.push(finding(
                Gate::WriterBroke,
                format!("the zombie stopped: {reason}"),
            )),
            None => self.note("  the zombie is killed".into()),
        }
        zombie.kill().await
    }

    /// Rebuilds the node after a crash, a fatal log error or a log in doubt.
    pub(super) async fn heal(&mut self, crashed: bool) {
        let result = if crashed {
            self.note("  node restarts after the crash".into());
            self.count("restart");
            if self.node.snapshot.is_some() {
                self.count("restart from a snapshot");
            }
            self.node.restart(true).await.map(|()| Vec::new())
        } else {
            match self.node.trouble() {
                None => return,
                Some(Trouble::InDoubt(reason)) => {
                    self.note(format!("  log in doubt ({reason}): re-claim and rebuild"));
                    self.count("re-claim");
                    if reason.contains("the rest lost") {
                        self.count(TORN_APPEND);
                    }
                    if self.node.snapshot.is_some() {
                        self.count("re-claim from a snapshot");
                    }
                    self.node.reclaim().await
                }
                Some(Trouble::Fatal(reason)) => {
                    if !reason.contains("injected") {
                        self.findings.push(finding(
                            Gate::WriterBroke,
                            format!("writer stopped: {reason}"),
                        ));
                    }
                    self.note(format!("  fatal ({reason}): node restarts"));
                    self.count("restart");
                    let panics = self.node.crash().await;
                    self.node.restart(true).await.map(|()| panics)
                }
            }
        };
        // Everything acknowledged is checked again against the rebuilt state.
        for call in &mut self.calls {
            call.verified = false;
        }
        match result {
            Ok(panics) => {
                for panic in panics {
                    self.findings.push(finding(
                        Gate::WriterBroke,
                        format!("writer panicked: {panic}"),
                    ));
                }
            }
            Err(err) => self.findings.push(finding(Gate::RecoveryFailed, err)),
        }
    }
}
