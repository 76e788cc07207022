//! Emergency shards on the gateway: [`ShardBook`] holds the signed
//! `emergencyShard.v1` documents the ledger issued to this process, admits
//! from them (as the client's [`Fallback`]) only while the ledger is
//! unreachable, keeps each shard's own books, and reconciles them once the
//! ledger is back.
//!
//! Per shard, after every local operation (a broken equation panics, as the
//! ledger's own do):
//! `allocated = localAvailable + localReserved + localSpent + localRetired`.
//! Reserve moves available → reserved; settle moves what the call used to
//! spent as the ledger's own settle does: from its hold, then, for use above
//! the hold, from available; what is still missing is owed (`overspent`,
//! outside the equation), and the unused part of the hold goes back to
//! available. Release moves the hold back; a call whose usage is unknown
//! moves its hold to retired (never unused). An expired shard's available
//! moves to retired. A call's use is taken as at most [`MAX_UNITS`], the
//! most the ledger accepts, and each receipt reports it in full up to that:
//! the ledger sums the receipts itself, and records what is beyond the
//! shard as debt.
//!
//! What admits nothing: a shard whose signature does not verify against the
//! ledger's public key, one bound to another gateway id, one from another
//! boot epoch (a restarted process cannot inherit its predecessor's shards),
//! an expired one, one being reconciled, and one that owes (as the ledger
//! admits nothing while a partition is in debt). Nor is a reservation id
//! admitted twice (a second receipt under one id fails the reconcile).
//! Without a usable shard the client refuses (fails closed,
//! naming the reason: [`NotAdmitted`]). The client consults its fallback
//! only when no reserve attempt reached the ledger before the retry deadline
//! (the timeout), and only for a route whose settings it read before;
//! [`ShardBook::with_min_failures`] adds a number of such consecutive
//! failures before the first local admission (a reserve the ledger answered,
//! through [`Fallback::ledger_answered`], starts the count over).
//!
//! Issue ([`ShardBook::issue`]) names the shard it asks for, so a lost
//! answer is asked again under the same id and the ledger answers the shard
//! it issued, never a second one. Reconcile ([`ShardBook::reconcile`])
//! closes the shard for admission, then sends its terminal receipts; a lost
//! answer is retried with the same body and the ledger answers the recorded
//! outcome (reminting once).
//!
//! The book's lock: a panic while it is held (only a broken invariant
//! panics, and no input can cause one) would poison it; the next call checks
//! every shard's books again and goes on with them, rather than every later
//! call panicking too.
//!
//! Files: this one holds the documents and the local books; `ledger` the
//! HTTP of issue and reconcile; `tests` the unit tests.
//!
//! The canonical bytes signed over are the server's
//! (`reservoir_server::shards::ShardDocument::canonical`); the client's
//! tests verify shards the real server signed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::fallback::{Fallback, LocalHold, NotAdmitted};
use crate::retry::RetryPolicy;
use crate::types::{ReservationId, ReserveRequest, RouteInfo, Settlement, Sizing};

mod ledger;

/// The most a local call's use counts (the ledger's own bound on an amount,
/// `reservoir_core::policy::MAX_UNITS`: exact in every JSON number, and far
/// from overflowing a sum of a few). A provider that reports more is taken
/// at this.
pub const MAX_UNITS: u64 = 1 << 53;

/// The ledger partition a shard came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPartitionKey {
    pub subject: String,
    pub route: String,
    pub accounting_epoch: String,
    pub policy_generation: u64,
}

/// `emergencyShard.v1`, as the ledger issues it (sent back unchanged on reconcile).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardDocument {
    pub schema: String,
    pub shard_id: String,
    pub partition_key: ShardPartitionKey,
    pub units: u64,
    pub gateway_id: String,
    pub gateway_boot_epoch: u64,
    pub fence_epoch: u64,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
    pub signature: String,
}

impl ShardDocument {
    /// The bytes the ledger signed (one `name=value` line per field).
    pub fn canonical(&self) -> String {
        let k = &self.partition_key;
        format!(
            "reservoir.emergencyShard.v1\nshard_id={}\nsubject={}\nroute={}\naccounting_epoch={}\npolicy_generation={}\nunits={}\ngateway_id={}\nboot_epoch={}\nfence_epoch={}\nissued_at_ms={}\nexpires_at_ms={}",
            self.shard_id,
            k.subject,
            k.route,
            k.accounting_epoch,
            k.policy_generation,
            self.units,
            self.gateway_id,
            self.gateway_boot_epoch,
            self.fence_epoch,
            self.issued_at_ms,
            self.expires_at_ms,
        )
    }

