//! The fair start scheduler: when the gateway can run only so many provider
//! calls at once, it picks which already-RESERVED request starts next.
//!
//! Between tenants it is stride scheduling: each tenant has a virtual *pass*
//! that grows by `STRIDE / weight` per start, and the backlogged tenant with
//! the lowest pass goes next, so under saturation tenant shares converge to
//! their weights (a tenant that was idle re-enters at the current virtual
//! time, without banked credit). Within a tenant, the highest policy priority
//! goes first, then arrival order. It orders only [`Reservation`]s — capacity
//! the ledger has already reserved — so it can delay a call but never admit
//! one the ledger did not.
//!
//! [`FairQueue`] is the pure ordering; [`StartScheduler`] is the async gate
//! around it, with the concurrency limit and the per-tenant share metrics.

use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::Error;
use crate::lease::{Lease, Reservation};
use crate::types::OperationId;

/// Pass increment of a weight-1 tenant per start.
const STRIDE: u128 = 1 << 40;

/// A tenant's pass increment per start.
fn stride(weight: u32) -> u128 {
    STRIDE / u128::from(weight.max(1))
}

struct Entry<T> {
    priority: u32,
    seq: u64,
    item: T,
}

impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Higher priority first, then earlier arrival (BinaryHeap pops the max).
        self.priority
            .cmp(&other.priority)
            .then(other.seq.cmp(&self.seq))
    }
}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl<T> Eq for Entry<T> {}

struct Tenant<T> {
    weight: u32,
    pass: u128,
    starts: u64,
    /// Times its queue went from empty to waiting.
    backlogs: u64,
    waiting: BinaryHeap<Entry<T>>,
}

/// Weighted-fair order over tenants, priority order within one.
pub struct FairQueue<T> {
    tenants: BTreeMap<String, Tenant<T>>,
    weights: BTreeMap<String, u32>,
    default_weight: u32,
    virtual_time: u128,
    seq: u64,
    len: usize,
}

/// A place in a [`FairQueue`], to take its item out before its turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    tenant: String,
    seq: u64,
}

/// One tenant's starts against its weighted share.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantShare {
    pub tenant: String,
    pub weight: u32,
    pub starts: u64,
    /// starts ÷ all starts.
    pub share: f64,
    /// weight ÷ the weights of every tenant seen.
    pub fair_share: f64,
    /// Its requests waiting now.
    pub waiting: usize,
    /// Times its queue went from empty to waiting: two readings with the
    /// same count, each with requests waiting, mean it waited throughout
    /// (the stretch [`FairnessGap`] is about).
    pub backlogs: u64,
}

/// Two tenants' starts over a stretch in which both had requests waiting
/// throughout, against the scheduler's fairness budget: their starts per
/// weight differ by at most two starts of the lighter one,
/// `|Si/wi - Sj/wj| <= 2/min(wi, wj)`. In pass units, exactly as the
/// scheduler counts: `gap = |Si*stride_i - Sj*stride_j|`, `budget =
/// 2*max(stride_i, stride_j)`. Stride scheduling keeps every waiting
/// tenant's pass within one stride of the last start's, so the gap of any
/// such stretch stays within the budget, however tenants come, go, cancel
/// and re-enter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairnessGap {
    pub gap: u128,
    pub budget: u128,
}

impl FairnessGap {
    /// `(weight, starts in the stretch)` of each tenant.
    pub fn between((wi, si): (u32, u64), (wj, sj): (u32, u64)) -> Self {
        let (stride_i, stride_j) = (stride(wi), stride(wj));
        FairnessGap {
            gap: (u128::from(si) * stride_i).abs_diff(u128::from(sj) * stride_j),
            budget: 2 * stride_i.max(stride_j),
        }
    }

    pub fn within(&self) -> bool {
        self.gap <= self.budget
    }

    /// The gap as a fraction of the budget (above 1: over it).
    pub fn used(&self) -> f64 {
        self.gap as f64 / self.budget as f64
    }
}

