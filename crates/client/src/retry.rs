//! Retries: exponential backoff with full jitter under one overall deadline.
//!
//! Every write the client retries is idempotent on the ledger (the same
//! reservation id and body, the same operation id, the same settled amount),
//! so repeating a step whose answer was lost can never debit twice; the retry
//! loop only decides *when* to ask again and when to give up.

use std::future::Future;
use std::time::Duration;

use crate::transport::Timer;

/// How long and how often the client retries one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first backoff's upper bound; each later one doubles, up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// One step (all its attempts and waits) ends by then.
    pub deadline: Duration,
    /// One attempt's HTTP timeout (also bounded by what is left of the deadline).
    pub attempt_timeout: Duration,
    /// Wait out a 429's `Retry-After` and ask again while the deadline allows
    /// (off by default: a gateway usually passes the refusal on at once).
    pub retry_refusals: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
            deadline: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(2),
            retry_refusals: false,
        }
    }
}

/// The backoff sequence of one step: attempt `n` waits a uniformly random
/// time in `[0, min(max_backoff, initial_backoff * 2^n)]` ("full jitter", so
/// gateways that failed together do not retry together).
pub struct Backoff {
    policy: RetryPolicy,
    attempt: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    pub fn new(policy: RetryPolicy) -> Self {
        Backoff::seeded(policy, fastrand::u64(..))
    }

    pub fn seeded(policy: RetryPolicy, seed: u64) -> Self {
        Backoff {
            policy,
            attempt: 0,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// The cap of the next wait, before jitter.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(30)).unwrap_or(u32::MAX);
        self.policy
            .initial_backoff
            .saturating_mul(factor)
            .min(self.policy.max_backoff)
    }

    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.rng.u64(0..=nanos))
    }
}

/// What one attempt came to.
pub(crate) enum Attempt<T> {
    Done(T),
    /// Ask again (after at least `after`, e.g. a `Retry-After`); `why` is kept
    /// for the error if the deadline passes first.
    Again {
        why: String,
        after: Option<Duration>,
    },
    Fail(crate::Error),
}

/// Runs `attempt` until it is done, fails, or the deadline passes; the
/// deadline's outcome is `on_deadline(last why)`. Each attempt gets the time
/// left, to bound its own timeout.
pub(crate) async fn run<T, F, Fut>(
    policy: &RetryPolicy,
    timer: &dyn Timer,
    step: &'static str,
    mut attempt: F,
    on_deadline: impl FnOnce(String) -> crate::Error,
) -> Result<T, crate::Error>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    let deadline = timer.now() + policy.deadline;
    let mut backoff = Backoff::new(policy.clone());
    let mut last = String::from("no attempt finished");
    loop {
        let left = deadline.saturating_sub(timer.now());
        if left.is_zero() {
            return Err(on_deadline(last));
        }
        match attempt(left.min(policy.attempt_timeout)).await {
            Attempt::Done(v) => return Ok(v),
            Attempt::Fail(e) => return Err(e),
            Attempt::Again { why, after } => {
                metrics::counter!("reservoir_client_retries_total", "step" => step).increment(1);
                tracing::debug!(step, %why, "retrying with the same id");
                last = why;
                let wait = after.unwrap_or_default().max(backoff.next_delay());
                let left = deadline.saturating_sub(timer.now());
                if wait >= left {
                    timer.sleep(left).await;
                    return Err(on_deadline(last));
                }
                timer.sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_jitters_below_it() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            ..RetryPolicy::default()
        };
        let mut b = Backoff::seeded(policy, 7);
        // (attempt, ceiling in ms)
        let table = [
            (0, 10),
            (1, 20),
            (2, 40),
            (3, 80),
            (4, 100),
            (5, 100),
            (40, 100),
        ];
        let mut delays = Vec::new();
        for (n, ceiling_ms) in table {
            while b.attempt < n {
                b.next_delay();
            }
            assert_eq!(
                b.ceiling(),
                Duration::from_millis(ceiling_ms),
                "attempt {n}"
            );
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(ceiling_ms), "attempt {n}: {d:?}");
            delays.push(d);
        }
        // Jitter: two seeds give different sequences.
        let mut other = Backoff::seeded(
            RetryPolicy {
                initial_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(100),
                ..RetryPolicy::default()
            },
            8,
        );
        let second: Vec<_> = (0..8).map(|_| other.next_delay()).collect();
        let mut first = Backoff::seeded(
            RetryPolicy {
                initial_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(100),
                ..RetryPolicy::default()
            },
            7,
        );
        let again: Vec<_> = (0..8).map(|_| first.next_delay()).collect();
        assert_ne!(second, again);
    }

    #[tokio::test]
    async fn the_deadline_ends_a_step_that_never_succeeds() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            deadline: Duration::from_millis(200),
            ..RetryPolicy::default()
        };
        let mut attempts = 0u32;
        let out: Result<(), _> = run(
            &policy,
            &crate::transport::TokioTimer::default(),
            "test",
            |_| {
                attempts += 1;
                async {
                    Attempt::Again {
                        why: "down".into(),
                        after: None,
                    }
                }
            },
            crate::Error::Unavailable,
        )
        .await;
        assert!(matches!(out, Err(crate::Error::Unavailable(w)) if w == "down"));
        assert!(
            attempts > 1,
            "asked again before giving up: {attempts} attempts"
        );
    }

    #[tokio::test]
    async fn a_retry_after_is_waited_out_within_the_deadline() {
        let policy = RetryPolicy::default();
        let mut attempts = 0u32;
        let out = run(
            &policy,
            &crate::transport::TokioTimer::default(),
            "test",
            |_| {
                attempts += 1;
                let n = attempts;
                async move {
                    if n == 1 {
                        Attempt::Again {
                            why: "429".into(),
                            after: Some(Duration::from_millis(30)),
                        }
                    } else {
                        Attempt::Done(n)
                    }
                }
            },
            crate::Error::Unavailable,
        )
        .await
        .unwrap();
        assert_eq!(out, 2);
        // A Retry-After past the deadline ends the step instead of sleeping past it.
        let short = RetryPolicy {
            deadline: Duration::from_millis(50),
            ..RetryPolicy::default()
        };
        let out: Result<(), _> = run(
            &short,
            &crate::transport::TokioTimer::default(),
            "test",
            |_| async {
                Attempt::Again {
                    why: "429".into(),
                    after: Some(Duration::from_secs(3600)),
                }
            },
            crate::Error::Unavailable,
        )
        .await;
        assert!(matches!(out, Err(crate::Error::Unavailable(_))));
    }
}
