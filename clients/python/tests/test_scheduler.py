"""The fair start scheduler: the pure stride ordering (shares converge to
weights, priority then arrival within a tenant, no banked credit for an idle
tenant), the async and threaded gates (the concurrency limit, the waiting
limit, a cancelled or timed-out waiter leaving the queue), and the async gate
in front of the real ledger, with conservation checked after."""

from __future__ import annotations

import random
import threading
from collections import Counter

import anyio
import pytest

from conftest import assert_conserved, publish
from reservoir_client import AsyncReservoir
from reservoir_client.scheduler import (
    AsyncStartScheduler,
    FairnessGap,
    FairQueue,
    QueueFull,
    StartScheduler,
)

pytestmark = pytest.mark.anyio

WEIGHTS = {"a": 1, "b": 2, "c": 3}


def test_backlogged_tenants_start_in_proportion_to_their_weights() -> None:
    q: FairQueue[int] = FairQueue(WEIGHTS)
    for i in range(600):
        for tenant in WEIGHTS:
            q.push(tenant, 0, i)
    starts = Counter(q.pop()[0] for _ in range(600))  # type: ignore[index]
    for tenant, weight in WEIGHTS.items():
        assert abs(starts[tenant] - 100 * weight) <= 1, starts
    assert {s.tenant: round(s.fair_share, 3) for s in q.shares()} == {"a": 0.167, "b": 0.333, "c": 0.5}


def test_within_a_tenant_priority_goes_first_then_arrival() -> None:
    q: FairQueue[str] = FairQueue()
    for priority, item in ((0, "first"), (5, "urgent"), (0, "second"), (5, "urgent too")):
        q.push("a", priority, item)
    assert [q.pop() for _ in range(5)] == [
        ("a", 5, "urgent"),
        ("a", 5, "urgent too"),
        ("a", 0, "first"),
        ("a", 0, "second"),
        None,
    ]


def test_an_idle_tenant_reenters_without_banked_credit() -> None:
    q: FairQueue[int] = FairQueue()
    for i in range(100):
        q.push("a", 0, i)
    for _ in range(100):
        q.pop()
    for i in range(20):
        q.push("a", 0, i)
        q.push("b", 0, i)
    starts = Counter(q.pop()[0] for _ in range(10))  # type: ignore[index]
    assert starts == {"a": 5, "b": 5}


def test_two_waiting_tenants_stay_within_two_starts_of_their_weighted_share() -> None:
    """The fairness budget (:class:`FairnessGap`), as in the Rust client: over
    any stretch in which two tenants both have requests waiting, their starts
    per weight differ by at most two starts of the lighter one, however
    tenants come, go and cancel; and ``shares()`` tells such a stretch (both
    waiting, neither's backlog begun again)."""
    names = ["a", "b", "c", "d"]
    worst = 0.0
    for seed in range(100):
        rng = random.Random(seed)
        weights = {n: rng.randint(1, 8) for n in names}
        q: FairQueue[object] = FairQueue(weights)
        waiting: dict[str, list[object]] = {n: [] for n in names}
        starts = Counter[str]()
        since: dict[tuple[str, str], tuple[int, int]] = {}
        backlogs = Counter[str]()
        for _ in range(1_000):
            op = rng.randrange(10)
            if op <= 3:
                n = rng.choice(names)
                item = object()
                waiting[n].append(item)
                q.push(n, rng.randrange(3), item)
            elif op <= 8:
                popped = q.pop()
                if popped is not None:
                    starts[popped[0]] += 1
                    waiting[popped[0]].remove(popped[2])
            else:
                n = rng.choice(names)
                if waiting[n]:
                    item = waiting[n].pop(rng.randrange(len(waiting[n])))
                    assert q.remove(item)
            read = {s.tenant: s for s in q.shares()}
            for n in names:
                assert (read[n].waiting if n in read else 0) == len(waiting[n])
            for (i, j), (si, sj) in since.items():
                gap = FairnessGap.between(
                    (weights[i], starts[i] - si), (weights[j], starts[j] - sj)
                )
                assert gap.within(), (seed, i, j, gap)
                worst = max(worst, gap.used())
            since = {p: v for p, v in since.items() if waiting[p[0]] and waiting[p[1]]}
            for n in names:
                now = read[n].backlogs if n in read else 0
                # A backlog begins again only after the tenant's queue emptied.
                assert now == backlogs[n] or not any(n in p for p in since)
                backlogs[n] = now
            for i in names:
                for j in names:
                    if i < j and waiting[i] and waiting[j]:
                        since.setdefault((i, j), (starts[i], starts[j]))
    assert worst > 0.5, worst