impl<T> FairQueue<T> {
    /// `weights` per tenant; any other tenant weighs `default_weight` (at least 1).
    pub fn new(weights: BTreeMap<String, u32>, default_weight: u32) -> Self {
        FairQueue {
            tenants: BTreeMap::new(),
            weights,
            default_weight: default_weight.max(1),
            virtual_time: 0,
            seq: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `item` for `tenant`; the ticket takes it out again
    /// ([`FairQueue::remove`]) if it leaves before its turn.
    pub fn push(&mut self, tenant: &str, priority: u32, item: T) -> Ticket {
        let weight = self
            .weights
            .get(tenant)
            .copied()
            .unwrap_or(self.default_weight)
            .max(1);
        let t = self.tenants.entry(tenant.to_string()).or_insert(Tenant {
            weight,
            pass: 0,
            starts: 0,
            backlogs: 0,
            waiting: BinaryHeap::new(),
        });
        if t.waiting.is_empty() {
            // Re-entering after idling: no credit for the time away.
            t.pass = t.pass.max(self.virtual_time);
            t.backlogs += 1;
        }
        self.seq += 1;
        t.waiting.push(Entry {
            priority,
            seq: self.seq,
            item,
        });
        self.len += 1;
        Ticket {
            tenant: tenant.to_string(),
            seq: self.seq,
        }
    }

    /// Takes a waiting item out before its turn (a cancelled waiter), or
    /// `None` if it was popped already. Its tenant is not charged a start: its
    /// pass moves only when one of its items is popped.
    pub fn remove(&mut self, ticket: &Ticket) -> Option<T> {
        let t = self.tenants.get_mut(&ticket.tenant)?;
        let mut waiting = std::mem::take(&mut t.waiting).into_vec();
        let found = waiting.iter().position(|e| e.seq == ticket.seq);
        let removed = found.map(|i| waiting.swap_remove(i).item);
        t.waiting = BinaryHeap::from(waiting);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// The next to start: the backlogged tenant with the lowest pass (ties by
    /// name), and its highest-priority, earliest request.
    pub fn pop(&mut self) -> Option<(String, u32, T)> {
        let (name, t) = self
            .tenants
            .iter_mut()
            .filter(|(_, t)| !t.waiting.is_empty())
            .min_by_key(|(_, t)| t.pass)?;
        let entry = t.waiting.pop().expect("backlogged");
        self.virtual_time = t.pass;
        t.pass += stride(t.weight);
        t.starts += 1;
        self.len -= 1;
        Some((name.clone(), entry.priority, entry.item))
    }

    /// The highest priority waiting for `tenant`.
    pub fn top_priority(&self, tenant: &str) -> Option<u32> {
        self.tenants.get(tenant)?.waiting.peek().map(|e| e.priority)
    }

    pub fn shares(&self) -> Vec<TenantShare> {
        let total: u64 = self.tenants.values().map(|t| t.starts).sum();
        let weights: u64 = self.tenants.values().map(|t| u64::from(t.weight)).sum();
        self.tenants
            .iter()
            .map(|(name, t)| TenantShare {
                tenant: name.clone(),
                weight: t.weight,
                starts: t.starts,
                share: if total == 0 {
                    0.0
                } else {
                    t.starts as f64 / total as f64
                },
                fair_share: f64::from(t.weight) / weights.max(1) as f64,
                waiting: t.waiting.len(),
                backlogs: t.backlogs,
            })
            .collect()
    }
}

/// Settings of a [`StartScheduler`].
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Provider calls running at once.
    pub concurrency: usize,
    pub weights: BTreeMap<String, u32>,
    pub default_weight: u32,
    /// Reservations waiting at most; one more is refused ([`Error::QueueFull`]).
    pub max_waiting: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            concurrency: 64,
            weights: BTreeMap::new(),
            default_weight: 1,
            max_waiting: 10_000,
        }
    }
}