    /// Whether `key`'s signature covers this document.
    pub fn verify(&self, key: &VerifyingKey) -> bool {
        let Some(hex_sig) = self.signature.strip_prefix("ed25519:") else {
            return false;
        };
        let Some(bytes) = hex::decode(hex_sig)
            .ok()
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
        else {
            return false;
        };
        key.verify(self.canonical().as_bytes(), &Signature::from_bytes(&bytes))
            .is_ok()
    }
}

/// Why a shard is not taken into the book.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardRefused {
    #[error("the shard's signature does not verify against the ledger's key")]
    BadSignature,
    #[error("the shard is bound to gateway {0}")]
    OtherGateway(String),
    #[error("the shard is bound to boot epoch {0}, this process is another")]
    OtherBootEpoch(u64),
    #[error("the shard expired")]
    Expired,
    #[error("shard {0} is already in the book")]
    Duplicate(String),
    #[error("not a public key: {0}")]
    BadKey(String),
}

/// One shard's local books.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardBooks {
    pub allocated_units: u64,
    pub local_available_units: u64,
    pub local_reserved_units: u64,
    pub local_spent_units: u64,
    pub local_retired_units: u64,
    /// Use beyond a call's hold that the shard's available units did not
    /// cover: owed (not in the equation; the ledger records it as debt at
    /// reconcile). Above 0, the shard admits nothing.
    pub overspent_units: u64,
}

impl ShardBooks {
    fn check(&self) {
        let right = u128::from(self.local_available_units)
            + u128::from(self.local_reserved_units)
            + u128::from(self.local_spent_units)
            + u128::from(self.local_retired_units);
        assert_eq!(
            u128::from(self.allocated_units),
            right,
            "shard conservation broken: {self:?}"
        );
    }
}

/// A terminal local receipt, as reconcile sends it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalReceipt {
    pub reservation_id: String,
    /// `SETTLED`, `RELEASED`, `EXPIRED` or `USAGE_UNKNOWN`.
    pub state: String,
    pub used_units: u64,
}

/// What the ledger recorded for a reconciled shard.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ReconcileOutcome {
    pub shard_id: String,
    pub outcome: String,
    pub issued_units: u64,
    pub spent_units: u64,
    pub unknown_units: u64,
    pub reminted_units: u64,
    pub retired_units: u64,
    pub excess_units: u64,
    /// False when the ledger had recorded this reconcile before (a retry).
    pub created: bool,
}

/// Where a reconcile stands ([`ShardBook::begin_reconcile`]).
#[derive(Debug)]
pub enum Reconcile {
    /// Recorded before: the ledger's answer.
    Done(ReconcileOutcome),
    /// The body to send (the same on every call until an answer is noted).
    Send(serde_json::Value),
}

#[derive(Debug)]
enum Phase {
    Active,
    /// Reconcile began: admits nothing; the receipts are fixed.
    Reconciling,
    Reconciled(ReconcileOutcome),
}

#[derive(Debug)]
struct Entry {
    document: ShardDocument,
    books: ShardBooks,
    /// Open local reservations: id → held units.
    open: BTreeMap<String, u64>,
    receipts: Vec<LocalReceipt>,
    phase: Phase,
}

impl Entry {
    /// The equation, and the open holds are the reserved units.
    fn check(&self) {
        self.books.check();
        let open: u128 = self.open.values().map(|&units| u128::from(units)).sum();
        assert_eq!(
            open,
            u128::from(self.books.local_reserved_units),
            "shard {}: open holds are not its reserved units: {:?}",
            self.document.shard_id,
            self.books
        );
    }
}

#[derive(Debug, Default)]
struct State {
    shards: BTreeMap<String, Entry>,
    /// Every reservation id admitted locally (open or finished) → its shard.
    admitted: BTreeMap<String, String>,
    /// Fallback calls since the ledger was last known reachable.
    failures: u32,
}

/// The book's state (see the module docs on a poisoned lock): a shard
/// whose books are broken panics here again, as every broken equation does.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| {
        let guard = poisoned.into_inner();
        for entry in guard.shards.values() {
            entry.check();
        }
        state.clear_poison();
        guard
    })
}

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("no shard {0} in the book")]
    UnknownShard(String),
    #[error("{0} local reservations are still open; settle or release them first")]
    OpenReservations(usize),
    #[error(
        "the ledger could not be reached or answered 503: {0} (retry: the same receipts are sent)"
    )]
    Unavailable(String),
    #[error("the ledger refused the reconcile: {status} {body}")]
    Refused { status: u16, body: String },
}

