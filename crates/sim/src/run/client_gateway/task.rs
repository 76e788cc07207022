//! A call of the client gateway as its own task: what it reports, the plan
//! it follows, and the calls it makes through the client (see the parent
//! module).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use std::time::Duration;

use reservoir_client::transport::Timer;
use reservoir_client::{
    Client, Error as ClientError, Receipt, ReserveRequest, Settlement, StartScheduler,
};
use serde_json::Value;

use crate::run::{Arc, Usage};

/// What a call's task learnt, reported to the world in order.
pub(super) enum Report {
    /// A receipt the client returned (reserve, resolve, release, settle).
    Told(Receipt),
    /// Admitted by the client's fallback from the gateway's shard `shard`,
    /// holding `units` of it (the ledger could not be reached).
    Local {
        shard: String,
        units: u64,
    },
    /// RESERVED, it waits for its turn in the start scheduler.
    Queued,
    /// Its turn came.
    Admitted,
    /// Its caller stopped waiting before its turn came: it left the queue
    /// and the client gives the reservation back in the background.
    GaveUp,
    Started,
    /// The step's outcome is unknown to the gateway (a reserve without an
    /// answer, a settle that may have happened).
    Unknown(&'static str),
    /// The caller hung up mid-stream: the lease is dropped and settles what
    /// it counted in the background.
    Dropped,
    Resolved,
    Refused,
    /// It gives the reservation back (planned, or after resolving it late).
    Releasing,
    /// The start failed: the client releases it in the background (or
    /// settles it at 0, if the start did happen).
    StartFailed(String),
    /// What the settle sends (the lease's count, or the caller's amount).
    Settling(Settlement),
    Failed(&'static str, ClientError),
    Ended,
}

pub(super) type Reports = Arc<Mutex<Vec<(usize, Report)>>>;

/// How a call of the client gateway ends, drawn when it is made.
#[derive(Clone, Debug)]
pub(super) enum Plan {
    Release,
    /// Settle `embed` with this many units.
    Units(u64),
    /// A `chat` stream: the events the provider sends, how many arrive
    /// before a cut (`None`: all, and the lease finishes), and whether the
    /// provider refused the call with an error status before streaming.
    Stream {
        events: Vec<Value>,
        cut: Option<usize>,
        refused: bool,
    },
}

/// What a call's task works with.
pub(super) struct CallTask<'a> {
    pub(super) client: &'a Client,
    pub(super) scheduler: &'a StartScheduler,
    pub(super) timer: &'a dyn Timer,
    pub(super) book: &'a reservoir_client::ShardBook,
    pub(super) reports: &'a Reports,
    pub(super) closed: &'a AtomicBool,
    pub(super) c: usize,
}

impl CallTask<'_> {
    /// One call of the client gateway, as a gateway writes it with the client:
    /// reserve (resolving an UNKNOWN by asking again, and then giving the
    /// reservation back: its caller stopped waiting), wait for its turn in the
    /// start scheduler (at most `patience`, if the caller has a limit), start,
    /// stream, settle (a settle whose outcome is unknown repeated with the
    /// same amount), or drop the lease mid-stream.
    pub(super) async fn run(
        &self,
        id: reservoir_client::ReservationId,
        request: ReserveRequest,
        plan: Plan,
        patience: Option<Duration>,
    ) {
        let (client, reports, closed, c) = (self.client, self.reports, self.closed, self.c);
        let say = |report: Report| reports.lock().expect("reports").push((c, report));
        let reservation = match client.reserve_as(id.clone(), request.clone()).await {
            Ok(r) => r,
            Err(ClientError::ReservationUnknown { .. }) => {
                say(Report::Unknown("reserve"));
                let receipt = loop {
                    match client.resolve(&id, &request).await {
                        Ok(r) => break r,
                        Err(
                            ClientError::ReservationUnknown { .. } | ClientError::Unavailable(_),
                        ) if !closed.load(Ordering::SeqCst) => {}
                        Err(ClientError::Refused { .. }) => {
                            say(Report::Resolved);
                            say(Report::Refused);
                            return;
                        }
                        Err(e) => return say(Report::Failed("resolve", e)),
                    }
                };
                say(Report::Resolved);
                let reserved = receipt.state == reservoir_client::ReservationState::Reserved;
                say(Report::Told(receipt));
                if reserved {
                    say(Report::Releasing);
                    match client.release(&id).await {
                        Ok(r) => say(Report::Told(r)),
                        Err(e) => say(Report::Failed("release", e)),
                    }
                }
                return;
            }
            Err(ClientError::Refused { .. }) => return say(Report::Refused),
            Err(e) => return say(Report::Failed("reserve", e)),
        };
        match reservation.receipt() {
            Some(receipt) => say(Report::Told(receipt.clone())),
            None => {
                let shard = self
                    .book
                    .holder_of(id.as_str())
                    .expect("a local hold is in the book");
                let units = reservation.reserved_units();
                say(Report::Local { shard, units });
            }
        }
        let (events, cut, refused, units) = match plan {
            Plan::Release => {
                say(Report::Releasing);
                match reservation.release().await {
                    Ok(Some(r)) => say(Report::Told(r)),
                    Ok(None) => {}
                    Err(e) => say(Report::Failed("release", e)),
                }
                return;
            }
            Plan::Units(units) => (Vec::new(), None, false, Some(units)),
            Plan::Stream {
                events,
                cut,
                refused,
            } => (events, cut, refused, None),
        };
        say(Report::Queued);
        let turn = self.scheduler.admit(reservation);
        let admitted = match patience {
            None => turn.await,
            // `biased`: a turn that came as the patience ran out is taken.
            Some(patience) => tokio::select! {
                biased;
                admitted = turn => admitted,
                () = self.timer.sleep(patience) => return say(Report::GaveUp),
            },
        };
        let admitted = match admitted {
            Ok(admitted) => admitted,
            Err(e) => return say(Report::Failed("admit", e)),
        };
        say(Report::Admitted);
        let mut lease = match admitted.start().await {
            Ok(lease) => lease,
            Err(e) => {
                return say(Report::StartFailed(
                    e.code().unwrap_or("unavailable").into(),
                ))
            }
        };
        say(Report::Started);
        for event in &events[..cut.unwrap_or(events.len())] {
            lease.meter().observe_anthropic(event);
        }
        if refused {
            lease.meter().provider_refused();
        }
        let settlement = match units {
            Some(units) => Settlement {
                actual_units: units,
                operation_id: Some(lease.operation_id().clone()),
                usage: None,
            },
            None => lease.settlement(),
        };
        say(Report::Settling(settlement.clone()));
        if cut.is_some() {
            // The caller hung up: the lease settles what it counted, in the background.
            say(Report::Dropped);
            drop(lease);
            return;
        }
        let mut outcome = lease
            .finish_with(settlement.clone())
            .await
            .map(|s| s.receipt);
        let mut unknown = false;
        loop {
            match outcome {
                Ok(receipt) => {
                    if unknown {
                        say(Report::Resolved);
                    }
                    if let Some(r) = receipt {
                        say(Report::Told(r));
                    }
                    return;
                }
                Err(ClientError::Unavailable(_)) if !closed.load(Ordering::SeqCst) => {
                    if !unknown {
                        unknown = true;
                        say(Report::Unknown("settle"));
                    }
                    outcome = client.settle(&id, &settlement).await.map(Some);
                }
                Err(e) => return say(Report::Failed("settle", e)),
            }
        }
    }
}

/// What a settle sends, as the server's own settle body reads it.
pub(super) fn settle_sent(settlement: &Settlement) -> (Option<u64>, Option<Usage>) {
    let body: reservoir_server::bodies::SettleBody =
        serde_json::from_value(serde_json::to_value(settlement).expect("a settlement serializes"))
            .expect("the server reads the client's settle body");
    (body.actual_units, body.usage.map(Usage::from))
}

/// A plan in the trace: what it will do, not its events.
pub(super) struct PlanName<'a>(pub(super) &'a Plan);

impl std::fmt::Debug for PlanName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Plan::Release => write!(f, "release"),
            Plan::Units(units) => write!(f, "settle {units}"),
            Plan::Stream { cut: None, .. } => write!(f, "stream to its end"),
            Plan::Stream {
                cut: Some(n),
                refused,
                ..
            } => write!(f, "stream cut after {n} events (refused: {refused})"),
        }
    }
}
