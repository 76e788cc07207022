//! The hook for admitting while the ledger cannot be reached: where emergency
//! shards plug in ([`crate::shards::ShardBook`]). Without one the client
//! fails closed ([`crate::Error::Unavailable`]).
//!
//! The client consults a [`Fallback`] only when no reserve attempt can have
//! reached the ledger (every attempt failed to connect, or the route could not
//! be read, before the deadline). A reserve whose answer was lost is
//! RESERVATION_UNKNOWN and is never handed to the fallback: the ledger may
//! hold it, and admitting it locally too would count it twice.
//!
//! A shard implementation keeps its own conservation
//! (`allocated = localAvailable + localReserved + localSpent + localRetired`):
//! [`Fallback::reserve`] moves units from local available to local reserved,
//! [`LocalHold::settle`] to local spent (returning the rest), and
//! [`LocalHold::release`] back. Reconciling with the ledger after it heals is
//! the shard's own business, by reservation id.

use crate::types::{ReservationId, ReserveRequest, RouteInfo, Settlement};

/// Decides whether to admit locally while the ledger is unreachable.
pub trait Fallback: Send + Sync + 'static {
    /// A local hold for `request` under `id` (the id the ledger would have
    /// had), or `None` to refuse. `route` is the last route settings read, if any.
    fn reserve(
        &self,
        id: &ReservationId,
        request: &ReserveRequest,
        route: Option<&RouteInfo>,
    ) -> Option<Box<dyn LocalHold>>;

    /// The ledger decided a reserve, or a resolve of one (admitted, refused
    /// or rejected it): it is reachable again, so a count of consecutive
    /// unreachable reserves starts over. Not called for RESERVATION_UNKNOWN
    /// or a 503, which decide nothing.
    fn ledger_answered(&self) {}
}

/// Capacity a [`Fallback`] granted; settled or released exactly once by the
/// client's handles (a dropped, unstarted reservation releases it).
pub trait LocalHold: Send + Sync + 'static {
    fn units(&self) -> u64;
    fn settle(&self, settlement: &Settlement);
    fn release(&self);
}
