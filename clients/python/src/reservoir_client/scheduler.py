"""The fair start scheduler: when the gateway can run only so many provider
calls at once, it picks which already-RESERVED request starts next. It mirrors
the Rust client's ``reservoir_client::scheduler``.

Between tenants it is stride scheduling: each tenant has a virtual *pass* that
grows by ``STRIDE / weight`` per start, and the backlogged tenant with the
lowest pass goes next, so under saturation tenant shares converge to their
weights (a tenant that was idle re-enters at the current virtual time, without
banked credit). Within a tenant the highest priority goes first, then arrival
order. It orders only reservations the ledger has already made, so it can
delay a call but never admit one the ledger did not.

:class:`FairQueue` is the pure ordering; :class:`AsyncStartScheduler` (anyio)
and :class:`StartScheduler` (threads) are the gates around it, with the
concurrency limit::

    scheduler = AsyncStartScheduler(concurrency=32, weights={"tenant-7": 3})
    receipt = await rsv.reserve("tenant-7", "chat", units=1_000)
    async with scheduler.slot(receipt.subject, priority=policy_priority):
        await rsv.start(receipt.id, operation_id)
        ...  # the provider call, then settle

A waiter cancelled before its turn leaves the queue; a slot is freed when its
``with`` block ends, however it ends. Past ``max_waiting`` waiters a new one
raises :class:`QueueFull` at once (the caller releases its reservation).
"""

from __future__ import annotations

import heapq
import threading
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Generic, Iterator, Mapping, TypeVar

import anyio

from .errors import ReservoirError

__all__ = [
    "AsyncStartScheduler",
    "FairQueue",
    "FairnessGap",
    "QueueFull",
    "StartScheduler",
    "TenantShare",
]

#: Pass increment of a weight-1 tenant per start.
STRIDE = 1 << 40

T = TypeVar("T")