struct Waiter {
    reservation: Reservation,
    admitted: oneshot::Sender<Admitted>,
}

struct State {
    queue: FairQueue<Waiter>,
    free: usize,
    max_waiting: usize,
}

struct Shared {
    state: Mutex<State>,
}

/// The async gate: [`StartScheduler::admit`] waits for a slot chosen fairly.
#[derive(Clone)]
pub struct StartScheduler {
    shared: Arc<Shared>,
}

/// A reservation whose turn came, holding its slot until its lease ends.
pub struct Admitted {
    reservation: Reservation,
    permit: Permit,
}

impl Admitted {
    pub fn reservation(&self) -> &Reservation {
        &self.reservation
    }

    /// RESERVED → STARTED; the lease keeps the slot until it settles or drops.
    pub async fn start(self) -> Result<Lease, Error> {
        self.reservation
            .start_as(OperationId::random(), Some(self.permit))
            .await
    }
}

/// A running slot; freeing it lets the next waiter start.
pub struct Permit {
    shared: Arc<Shared>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let undelivered = {
            let mut state = self.shared.state.lock().expect("scheduler");
            state.free += 1;
            dispatch(&mut state, &self.shared)
        };
        // Dropped outside the lock: each returns its slot through this same path.
        drop(undelivered);
    }
}

/// Hands free slots to the next waiters; returns admissions whose waiter left.
fn dispatch(state: &mut State, shared: &Arc<Shared>) -> Vec<Admitted> {
    let mut undelivered = Vec::new();
    while state.free > 0 {
        let Some((tenant, _, waiter)) = state.queue.pop() else {
            break;
        };
        state.free -= 1;
        metrics::counter!("reservoir_client_starts_total", "tenant" => tenant).increment(1);
        let admitted = Admitted {
            reservation: waiter.reservation,
            permit: Permit {
                shared: shared.clone(),
            },
        };
        if let Err(back) = waiter.admitted.send(admitted) {
            undelivered.push(back);
        }
    }
    for s in state.queue.shares() {
        metrics::gauge!("reservoir_client_start_share", "tenant" => s.tenant.clone()).set(s.share);
        metrics::gauge!("reservoir_client_start_fair_share", "tenant" => s.tenant)
            .set(s.fair_share);
    }
    undelivered
}

/// A waiter's place while [`StartScheduler::admit`] waits: dropped before its
/// turn came (the wait cancelled), it leaves the queue.
struct Queued<'a> {
    shared: &'a Arc<Shared>,
    ticket: Option<Ticket>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let left = {
            let mut state = self.shared.state.lock().expect("scheduler");
            state.queue.remove(&ticket)
        };
        // Outside the lock: the reservation is released in the background. If
        // it was popped already, its admission is in the channel and goes
        // (slot and reservation) when the receiver drops.
        drop(left);
    }
}

