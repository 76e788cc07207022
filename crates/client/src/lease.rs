//! The handles a gateway holds while a call is in flight.
//!
//! [`Reservation`] is RESERVED capacity: start it ([`Reservation::start`]) when
//! the provider call begins, or drop it and it is released. [`Lease`] is a
//! STARTED call, the streaming guard: feed it the provider's usage as it
//! arrives ([`Lease::meter`]) and [`Lease::finish`] it; if it is dropped
//! instead — the client hung up, the stream failed, the task was cancelled —
//! it settles in the background against what the count reached: input plus
//! the output streamed so far, never a full refund for tokens that were spent.

use crate::client::Client;
use crate::error::Error;
use crate::fallback::LocalHold;
use crate::scheduler::Permit;
use crate::types::{
    OperationId, Receipt, ReservationId, ReservationState, ReserveRequest, RouteInfo, Settlement,
};
use crate::usage::UsageMeter;

/// What backs a reservation: a ledger receipt, or a local hold the fallback
/// granted while the ledger could not be reached.
pub(crate) enum Hold {
    Ledger(Receipt),
    Local {
        id: ReservationId,
        hold: Box<dyn LocalHold>,
    },
}

impl Hold {
    fn id(&self) -> &ReservationId {
        match self {
            Hold::Ledger(r) => &r.id,
            Hold::Local { id, .. } => id,
        }
    }
}

/// RESERVED capacity; released if dropped unstarted.
pub struct Reservation {
    client: Client,
    request: ReserveRequest,
    route: RouteInfo,
    hold: Option<Hold>,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("id", &self.id())
            .field("subject", &self.request.subject)
            .field("route", &self.request.route)
            .field("reserved_units", &self.reserved_units())
            .finish()
    }
}

impl Reservation {
    pub(crate) fn new(
        client: Client,
        request: ReserveRequest,
        route: RouteInfo,
        hold: Hold,
    ) -> Self {
        Reservation {
            client,
            request,
            route,
            hold: Some(hold),
        }
    }

    fn hold(&self) -> &Hold {
        self.hold.as_ref().expect("a live reservation has its hold")
    }

    pub fn id(&self) -> &ReservationId {
        self.hold().id()
    }

    pub fn subject(&self) -> &str {
        &self.request.subject
    }

    pub fn request(&self) -> &ReserveRequest {
        &self.request
    }

    /// The ledger's receipt (`None` for a local hold).
    pub fn receipt(&self) -> Option<&Receipt> {
        match self.hold() {
            Hold::Ledger(r) => Some(r),
            Hold::Local { .. } => None,
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self.hold(), Hold::Local { .. })
    }

    pub fn reserved_units(&self) -> u64 {
        match self.hold() {
            Hold::Ledger(r) => r.reserved_units,
            Hold::Local { hold, .. } => hold.units(),
        }
    }

    pub fn route(&self) -> &RouteInfo {
        &self.route
    }

    /// The route policy's priority, which the start scheduler orders by.
    pub fn priority(&self) -> u32 {
        self.route.priority
    }

    /// RESERVED → STARTED under a fresh operation id.
    pub async fn start(self) -> Result<Lease, Error> {
        self.start_as(OperationId::random(), None).await
    }

    /// The same under the caller's operation id, holding a scheduler slot if given.
    pub(crate) async fn start_as(
        mut self,
        operation_id: OperationId,
        permit: Option<Permit>,
    ) -> Result<Lease, Error> {
        let hold = self.hold.take().expect("a live reservation has its hold");
        let reserved_units = match &hold {
            Hold::Ledger(receipt) => {
                if let Err(e) = self.client.start(&receipt.id, &operation_id).await {
                    // The start may have happened (answer lost): clean up either way.
                    abandon(&self.client, receipt.id.clone(), Some(operation_id));
                    return Err(e);
                }
                receipt.reserved_units
            }
            Hold::Local { hold, .. } => hold.units(),
        };
        Ok(Lease {
            client: self.client.clone(),
            request: self.request.clone(),
            route: self.route.clone(),
            hold: Some(hold),
            operation_id,
            reserved_units,
            meter: UsageMeter::default(),
            _permit: permit,
        })
    }