class QueueFull(ReservoirError):
    """``max_waiting`` reservations already wait for a slot."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"{limit} reservations already wait to start")


@dataclass(frozen=True)
class TenantShare:
    """A tenant's starts so far against its weight's share."""

    tenant: str
    weight: int
    starts: int
    share: float
    fair_share: float
    #: Its requests waiting now.
    waiting: int = 0
    #: Times its queue went from empty to waiting: two readings with the same
    #: count, each with requests waiting, mean it waited throughout (the
    #: stretch :class:`FairnessGap` is about).
    backlogs: int = 0


@dataclass(frozen=True)
class FairnessGap:
    """Two tenants' starts over a stretch in which both had requests waiting
    throughout, against the scheduler's fairness budget: their starts per
    weight differ by at most two starts of the lighter one. In pass units,
    exactly as the scheduler counts: ``gap = |Si*stride_i - Sj*stride_j|``,
    ``budget = 2*max(stride_i, stride_j)`` (as the Rust client's
    ``FairnessGap``)."""

    gap: int
    budget: int

    @classmethod
    def between(cls, a: tuple[int, int], b: tuple[int, int]) -> FairnessGap:
        """``(weight, starts in the stretch)`` of each tenant."""
        stride_a, stride_b = STRIDE // max(1, a[0]), STRIDE // max(1, b[0])
        return cls(gap=abs(a[1] * stride_a - b[1] * stride_b), budget=2 * max(stride_a, stride_b))

    def within(self) -> bool:
        return self.gap <= self.budget

    def used(self) -> float:
        """The gap as a fraction of the budget (above 1: over it)."""
        return self.gap / self.budget


@dataclass
class _Tenant(Generic[T]):
    weight: int
    pass_: int = 0
    starts: int = 0
    backlogs: int = 0
    #: (-priority, arrival, item): heapq pops the highest priority, then the earliest.
    waiting: list[tuple[int, int, T]] = field(default_factory=list)


class FairQueue(Generic[T]):
    """Stride scheduling between tenants, priority then arrival within one."""

    def __init__(self, weights: Mapping[str, int] | None = None, default_weight: int = 1) -> None:
        self._weights = dict(weights or {})
        self._default_weight = max(1, default_weight)
        self._tenants: dict[str, _Tenant[T]] = {}
        self._virtual_time = 0
        self._seq = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, tenant: str, priority: int, item: T) -> None:
        t = self._tenants.get(tenant)
        if t is None:
            t = _Tenant(weight=max(1, self._weights.get(tenant, self._default_weight)))
            self._tenants[tenant] = t
        if not t.waiting:
            t.pass_ = max(t.pass_, self._virtual_time)
            t.backlogs += 1
        self._seq += 1
        heapq.heappush(t.waiting, (-priority, self._seq, item))
        self._len += 1

    def pop(self) -> tuple[str, int, T] | None:
        """The next to start: (tenant, priority, item), or None when empty.
        Ties between tenants go to the one first seen."""
        best: tuple[str, _Tenant[T]] | None = None
        for name, t in self._tenants.items():
            if t.waiting and (best is None or t.pass_ < best[1].pass_):
                best = (name, t)
        if best is None:
            return None
        name, t = best
        neg_priority, _, item = heapq.heappop(t.waiting)
        self._virtual_time = t.pass_
        t.pass_ += STRIDE // t.weight
        t.starts += 1
        self._len -= 1
        return name, -neg_priority, item

    def remove(self, item: T) -> bool:
        """Takes a waiting item out (a cancelled waiter); False if not waiting."""
        for t in self._tenants.values():
            for i, entry in enumerate(t.waiting):
                if entry[2] is item:
                    t.waiting.pop(i)
                    heapq.heapify(t.waiting)
                    self._len -= 1
                    return True
        return False

    def shares(self) -> list[TenantShare]:
        total = sum(t.starts for t in self._tenants.values())
        weights = sum(t.weight for t in self._tenants.values())
        return [
            TenantShare(
                tenant=name,
                weight=t.weight,
                starts=t.starts,
                share=t.starts / total if total else 0.0,
                fair_share=t.weight / max(1, weights),
                waiting=len(t.waiting),
                backlogs=t.backlogs,
            )
            for name, t in self._tenants.items()
        ]


class _Gate:
    """The slots and the queue of waiters, behind one lock (shared by both gates)."""

    def __init__(
        self, concurrency: int, weights: Mapping[str, int] | None, default_weight: int, max_waiting: int
    ) -> None:
        if concurrency < 1 or max_waiting < 0:
            raise ValueError("concurrency must be at least 1 and max_waiting not negative")
        self.lock = threading.Lock()
        self.queue: FairQueue[_Waiter] = FairQueue(weights, default_weight)
        self.free = concurrency
        self.max_waiting = max_waiting

    def enter(self, tenant: str, priority: int, waiter: _Waiter) -> None:
        """Queues ``waiter`` and hands out free slots (caller holds no lock)."""
        with self.lock:
            if len(self.queue) >= self.max_waiting:
                raise QueueFull(self.max_waiting)
            self.queue.push(tenant, priority, waiter)
            self._dispatch()

    def leave(self, waiter: _Waiter) -> None:
        """A waiter is done: its slot back if it had one, else out of the queue."""
        with self.lock:
            if waiter.granted:
                self.free += 1
            else:
                self.queue.remove(waiter)
            self._dispatch()

    def _dispatch(self) -> None:
        while self.free > 0:
            popped = self.queue.pop()
            if popped is None:
                return
            self.free -= 1
            popped[2].grant()


class _Waiter:
    def __init__(self, async_event: anyio.Event | None = None) -> None:
        self.granted = False
        self.thread_event = threading.Event()
        self.async_event = async_event

    def grant(self) -> None:
        self.granted = True
        self.thread_event.set()
        if self.async_event is not None:
            self.async_event.set()


class _Scheduler:
    """What both gates share: the gate, and what it tells."""

    def __init__(
        self,
        concurrency: int = 64,
        *,
        weights: Mapping[str, int] | None = None,
        default_weight: int = 1,
        max_waiting: int = 10_000,
    ) -> None:
        self._gate = _Gate(concurrency, weights, default_weight, max_waiting)

    def shares(self) -> list[TenantShare]:
        """Each tenant's starts so far against its weight's share."""
        with self._gate.lock:
            return self._gate.queue.shares()

    def waiting(self) -> int:
        """Waiters not yet given a slot."""
        with self._gate.lock:
            return len(self._gate.queue)


class AsyncStartScheduler(_Scheduler):
    """The async gate (asyncio or trio, through anyio): at most ``concurrency``
    slots held at once, handed out in :class:`FairQueue` order. Use it from
    one event loop (its waiters wake through that loop's events)."""

    @asynccontextmanager
    async def slot(self, tenant: str, *, priority: int = 0) -> AsyncIterator[None]:
        """Waits for ``tenant``'s fair turn, holds a slot for the block."""
        event = anyio.Event()
        waiter = _Waiter(event)
        self._gate.enter(tenant, priority, waiter)
        try:
            if not waiter.granted:
                await event.wait()
            yield
        finally:
            with anyio.CancelScope(shield=True):
                self._gate.leave(waiter)


class StartScheduler(_Scheduler):
    """The blocking gate, for threaded gateways; see :class:`AsyncStartScheduler`."""

    @contextmanager
    def slot(self, tenant: str, *, priority: int = 0, timeout_s: float | None = None) -> Iterator[None]:
        """Waits for ``tenant``'s fair turn (raises ``TimeoutError`` after
        ``timeout_s``, leaving the queue), holds a slot for the block."""
        waiter = _Waiter()
        self._gate.enter(tenant, priority, waiter)
        try:
            if not waiter.thread_event.wait(timeout_s):
                raise TimeoutError(f"no slot for {tenant} within {timeout_s} s")
            yield
        finally:
            self._gate.leave(waiter)
