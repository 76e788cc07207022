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
        let refill = refill_due(now_ms, last_refill_ms, refill_interval_ms);
        if refill {
            last_refill_ms = now_ms;
        }
        sweep(&writers, now_ms, refill).await;
    }
}

/// Whether the sweep at `now_ms` sends refills, the last one having sent
/// them at `last_ms`: every `interval_ms`, and at once when the clock stepped
/// back (measured from the later time, the step would hold every refill back
/// for its length; the writer keeps each partition's time monotonic, so a
/// refill sent early mints nothing it should not).
fn refill_due(now_ms: TimestampMs, last_ms: TimestampMs, interval_ms: u64) -> bool {
    now_ms < last_ms || now_ms - last_ms >= interval_ms
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

#[cfg(test)]
mod tests {
    use super::refill_due;

    #[test]
    fn refills_every_interval_and_at_once_after_the_clock_steps_back() {
        // (now, last refill, interval) => due
        let table = [
            (1_000, 1_000, 1_000, false),
            (1_999, 1_000, 1_000, false),
            (2_000, 1_000, 1_000, true),
            (5_000, 1_000, 1_000, true),
            // The clock stepped back 10 minutes: not held back for them.
            (400_000, 1_000_000, 1_000, true),
        ];
        for (now, last, interval, due) in table {
            assert_eq!(
                refill_due(now, last, interval),
                due,
                "{now} {last} {interval}"
            );
        }
    }
}