    /// Gives the capacity back now (the receipt, for a ledger reservation).
    pub async fn release(mut self) -> Result<Option<Receipt>, Error> {
        match self.hold.take().expect("a live reservation has its hold") {
            Hold::Ledger(r) => self.client.release(&r.id).await.map(Some),
            Hold::Local { hold, .. } => {
                hold.release();
                Ok(None)
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        match self.hold.take() {
            Some(Hold::Ledger(r)) => abandon(&self.client, r.id, None),
            Some(Hold::Local { hold, .. }) => hold.release(),
            None => {}
        }
    }
}

/// Releases a reservation nobody will use. If a start whose answer was lost
/// did happen (release finds it STARTED, or USAGE_UNKNOWN under the start's
/// operation id), no provider call was made on it, so it settles as
/// [`Settlement::never_ran`] (the simulator's client gateway found that a
/// settle at 0 without usage is refused on a route limiting tokens too).
fn abandon(client: &Client, id: ReservationId, operation_id: Option<OperationId>) {
    let c = client.clone();
    client.inner.background.spawn("release", async move {
        match c.release(&id).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("wrong_state") => match c.get(&id).await? {
                Some(r)
                    if r.state == ReservationState::Started
                        || (r.state == ReservationState::UsageUnknown
                            && operation_id.is_some()) =>
                {
                    let zero = Settlement::never_ran(operation_id);
                    c.settle(&id, &zero).await.map(|_| ())
                }
                _ => Ok(()),
            },
            Err(e) => Err(e),
        }
    });
}

/// What a finished lease settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub actual_units: u64,
    /// The ledger's receipt (`None` for a local hold).
    pub receipt: Option<Receipt>,
}

/// A STARTED call: the streaming guard. Settles on [`Lease::finish`], or in
/// the background when dropped.
pub struct Lease {
    client: Client,
    request: ReserveRequest,
    route: RouteInfo,
    hold: Option<Hold>,
    operation_id: OperationId,
    reserved_units: u64,
    meter: UsageMeter,
    /// The scheduler slot: freed when the lease is settled or dropped.
    _permit: Option<Permit>,
}

impl Lease {
    pub fn id(&self) -> &ReservationId {
        self.hold.as_ref().expect("a live lease has its hold").id()
    }

    pub fn operation_id(&self) -> &OperationId {
        &self.operation_id
    }

    pub fn reserved_units(&self) -> u64 {
        self.reserved_units
    }

    /// The running count: feed it every stream event.
    pub fn meter(&mut self) -> &mut UsageMeter {
        &mut self.meter
    }

    pub fn usage_so_far(&self) -> &UsageMeter {
        &self.meter
    }

    /// What settling now would send (see [`UsageMeter::settlement`]).
    pub fn settlement(&self) -> Settlement {
        self.meter.settlement(
            &self.request,
            self.route.capacity_unit,
            self.operation_id.clone(),
        )
    }

    /// Settles now against the count (the stream completed).
    pub async fn finish(mut self) -> Result<Settled, Error> {
        let settlement = self.settlement();
        let hold = self.hold.take().expect("a live lease has its hold");
        settle_hold(&self.client, hold, settlement).await
    }

    /// Settles now with an amount of the caller's (e.g. a non-streamed
    /// response's final usage, already converted to the route's unit).
    pub async fn finish_with(mut self, settlement: Settlement) -> Result<Settled, Error> {
        let hold = self.hold.take().expect("a live lease has its hold");
        settle_hold(&self.client, hold, settlement).await
    }
}

async fn settle_hold(
    client: &Client,
    hold: Hold,
    settlement: Settlement,
) -> Result<Settled, Error> {
    let actual_units = settlement.actual_units;
    match hold {
        Hold::Ledger(r) => client
            .settle(&r.id, &settlement)
            .await
            .map(|receipt| Settled {
                actual_units,
                receipt: Some(receipt),
            }),
        Hold::Local { hold, .. } => {
            hold.settle(&settlement);
            Ok(Settled {
                actual_units,
                receipt: None,
            })
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else { return };
        // Cancelled, failed or abandoned mid-stream: what was counted was spent.
        let settlement = self.settlement();
        metrics::counter!("reservoir_client_dropped_leases_total").increment(1);
        tracing::debug!(id = %hold.id(), units = settlement.actual_units, "lease dropped: settling against the count");
        let client = self.client.clone();
        self.client.inner.background.spawn("settle", async move {
            settle_hold(&client, hold, settlement).await.map(|_| ())
        });
    }
}