/// The gateway's emergency shards (see the module docs).
pub struct ShardBook {
    gateway_id: String,
    boot_epoch: u64,
    key: VerifyingKey,
    min_failures: u32,
    now_ms: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// How long and how often [`ShardBook::issue`] asks again.
    retry: RetryPolicy,
    state: Arc<Mutex<State>>,
}

fn system_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl ShardBook {
    /// A book for this process (`gateway_id`, `boot_epoch`), trusting shards
    /// signed by `public_key_hex` (`GET /v1/shards/public-key`).
    pub fn new(
        gateway_id: &str,
        boot_epoch: u64,
        public_key_hex: &str,
    ) -> Result<Self, ShardRefused> {
        let bytes: [u8; 32] = hex::decode(public_key_hex)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| ShardRefused::BadKey(public_key_hex.to_string()))?;
        let key =
            VerifyingKey::from_bytes(&bytes).map_err(|e| ShardRefused::BadKey(e.to_string()))?;
        Ok(ShardBook {
            gateway_id: gateway_id.to_string(),
            boot_epoch,
            key,
            min_failures: 1,
            now_ms: Arc::new(system_now_ms),
            retry: RetryPolicy::default(),
            state: Arc::default(),
        })
    }

    /// Admit locally only from the `n`th consecutive unreachable reserve on.
    pub fn with_min_failures(mut self, n: u32) -> Self {
        self.min_failures = n.max(1);
        self
    }

    /// The clock expiry is judged by (default: the system clock).
    pub fn with_clock(mut self, now_ms: Arc<dyn Fn() -> u64 + Send + Sync>) -> Self {
        self.now_ms = now_ms;
        self
    }

    /// How [`ShardBook::issue`] retries a lost answer (default: the client's
    /// default, [`RetryPolicy::default`]).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The ledger answered: the count of consecutive failures starts again.
    /// Called after every reserve the ledger decided, so it never panics,
    /// even on a book whose lock is poisoned: it touches no shard's books.
    pub fn note_ledger_reachable(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.failures = 0;
    }

    /// Takes a shard into the book after checking its signature and binding.
    pub fn install(&self, document: ShardDocument) -> Result<(), ShardRefused> {
        if !document.verify(&self.key) {
            return Err(ShardRefused::BadSignature);
        }
        if document.gateway_id != self.gateway_id {
            return Err(ShardRefused::OtherGateway(document.gateway_id));
        }
        if document.gateway_boot_epoch != self.boot_epoch {
            return Err(ShardRefused::OtherBootEpoch(document.gateway_boot_epoch));
        }
        if (self.now_ms)() >= document.expires_at_ms {
            return Err(ShardRefused::Expired);
        }
        let mut state = lock(&self.state);
        if state.shards.contains_key(&document.shard_id) {
            return Err(ShardRefused::Duplicate(document.shard_id));
        }
        let books = ShardBooks {
            allocated_units: document.units,
            local_available_units: document.units,
            ..Default::default()
        };
        books.check();
        state.shards.insert(
            document.shard_id.clone(),
            Entry {
                document,
                books,
                open: BTreeMap::new(),
                receipts: Vec::new(),
                phase: Phase::Active,
            },
        );
        Ok(())
    }

    /// One shard's books (`None`: not in the book).
    pub fn books(&self, shard_id: &str) -> Option<ShardBooks> {
        let state = lock(&self.state);
        state.shards.get(shard_id).map(|e| e.books)
    }

    /// The shard that holds the open local call `reservation_id`, if any.
    pub fn holder_of(&self, reservation_id: &str) -> Option<String> {
        let state = lock(&self.state);
        state
            .shards
            .iter()
            .find(|(_, e)| e.open.contains_key(reservation_id))
            .map(|(id, _)| id.clone())
    }

    /// The terminal receipts a reconcile of `shard_id` would send.
    pub fn receipts(&self, shard_id: &str) -> Vec<LocalReceipt> {
        let state = lock(&self.state);
        state
            .shards
            .get(shard_id)
            .map(|e| e.receipts.clone())
            .unwrap_or_default()
    }

    /// A local call whose usage cannot be known: its hold stays retired.
    pub fn mark_usage_unknown(&self, reservation_id: &str) -> bool {
        let mut state = lock(&self.state);
        for entry in state.shards.values_mut() {
            if let Some(held) = entry.open.remove(reservation_id) {
                entry.books.local_reserved_units -= held;
                entry.books.local_retired_units += held;
                entry.receipts.push(LocalReceipt {
                    reservation_id: reservation_id.to_string(),
                    state: "USAGE_UNKNOWN".into(),
                    used_units: held,
                });
                entry.check();
                return true;
            }
        }
        false
    }

    /// Retires the available units of every expired shard.
    fn retire_expired(state: &mut State, now_ms: u64) {
        for entry in state.shards.values_mut() {
            if now_ms >= entry.document.expires_at_ms && entry.books.local_available_units > 0 {
                entry.books.local_retired_units += entry.books.local_available_units;
                entry.books.local_available_units = 0;
                entry.check();
            }
        }
    }

    /// The first half of [`ShardBook::reconcile`], for a transport of one's
    /// own (the simulator sends it to the writers without HTTP): closes the
    /// shard for admission (its expired units retired first) and gives the
    /// body of `POST /v1/shards/{id}/reconcile`, the same on every call
    /// until [`ShardBook::note_reconciled`]; after it, the recorded outcome.
    pub fn begin_reconcile(&self, shard_id: &str) -> Result<Reconcile, ReconcileError> {
        let now = (self.now_ms)();
        let mut state = lock(&self.state);
        Self::retire_expired(&mut state, now);
        let entry = state
            .shards
            .get_mut(shard_id)
            .ok_or_else(|| ReconcileError::UnknownShard(shard_id.to_string()))?;
        if let Phase::Reconciled(outcome) = &entry.phase {
            return Ok(Reconcile::Done(outcome.clone()));
        }
        if !entry.open.is_empty() {
            return Err(ReconcileError::OpenReservations(entry.open.len()));
        }
        entry.phase = Phase::Reconciling;
        Ok(Reconcile::Send(serde_json::json!({
            "shard": entry.document,
            "gateway_id": self.gateway_id,
            "gateway_boot_epoch": self.boot_epoch,
            "receipts": entry.receipts,
        })))
    }

    /// The second half: the ledger's answer to the body
    /// [`ShardBook::begin_reconcile`] gave, kept for later calls.
    pub fn note_reconciled(&self, shard_id: &str, outcome: ReconcileOutcome) {
        let mut state = lock(&self.state);
        state.failures = 0;
        if let Some(entry) = state.shards.get_mut(shard_id) {
            entry.phase = Phase::Reconciled(outcome);
        }
    }

    /// Units a request holds locally, in the route's capacity unit (the
    /// unit a settle reports in): its own units; one, on a route that limits
    /// requests; else counted input plus the output limit (the request's,
    /// else the route's default). A token-sized request with no bound on its
    /// output is not admitted offline, nor one whose route was never read:
    /// a shard's document does not name its unit, and sizing a call of a
    /// route that counts requests in tokens would take a thousand requests
    /// for one call (and settle it in tokens). Units without a route are
    /// taken as given, in the shard's unit (a caller that sizes its calls
    /// itself, as the simulator does; the client always passes the route).
    fn units_of(request: &ReserveRequest, route: Option<&RouteInfo>) -> Result<u64, NotAdmitted> {
        let units = match (request.sizing, route) {
            (Sizing::Units(units), _) => Some(units),
            (Sizing::Tokens { .. }, None) => return Err(NotAdmitted::RouteUnknown),
            (Sizing::Tokens { .. }, Some(r))
                if r.capacity_unit == crate::CapacityUnit::Requests =>
            {
                Some(1)
            }
            (
                Sizing::Tokens {
                    counted_input_tokens,
                    max_tokens,
                },
                Some(r),
            ) => max_tokens
                .or(r.default_max_tokens)
                .and_then(|output| counted_input_tokens.checked_add(output)),
        };
        units.filter(|&u| u > 0).ok_or(NotAdmitted::Unsized)
    }

    /// A local hold for `request` under `id` (the id the ledger would have
    /// had), or why none ([`Fallback::reserve`] and [`Fallback::admit`]
    /// answer this). `route`: the route's settings, if read.
    pub fn admit_local(
        &self,
        id: &ReservationId,
        request: &ReserveRequest,
        route: Option<&RouteInfo>,
    ) -> Result<Box<dyn LocalHold>, NotAdmitted> {
        let units = Self::units_of(request, route)?;
        let now = (self.now_ms)();
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        state.failures = state.failures.saturating_add(1);
        if state.failures < self.min_failures {
            return Err(NotAdmitted::TooFewFailures {
                failures: state.failures,
                min_failures: self.min_failures,
            });
        }
        Self::retire_expired(state, now);
        if let Some(shard_id) = state.admitted.get(id.as_str()) {
            return Err(NotAdmitted::ReservationIdReused {
                reservation_id: id.as_str().to_string(),
                shard_id: shard_id.clone(),
            });
        }
        let serves = |e: &Entry| {
            let k = &e.document.partition_key;
            matches!(e.phase, Phase::Active)
                && k.subject == request.subject
                && k.route == request.route
                && e.document.gateway_id == self.gateway_id
                && e.document.gateway_boot_epoch == self.boot_epoch
                && now < e.document.expires_at_ms
        };
        let found = state.shards.iter_mut().find(|(_, e)| {
            serves(e) && e.books.overspent_units == 0 && e.books.local_available_units >= units
        });
        let Some((shard_id, entry)) = found else {
            let owing = state
                .shards
                .iter()
                .find(|(_, e)| serves(e) && e.books.overspent_units > 0);
            return Err(match owing {
                Some((shard_id, e)) => NotAdmitted::ShardOwes {
                    shard_id: shard_id.clone(),
                    overspent_units: e.books.overspent_units,
                },
                None => NotAdmitted::NoShard {
                    subject: request.subject.clone(),
                    route: request.route.clone(),
                    units,
                },
            });
        };
        entry.books.local_available_units -= units;
        entry.books.local_reserved_units += units;
        entry.open.insert(id.as_str().to_string(), units);
        entry.check();
        state
            .admitted
            .insert(id.as_str().to_string(), shard_id.clone());
        Ok(Box::new(ShardHold {
            state: self.state.clone(),
            shard_id: shard_id.clone(),
            reservation_id: id.as_str().to_string(),
            units,
        }))
    }
}