impl StartScheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        StartScheduler {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    queue: FairQueue::new(config.weights, config.default_weight),
                    free: config.concurrency.max(1),
                    max_waiting: config.max_waiting,
                }),
            }),
        }
    }

    /// Waits until it is this reservation's turn (its tenant is its subject,
    /// its priority its route policy's). Cancelling the wait takes it out of
    /// the queue at once and releases it (in the background), without
    /// charging its tenant a start.
    pub async fn admit(&self, reservation: Reservation) -> Result<Admitted, Error> {
        let (tx, rx) = oneshot::channel();
        let (ticket, undelivered) = {
            let mut state = self.shared.state.lock().expect("scheduler");
            if state.queue.len() >= state.max_waiting {
                let limit = state.max_waiting;
                drop(state);
                drop(reservation); // released in the background
                return Err(Error::QueueFull { limit });
            }
            let tenant = reservation.subject().to_string();
            let priority = reservation.priority();
            let ticket = state.queue.push(
                &tenant,
                priority,
                Waiter {
                    reservation,
                    admitted: tx,
                },
            );
            (ticket, dispatch(&mut state, &self.shared))
        };
        drop(undelivered);
        let mut queued = Queued {
            shared: &self.shared,
            ticket: Some(ticket),
        };
        let admitted = rx.await;
        queued.ticket = None;
        admitted.map_err(|_| Error::InvalidInput("scheduler dropped the waiter".into()))
    }

    /// Waits for the turn, then starts.
    pub async fn start(&self, reservation: Reservation) -> Result<Lease, Error> {
        self.admit(reservation).await?.start().await
    }

    /// Each tenant's starts so far against its weighted share (also exported
    /// as the gauges `reservoir_client_start_share` / `_fair_share`).
    pub fn shares(&self) -> Vec<TenantShare> {
        self.shared.state.lock().expect("scheduler").queue.shares()
    }

    pub fn waiting(&self) -> usize {
        self.shared.state.lock().expect("scheduler").queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(w: &[(&str, u32)]) -> BTreeMap<String, u32> {
        w.iter().map(|(t, w)| (t.to_string(), *w)).collect()
    }

    #[test]
    fn saturated_tenants_share_starts_by_weight() {
        let mut q = FairQueue::new(weights(&[("a", 1), ("b", 2), ("c", 5)]), 1);
        // Keep every tenant backlogged: refill whoever started.
        for t in ["a", "b", "c"] {
            for _ in 0..4 {
                q.push(t, 0, ());
            }
        }
        for _ in 0..10_000 {
            let (t, _, ()) = q.pop().unwrap();
            q.push(&t, 0, ());
        }
        for s in q.shares() {
            let off = (s.share - s.fair_share).abs() / s.fair_share;
            assert!(off < 0.05, "{s:?}");
            // Stride scheduling is exact up to one start.
            assert!(
                (s.starts as f64 - 10_000.0 * s.fair_share).abs() <= 1.0,
                "{s:?}"
            );
        }
    }

    #[test]
    fn within_a_tenant_higher_priority_goes_first() {
        let mut q = FairQueue::new(BTreeMap::new(), 1);
        // (priority, arrival label), pushed in this order
        for (p, label) in [
            (1, "low-1"),
            (5, "high-1"),
            (1, "low-2"),
            (9, "top"),
            (5, "high-2"),
        ] {
            q.push("t", p, label);
        }
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, _, l)| l)).collect();
        assert_eq!(order, ["top", "high-1", "high-2", "low-1", "low-2"]);
    }

    #[test]
    fn a_waiter_taken_out_costs_its_tenant_no_start() {
        let mut q = FairQueue::new(BTreeMap::new(), 1);
        let gone = q.push("a", 0, "a-gone");
        q.push("b", 0, "b-1");
        q.push("b", 0, "b-2");
        assert_eq!(q.remove(&gone), Some("a-gone"));
        assert_eq!(q.remove(&gone), None, "once");
        assert_eq!(q.len(), 2);
        // "a" comes back level with "b": it was charged nothing for leaving.
        q.push("a", 0, "a-1");
        let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, _, l)| l)).collect();
        assert_eq!(order, ["a-1", "b-1", "b-2"]);
        let starts: Vec<_> = q.shares().iter().map(|s| s.starts).collect();
        assert_eq!(starts, [1, 2]);
        // A popped item's ticket takes nothing out.
        let popped = q.push("a", 0, "a-2");
        assert_eq!(q.pop().map(|(_, _, l)| l), Some("a-2"));
        assert_eq!(q.remove(&popped), None);
    }

    /// The fairness budget ([`FairnessGap`]) holds over any stretch in
    /// which two tenants both have requests waiting, however tenants come,
    /// go, cancel and re-enter; and the readings of [`FairQueue::shares`]
    /// tell such a stretch (both waiting, neither's backlog begun again).
    #[test]
    fn two_waiting_tenants_stay_within_two_starts_of_their_weighted_share() {
        const NAMES: [&str; 4] = ["a", "b", "c", "d"];
        let mut worst = 0.0f64;
        for seed in 0..300 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let w: Vec<u32> = NAMES.iter().map(|_| rng.u32(1..=8)).collect();
            let mut q = FairQueue::new(
                NAMES
                    .iter()
                    .zip(&w)
                    .map(|(n, w)| (n.to_string(), *w))
                    .collect(),
                1,
            );
            let mut tickets: Vec<Vec<Ticket>> = vec![Vec::new(); NAMES.len()];
            let mut starts = [0u64; NAMES.len()];
            // For each pair both waiting: their starts when that began.
            let mut since: BTreeMap<(usize, usize), (u64, u64)> = BTreeMap::new();
            // Each tenant's backlog count when it was last read.
            let mut backlogs = [0u64; NAMES.len()];
            for _ in 0..2_000 {
                match rng.u8(0..10) {
                    0..=3 => {
                        let i = rng.usize(..NAMES.len());
                        tickets[i].push(q.push(NAMES[i], rng.u32(0..3), ()));
                    }
                    4..=8 => {
                        if let Some((tenant, _, ())) = q.pop() {
                            let i = NAMES.iter().position(|n| *n == tenant).unwrap();
                            starts[i] += 1;
                        }
                    }
                    _ => {
                        let i = rng.usize(..NAMES.len());
                        if !tickets[i].is_empty() {
                            let k = rng.usize(..tickets[i].len());
                            let _ = q.remove(&tickets[i].swap_remove(k));
                        }
                    }
                }
                let shares = q.shares();
                let read = |i: usize| shares.iter().find(|s| s.tenant == NAMES[i]);
                let waiting: Vec<bool> = (0..NAMES.len())
                    .map(|i| {
                        let inside = q
                            .tenants
                            .get(NAMES[i])
                            .is_some_and(|t| !t.waiting.is_empty());
                        assert_eq!(read(i).map_or(0, |s| s.waiting) > 0, inside);
                        inside
                    })
                    .collect();
                for ((i, j), (si, sj)) in &since {
                    let gap =
                        FairnessGap::between((w[*i], starts[*i] - si), (w[*j], starts[*j] - sj));
                    assert!(
                        gap.within(),
                        "seed {seed}: {} ({}x{}) and {} ({}x{}): {gap:?}",
                        NAMES[*i],
                        starts[*i] - si,
                        w[*i],
                        NAMES[*j],
                        starts[*j] - sj,
                        w[*j]
                    );
                    worst = worst.max(gap.used());
                }
                since.retain(|(i, j), _| waiting[*i] && waiting[*j]);
                for (i, seen) in backlogs.iter_mut().enumerate() {
                    let now = read(i).map_or(0, |s| s.backlogs);
                    // A backlog begins again only after the tenant's queue emptied.
                    assert!(now == *seen || !since.keys().any(|&(a, b)| a == i || b == i));
                    *seen = now;
                }
                for i in 0..NAMES.len() {
                    for j in i + 1..NAMES.len() {
                        if waiting[i] && waiting[j] {
                            since.entry((i, j)).or_insert((starts[i], starts[j]));
                        }
                    }
                }
            }
        }
        // The budget is not slack: the worst stretch comes close to it.
        assert!(worst > 0.5, "worst gap {worst:.2} of the budget");
    }

    #[test]
    fn an_idle_tenant_banks_no_credit() {
        let mut q = FairQueue::new(BTreeMap::new(), 1);
        for _ in 0..100 {
            q.push("busy", 0, ());
            q.pop();
        }
        // "late" arrives now; it alternates with "busy" instead of taking 100 in a row.
        for _ in 0..10 {
            q.push("busy", 0, ());
            q.push("late", 0, ());
        }
        let first: Vec<_> = (0..6).map(|_| q.pop().unwrap().0).collect();
        let late = first.iter().filter(|t| *t == "late").count();
        assert!((2..=4).contains(&late), "{first:?}");
    }
}
