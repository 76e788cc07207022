//! Sweepers: they only *send commands*, exactly as a client would, and the core
//! decides (a reservation started meanwhile answers `WrongState`, an early one
//! `NotYetDue`). No clock is read inside the core: the writer stamps `now`.
//!
//! Each tick asks every shard which commands are due (leases past `expires_at_ms`
//! → `Expire`; started calls past their hard execution limit → `MarkUsageUnknown`;
//! every `refill_interval`, partitions with debt or below their burst → `Refill`)
//! and sends them all at once, so they share the shard's next group commit.
//!
//! "Due" is judged on the injected [`crate::clock::Clock`], the same one the
//! writer stamps events with; only the pace of the ticks is real time.

use std::time::Duration;

use reservoir_core::TimestampMs;
use tokio::sync::watch;

use crate::clock::SharedClock;
use crate::writer::{Answer, Failure, Request, Writers};

pub async fn run(
    writers: Writers,
    clock: SharedClock,
    sweep_interval: Duration,
    refill_interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let refill_interval_ms = u64::try_from(refill_interval.as_millis()).unwrap_or(u64::MAX);
    let mut last_refill_ms: TimestampMs = clock.now_ms();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now_ms = clock.now_ms();
        let refill = now_ms.saturating_sub(last_refill_ms) >= refill_interval_ms;
        if refill {
            last_refill_ms = now_ms;
        }
        sweep(&writers, now_ms, refill).await;
    }
}

/// One sweep at `now_ms`: collects what is due from every shard and sends it.
pub async fn sweep(writers: &Writers, now_ms: TimestampMs, refill: bool) {
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