impl Fallback for ShardBook {
    fn ledger_answered(&self) {
        self.note_ledger_reachable();
    }

    fn reserve(
        &self,
        id: &ReservationId,
        request: &ReserveRequest,
        route: Option<&RouteInfo>,
    ) -> Option<Box<dyn LocalHold>> {
        self.admit_local(id, request, route).ok()
    }

    fn admit(
        &self,
        id: &ReservationId,
        request: &ReserveRequest,
        route: &RouteInfo,
    ) -> Result<Box<dyn LocalHold>, NotAdmitted> {
        self.admit_local(id, request, Some(route))
    }
}

/// A local reservation on a shard.
struct ShardHold {
    state: Arc<Mutex<State>>,
    shard_id: String,
    reservation_id: String,
    units: u64,
}

impl ShardHold {
    /// Moves the hold out of `open`, if still there (settled or released
    /// once), with `used_units` (at most [`MAX_UNITS`]) spent as the
    /// ledger's settle spends it (`settle_split` in `reservoir_core`): from
    /// the hold, then from available; the rest is owed.
    fn finish(&self, state_name: &str, used_units: u64) {
        let used_units = used_units.min(MAX_UNITS);
        let mut state = lock(&self.state);
        let Some(entry) = state.shards.get_mut(&self.shard_id) else {
            return;
        };
        let Some(held) = entry.open.remove(&self.reservation_id) else {
            return;
        };
        let books = &mut entry.books;
        let from_hold = used_units.min(held);
        let beyond_hold = used_units - from_hold;
        let from_available = beyond_hold.min(books.local_available_units);
        books.local_reserved_units -= held;
        books.local_available_units -= from_available;
        // Unused: back to available (retired at the next sweep if the shard expired).
        books.local_available_units += held - from_hold;
        books.local_spent_units += from_hold + from_available;
        books.overspent_units = books
            .overspent_units
            .saturating_add(beyond_hold - from_available);
        entry.receipts.push(LocalReceipt {
            reservation_id: self.reservation_id.clone(),
            state: state_name.to_string(),
            used_units,
        });
        entry.check();
    }
}

impl LocalHold for ShardHold {
    fn units(&self) -> u64 {
        self.units
    }

    fn settle(&self, settlement: &Settlement) {
        self.finish("SETTLED", settlement.actual_units);
    }

    fn release(&self) {
        self.finish("RELEASED", 0);
    }
}

#[cfg(test)]
mod tests;
