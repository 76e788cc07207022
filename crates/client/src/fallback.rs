//! The hook for admitting while the ledger cannot be reached: where emergency
//! shards plug in ([`crate::shards::ShardBook`]). Without one the client
//! fails closed ([`crate::Error::Unavailable`]).
//!
//! The client consults a [`Fallback`] only when no reserve attempt can have
//! reached the ledger (every attempt failed to connect, or the route could not
//! be read, before the deadline), and only for a route whose settings it read
//! before: a local hold settles in the route's capacity unit, which nothing
//! else tells. A reserve whose answer was lost is RESERVATION_UNKNOWN and is
//! never handed to the fallback: the ledger may hold it, and admitting it
//! locally too would count it twice.
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

    /// [`Fallback::reserve`] with the reason when it admits nothing; the
    /// client asks this one (always with the route's settings) and names
    /// the reason in its [`crate::Error::Unavailable`]. By default the
    /// answer of `reserve`, declined without a reason.
    fn admit(
        &self,
        id: &ReservationId,
        request: &ReserveRequest,
        route: &RouteInfo,
    ) -> Result<Box<dyn LocalHold>, NotAdmitted> {
        self.reserve(id, request, Some(route))
            .ok_or(NotAdmitted::Declined)
    }

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

/// Why a fallback admitted nothing (the client fails closed, naming it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotAdmitted {
    /// The route's settings were never read: its capacity unit (what a
    /// local hold is sized and settled in) and its dimensions are unknown.
    #[error("the route's settings were never read, so its capacity unit is unknown")]
    RouteUnknown,
    /// The request cannot be sized in the route's unit offline (a call
    /// sized by tokens with no bound on its output), or asks for 0 units.
    #[error("the request cannot be sized in the route's capacity unit offline")]
    Unsized,
    /// Fewer consecutive unreachable reserves than the fallback waits for.
    #[error(
        "{failures} consecutive unreachable reserves; local admission from the {min_failures}th"
    )]
    TooFewFailures { failures: u32, min_failures: u32 },
    /// The id was admitted locally before (settled, released or open): a
    /// second local reservation under it would be a second receipt of one
    /// id, which the ledger refuses at reconcile.
    #[error("reservation id {reservation_id} was admitted locally before (shard {shard_id}); a reused id is not admitted again")]
    ReservationIdReused {
        reservation_id: String,
        shard_id: String,
    },
    /// The shard used more than it held beyond its available units: it
    /// owes them (debt at reconcile) and admits nothing, as the ledger
    /// admits nothing while a partition is in debt.
    #[error("shard {shard_id} owes {overspent_units} units used beyond it; it admits nothing until reconciled")]
    ShardOwes {
        shard_id: String,
        overspent_units: u64,
    },
    /// No active, unexpired shard of the subject/route has the units free.
    #[error("no usable shard of {subject}/{route} has {units} units free")]
    NoShard {
        subject: String,
        route: String,
        units: u64,
    },
    /// A fallback that gave no reason ([`Fallback::reserve`] said no).
    #[error("the fallback declined")]
    Declined,
}
