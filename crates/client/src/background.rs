//! Settles and releases begun by a dropped handle, on the runtime, counted so
//! a gateway (or a test) can wait for them before it exits.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Background {
    pending: AtomicUsize,
    failures: AtomicU64,
    idle: Notify,
}

impl Background {
    /// Runs `work` on the current runtime (a drop outside any runtime runs it
    /// on a thread of its own, so a guard dropped late still settles).
    pub(crate) fn spawn<F>(self: &std::sync::Arc<Self>, what: &'static str, work: F)
    where
        F: Future<Output = Result<(), crate::Error>> + Send + 'static,
    {
        self.pending.fetch_add(1, Ordering::SeqCst);
        let this = self.clone();
        let task = async move {
            if let Err(e) = work.await {
                this.failures.fetch_add(1, Ordering::SeqCst);
                metrics::counter!("reservoir_client_background_failures_total", "step" => what)
                    .increment(1);
                tracing::warn!(step = what, error = %e, "background step failed");
            }
            if this.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
                this.idle.notify_waiters();
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(task);
            }
            Err(_) => {
                std::thread::spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt.block_on(task),
                        Err(e) => tracing::error!(error = %e, "no runtime for a background step"),
                    }
                });
            }
        }
    }

    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }
}
