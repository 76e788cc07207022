//! Time as an input. Everything in the server that assigns a time the ledger
//! records (the writer's `now` for each command, the sweepers' "what is due")
//! reads it from a [`Clock`] it was given, never from the system directly, so a
//! test or the simulator can drive time by hand: lease expiry and refill happen
//! when the clock is moved, not when a test sleeps.
//!
//! The writer makes whatever the clock says monotonic per partition
//! (`max(last event time, clock)`), so a clock that steps back is harmless.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use reservoir_core::TimestampMs;

/// Milliseconds since the Unix epoch, as the ledger records them.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> TimestampMs;
}

/// The system's wall clock: what `reservoir serve` runs on.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> TimestampMs {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to. Clones share one time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(now_ms: TimestampMs) -> ManualClock {
        ManualClock {
            now_ms: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Moves the clock forward by `ms` and returns the new time.
    pub fn advance(&self, ms: u64) -> TimestampMs {
        let before = self.now_ms.fetch_add(ms, Ordering::SeqCst);
        before.checked_add(ms).expect("manual clock overflow")
    }

    pub fn set(&self, now_ms: TimestampMs) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> TimestampMs {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// The clock handle the writer and the sweepers share.
pub type SharedClock = Arc<dyn Clock>;

/// The system clock, shared.
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}