async def test_the_async_gate_hands_out_slots_in_fair_order_up_to_its_limit() -> None:
    scheduler = AsyncStartScheduler(concurrency=2, weights=WEIGHTS)
    order: list[str] = []
    running = 0
    most = 0
    hold = anyio.Event()

    async def call(tenant: str) -> None:
        nonlocal running, most
        async with scheduler.slot(tenant):
            running += 1
            most = max(most, running)
            order.append(tenant)
            await hold.wait()
            await anyio.sleep(0)
            running -= 1

    async with anyio.create_task_group() as tg:
        async with scheduler.slot("blocker"), scheduler.slot("blocker"):
            for _ in range(30):
                for tenant in WEIGHTS:
                    tg.start_soon(call, tenant)
            while scheduler.waiting() < 90:
                await anyio.sleep(0.001)
            hold.set()
    assert most == 2
    assert len(order) == 90
    first = Counter(order[:60])
    for tenant, weight in WEIGHTS.items():
        assert abs(first[tenant] - 10 * weight) <= 1, (first, order)


async def test_a_full_queue_refuses_at_once_and_a_cancelled_waiter_leaves_it() -> None:
    scheduler = AsyncStartScheduler(concurrency=1, max_waiting=1)
    async with scheduler.slot("a"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_wait_in, scheduler)
            while scheduler.waiting() < 1:
                await anyio.sleep(0.001)
            with pytest.raises(QueueFull):
                async with scheduler.slot("b"):
                    pass
            tg.cancel_scope.cancel()
        assert scheduler.waiting() == 0
    # The slot is free again, and nobody holds a stale grant.
    with anyio.fail_after(1):
        async with scheduler.slot("c"):
            pass


async def _wait_in(scheduler: AsyncStartScheduler) -> None:
    async with scheduler.slot("waiting"):
        pytest.fail("the slot was never free")


def test_the_threaded_gate_limits_and_times_out() -> None:
    scheduler = StartScheduler(concurrency=1)
    entered = threading.Event()
    leave = threading.Event()

    def holder() -> None:
        with scheduler.slot("a"):
            entered.set()
            leave.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    assert entered.wait(5)
    with pytest.raises(TimeoutError):
        with scheduler.slot("b", timeout_s=0.05):
            pass
    assert scheduler.waiting() == 0
    leave.set()
    t.join(5)
    with scheduler.slot("b", timeout_s=1):
        pass


async def test_in_front_of_the_ledger_every_reservation_starts_and_settles_once(base: str, route: str) -> None:
    subjects = {tenant: f"{tenant}-{route}" for tenant in WEIGHTS}
    for subject in subjects.values():
        publish(base, subject, route, burst=10_000)
    scheduler = AsyncStartScheduler(concurrency=3, weights={s: WEIGHTS[t] for t, s in subjects.items()})
    async with AsyncReservoir(base) as rsv:

        async def call(subject: str, n: int) -> None:
            receipt = await rsv.reserve(subject, route, units=100)
            async with scheduler.slot(subject):
                await rsv.start(receipt.id, f"op-{subject}-{n}")
                await rsv.settle(receipt.id, 60)

        async with anyio.create_task_group() as tg:
            for n in range(10):
                for subject in subjects.values():
                    tg.start_soon(call, subject, n)
    assert {s.tenant: s.starts for s in scheduler.shares()} == {s: 10 for s in subjects.values()}
    for subject in subjects.values():
        books = assert_conserved(base, subject)
        assert (books["spent_units"], books["reserved_units"]) == (600, 0)
