//! Sweepers: they only *send commands*, exactly as a client would, and the core
//! decides (a reservation started meanwhile answers `WrongState`, an early one
//! `NotYetDue`). No clock is read inside the core: the writer stamps `now`.
//!
//! Each tick asks every shard which commands are due (leases past `expires_at_ms`
//! → `Expire`; started calls past their hard execution limit → `MarkUsageUnknown`;
//! every `refill_interval`, partitions with debt or below their burst → `Refill`)
//! and sends them all at once, so they share the shard's next group commit.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::writer::{clock_ms, Answer, Failure, Request, Writers};

pub async fn run(
    writers: Writers,
    sweep_interval: Duration,
    refill_interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_refill = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let refill = last_refill.elapsed() >= refill_interval;
        if refill {
            last_refill = Instant::now();
        }
        sweep(&writers, refill).await;
    }
}

async fn sweep(writers: &Writers, refill: bool) {
    let now_ms = clock_ms();
    let mut calls = Vec::new();
    for shard in 0..writers.shards() {
        let due = match writers
            .call(shard, Request::CollectDue { now_ms, refill })
            .await
        {
            Ok(Answer::Due(due)) => due,
            Ok(_) => continue,
            Err(failure) => {
                tracing::debug!(shard, ?failure, "sweep skipped");
                continue;
            }
        };
        for (key, command) in due {
            let writers = writers.clone();
            calls.push(tokio::spawn(async move {
                let what = format!("{command:?}");
                match writers.call(shard, Request::Act { key, command }).await {
                    Ok(_) => {}
                    // Raced with the client (started, released, already expired): fine.
                    Err(Failure::Rejected { rejection, .. }) => {
                        tracing::debug!(%rejection, what, "sweep command refused")
                    }
                    Err(other) => {
                        tracing::warn!(?other, what, "sweep command failed; retried next sweep")
                    }
                }
            }));
        }
    }
    for call in calls {
        let _ = call.await;
    }
}
