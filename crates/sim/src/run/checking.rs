//! After every round: the checker's gates over the node, the log and the
//! model, and what a finding leaves in the trace.

use super::*;

impl World {
    /// The checker (see `check`), and the model against the ledger.
    pub(super) async fn check(&mut self, round: usize, with_recovery: bool) {
        let mut out = Vec::new();
        // The live state first: asking for it may append (the first batch
        // after a rebuild finishes what a torn append left half done, see
        // `reservoir_server::writer::moves`), and the log is read after it.
        let live = match self.node.partitions().await {
            Ok(live) => live,
            Err(err) => {
                self.mirror.follow(&self.node.log, &mut out).await;
                out.push(finding(Gate::WriterBroke, err));
                self.fail(round, out);
                return;
            }
        };
        self.mirror.follow(&self.node.log, &mut out).await;
        check::check_state("live", &live, &mut out);
        check::check_state("log", &self.mirror.partitions, &mut out);
        check::compare(
            Gate::LogDisagrees,
            "log",
            &self.mirror.partitions,
            "live",
            &live,
            &mut out,
        );
        self.check_model(&live, &mut out);
        self.check_lines(&live, &mut out);
        self.check_shards(&live, &mut out);
        if self.plant == Some(Plant::IndexForgets) {
            let mut index = self.node.writers.index.write().expect("index lock");
            for p in live.values().filter(|p| p.closed) {
                for id in p.reservations.keys() {
                    index.remove(id);
                }
            }
        }
        if with_recovery {
            match reservoir_server::recovery::replay_state(&*self.node.log, self.node.shards).await
            {
                Ok(recovered) => {
                    let rebuilt: Partitions = recovered
                        .shards
                        .into_iter()
                        .flat_map(|s| s.partitions.into_iter().map(|(k, ps)| (k, ps.partition)))
                        .collect();
                    check::compare(
                        Gate::RecoveryDisagrees,
                        "recovered",
                        &rebuilt,
                        "live",
                        &live,
                        &mut out,
                    );
                }
                Err(err) => out.push(finding(Gate::RecoveryFailed, err)),
            }
        }
        self.fail(round, out);
    }

    pub(super) fn fail(&mut self, round: usize, out: Vec<Finding>) {
        for f in &out {
            self.note(format!("r{round} FINDING {}: {}", f.gate.name(), f.detail));
        }
        self.findings.extend(out);
    }
}
