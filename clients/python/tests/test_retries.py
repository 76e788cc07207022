"""Lost answers, through a fault injector between the client and the real
server: every retry keeps the reservation id, a reserve whose answer was lost
resolves to the original receipt, and nothing is debited twice. Plus the
retry policy's arithmetic on its own (seeded, with a fake clock)."""

from __future__ import annotations

import random
import socket
from typing import Any

import httpx
import pytest

from conftest import assert_conserved, publish
from fault import AsyncLoseAnswers, AsyncProxyAnswers, LoseAnswers, on
from reservoir_client import (
    AsyncReservoir,
    guarded_stream,
    LedgerUnreachable,
    OutcomeUnknown,
    ProblemError,
    RequestNotSent,
    ReservationUnknown,
    Reservoir,
    RetryPolicy,
    Unavailable,
)
from reservoir_client.errors import problem_from_response
from reservoir_client.retry import Attempts

pytestmark = pytest.mark.anyio

BURST = 100_000
FAST = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05)


async def test_a_lost_reserve_answer_resolves_to_the_original_receipt_with_one_debit(
    base: str, subject: str, route: str
) -> None:
    publish(base, subject, route, burst=BURST)
    fault = AsyncLoseAnswers(on("POST", "/v1/reservations"), lose=1)
    async with AsyncReservoir(base, transport=fault, retry=FAST) as rsv:
        receipt = await rsv.reserve(subject, route, counted_input_tokens=300, max_tokens=700)
    # The first answer (201, created) was dropped; the retry with the same id
    # was answered with that very reservation (200, not created again).
    assert fault.budget.lost == [201] and fault.budget.sent == 2
    assert (receipt.created, receipt.state, receipt.reserved_units) == (False, "RESERVED", 1_000)
    async with AsyncReservoir(base) as clean:
        assert (await clean.get_reservation(receipt.id)).reserved_units == 1_000
    p = assert_conserved(base, subject)
    assert (p["reservations"], p["reserved_units"], p["available_units"]) == (1, 1_000, BURST - 1_000)


async def test_past_the_deadline_the_reserve_is_unknown_and_resolve_finds_it(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=BURST)
    fault = AsyncLoseAnswers(on("POST", "/v1/reservations"), lose=10)
    async with AsyncReservoir(base, transport=fault, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01)) as rsv:
        with pytest.raises(ReservationUnknown) as unknown:
            await rsv.reserve(subject, route, units=400, reservation_id=f"{subject}-u")
    assert unknown.value.reservation_id == f"{subject}-u"
    assert fault.budget.lost == [201, 200, 200]  # one reservation, answered three times
    async with AsyncReservoir(base) as clean:
        resolved = await clean.resolve(unknown.value)
    assert (resolved.id, resolved.created, resolved.reserved_units) == (f"{subject}-u", False, 400)
    p = assert_conserved(base, subject)
    assert (p["reservations"], p["reserved_units"]) == (1, 400)


async def test_a_reserve_lost_on_the_way_is_unknown_too_and_resolve_reserves_it_once(
    base: str, subject: str, route: str
) -> None:
    publish(base, subject, route, burst=BURST)
    fault = AsyncLoseAnswers(on("POST", "/v1/reservations"), lose=10, reach_server=False)
    async with AsyncReservoir(base, transport=fault, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)) as rsv:
        with pytest.raises(ReservationUnknown) as unknown:
            await rsv.reserve(subject, route, units=250)
    assert fault.budget.sent == 0
    assert assert_conserved(base, subject)["reservations"] == 0
    async with AsyncReservoir(base) as clean:
        resolved = await clean.resolve(unknown.value)
        again = await clean.resolve(unknown.value)
    assert (resolved.created, again.created) == (True, False)
    assert resolved.id == again.id == unknown.value.reservation_id
    p = assert_conserved(base, subject)
    assert (p["reservations"], p["reserved_units"]) == (1, 250)


@pytest.mark.parametrize("step", ["start", "settle", "release"])
async def test_lost_answers_of_later_steps_are_retried_to_one_effect(
    base: str, subject: str, route: str, step: str
) -> None:
    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base) as clean:
        r = await clean.reserve(subject, route, units=1_000)
        if step == "settle":
            await clean.start(r.id, "op-1")
    fault = AsyncLoseAnswers(on("POST", f"/{step}"), lose=2)
    async with AsyncReservoir(base, transport=fault, retry=FAST) as rsv:
        if step == "start":
            out = await rsv.start(r.id, "op-1")
            assert out.state == "STARTED"
        elif step == "settle":
            out = await rsv.settle(r.id, 640, operation_id="op-1")
            assert (out.state, out.actual_units) == ("SETTLED", 640)
        else:
            out = await rsv.release(r.id)
            assert out.state == "RELEASED"
    assert len(fault.budget.lost) == 2 and fault.budget.sent == 3
    p = assert_conserved(base, subject)
    expected = {
        "start": (1_000, 0, BURST - 1_000),
        "settle": (0, 640, BURST - 640),
        "release": (0, 0, BURST),
    }[step]
    assert (p["reserved_units"], p["spent_units"], p["available_units"]) == expected


async def test_a_settle_whose_answers_stay_lost_is_outcome_unknown_and_a_repeat_settles_once(
    base: str, subject: str, route: str
) -> None:
    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base) as clean:
        r = await clean.reserve(subject, route, units=900)
        await clean.start(r.id, "op")
    fault = AsyncLoseAnswers(on("POST", "/settle"), lose=10)
    async with AsyncReservoir(base, transport=fault, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)) as rsv:
        with pytest.raises(OutcomeUnknown) as unknown:
            await rsv.settle(r.id, 500)
    assert not isinstance(unknown.value, ReservationUnknown)
    async with AsyncReservoir(base) as clean:
        assert (await clean.settle(r.id, 500)).state == "SETTLED"
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"], p["available_units"]) == (500, 0, BURST - 500)


def test_the_sync_client_resolves_a_lost_reserve_the_same_way(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=BURST)
    fault = LoseAnswers(on("POST", "/v1/reservations"), lose=1)
    with Reservoir(base, transport=fault, retry=FAST) as rsv:
        receipt = rsv.reserve(subject, route, units=333)
        rsv.start(receipt.id, "op")
        rsv.settle(receipt.id, 111)
    assert fault.budget.lost == [201] and not receipt.created
    p = assert_conserved(base, subject)
    assert (p["reservations"], p["spent_units"], p["available_units"]) == (1, 111, BURST - 111)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("status", [502, 504])
async def test_a_reserve_a_proxy_answered_only_with_a_5xx_is_unknown_and_resolves_once(
    base: str, subject: str, route: str, status: int
) -> None:
    """A proxy that forwarded the reserve and then answered 502/504 itself:
    the ledger may have committed it, so the reserve ends as
    ``ReservationUnknown`` with its id (not a bare retryable ``ProblemError``
    inviting a second reserve under a new id), and ``resolve`` finds it."""
    publish(base, subject, route, burst=BURST)
    proxy = AsyncProxyAnswers(on("POST", "/v1/reservations"), status, times=10)
    async with AsyncReservoir(base, transport=proxy, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01)) as rsv:
        with pytest.raises(ReservationUnknown) as unknown:
            await rsv.reserve(subject, route, counted_input_tokens=300, max_tokens=100)
    assert isinstance(unknown.value.cause, ProblemError) and unknown.value.cause.status == status
    assert proxy.budget.lost == [201, 200, 200]  # one reservation, committed on the first try
    async with AsyncReservoir(base) as clean:
        resolved = await clean.resolve(unknown.value)
    assert (resolved.id, resolved.created, resolved.reserved_units) == (unknown.value.reservation_id, False, 400)
    p = assert_conserved(base, subject)
    assert (p["reservations"], p["reserved_units"]) == (1, 400)


async def test_a_settle_a_proxy_answered_only_with_504_is_outcome_unknown(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base) as clean:
        r = await clean.reserve(subject, route, units=900)
        await clean.start(r.id, "op")
    proxy = AsyncProxyAnswers(on("POST", "/settle"), 504, times=10)
    async with AsyncReservoir(base, transport=proxy, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)) as rsv:
        with pytest.raises(OutcomeUnknown) as unknown:
            await rsv.settle(r.id, 500, operation_id="op")
    assert not isinstance(unknown.value, ReservationUnknown) and unknown.value.request_body == {
        "actual_units": 500,
        "operation_id": "op",
    }
    async with AsyncReservoir(base) as clean:
        assert (await clean.settle(r.id, 500, operation_id="op")).created is False
    assert assert_conserved(base, subject)["spent_units"] == 500


async def test_an_unreachable_ledger_is_reported_as_such_not_as_unknown() -> None:
    base = f"http://127.0.0.1:{_closed_port()}"
    async with AsyncReservoir(base, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01)) as rsv:
        with pytest.raises(LedgerUnreachable):
            await rsv.reserve("t", "chat", units=1)


# ------------------------------------------------------------- the policy alone


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _unavailable(retry_after: str | None = "1") -> Unavailable:
    headers = {"retry-after": retry_after} if retry_after else {}
    e = problem_from_response(503, headers, b'{"type":"https://reservoir.dev/problems/unavailable","status":503}')
    assert isinstance(e, Unavailable)
    return e


def test_backoff_is_jittered_exponential_capped_and_stops_at_the_deadline() -> None:
    clock = FakeClock()
    policy = RetryPolicy(deadline_s=30, max_attempts=20, initial_backoff_s=0.1, max_backoff_s=1.6, multiplier=2)
    attempts = Attempts(policy, random.Random(7), method="GET", path="/x", body=None, reservation_id=None, clock=clock)
    caps = [0.1, 0.2, 0.4, 0.8, 1.6, 1.6, 1.6]
    import httpx

    delays = []
    for cap in caps:
        delay = attempts.transport_failed(httpx.ConnectError("refused"))
        assert delay is not None and 0 <= delay <= cap
        delays.append(delay)
        clock.now += delay
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    # A server's Retry-After raises the delay to at least that.
    delay = attempts.answered(_unavailable("1"))
    assert delay is not None and delay >= 1.0
    # Past the deadline nothing more is tried, and nothing was ever applied.
    clock.now += 1_000
    assert attempts.transport_failed(httpx.ConnectError("refused")) is None
    assert isinstance(attempts.give_up(), LedgerUnreachable)


def test_an_attempt_that_may_have_landed_makes_the_end_unknown_and_keeps_the_id() -> None:
    import httpx

    clock = FakeClock()
    body: dict[str, object] = {"id": "r-1", "subject": "t", "route": "c", "units": 5}
    attempts = Attempts(
        RetryPolicy(max_attempts=3), random.Random(1), method="POST", path="/v1/reservations", body=body, reservation_id="r-1", clock=clock
    )
    assert attempts.transport_failed(httpx.ReadError("lost")) is not None
    assert attempts.answered(_unavailable()) is not None
    assert attempts.transport_failed(httpx.ConnectError("refused")) is None  # third and last try
    end = attempts.give_up()
    assert isinstance(end, ReservationUnknown) and end.reservation_id == "r-1" and end.request_body == body


def test_a_request_httpx_refuses_to_send_is_not_retried_and_not_unknown() -> None:
    """httpx refuses a request it cannot encode (a header value with a
    newline, ...) before sending a byte: nothing was applied, trying again
    cannot help, and the ledger was not found unreachable either."""
    import httpx

    attempts = Attempts(
        RetryPolicy(), random.Random(1), method="POST", path="/v1/reservations", body={"id": "r-1"}, reservation_id="r-1"
    )
    assert attempts.transport_failed(httpx.LocalProtocolError("Illegal header value b'Bearer x\\n'")) is None
    end = attempts.give_up()
    assert isinstance(end, RequestNotSent) and not isinstance(end, (OutcomeUnknown, LedgerUnreachable))
    assert isinstance(end.cause, httpx.LocalProtocolError) and attempts.tries == 1


def test_a_full_connection_pool_is_not_an_unreachable_ledger() -> None:
    """A pool timeout is the client's own pool staying full (a burst against a
    healthy but slow ledger): retried, never applied, and not
    ``LedgerUnreachable`` (which would admit from an emergency shard) unless
    a try really failed to reach the ledger."""
    import httpx

    clock = FakeClock()

    def attempts() -> Attempts:
        policy = RetryPolicy(max_attempts=3)
        body: dict[str, object] = {"id": "r-1"}
        return Attempts(policy, random.Random(1), method="POST", path="/v1/reservations", body=body, reservation_id="r-1", clock=clock)

    starved = attempts()
    assert starved.transport_failed(httpx.PoolTimeout("pool full")) is not None  # retried
    assert starved.transport_failed(httpx.PoolTimeout("pool full")) is not None
    assert starved.transport_failed(httpx.PoolTimeout("pool full")) is None
    end = starved.give_up()
    assert isinstance(end, RequestNotSent) and not isinstance(end, LedgerUnreachable)
    refused = attempts()
    refused.transport_failed(httpx.PoolTimeout("pool full"))
    refused.transport_failed(httpx.ConnectError("refused"))
    refused.transport_failed(httpx.PoolTimeout("pool full"))
    assert isinstance(refused.give_up(), LedgerUnreachable)


def test_problem_bodies_are_parsed_tolerantly() -> None:
    e = problem_from_response(
        429,
        {"Retry-After": "3"},
        b'{"type":"https://reservoir.dev/problems/insufficient_capacity","status":429,"retryable":true,'
        b'"limiting_dimension":"output_tokens","retry_after_ms":2500,"dimensions":{"output_tokens":{"available_units":0}}}',
    )
    assert (e.code, e.retry_after, e.limiting_dimension) == ("insufficient_capacity", 2.5, "output_tokens")
    assert e.body["dimensions"] == {"output_tokens": {"available_units": 0}}
    bare = problem_from_response(429, {"retry-after": "2"}, b'{"type":"https://reservoir.dev/problems/insufficient_capacity"}')
    assert (bare.retry_after, bare.limiting_dimension) == (2.0, None)
    proxy = problem_from_response(502, {}, b"<html>bad gateway</html>")
    assert proxy.status == 502 and proxy.retryable and "bad gateway" in proxy.detail


async def test_a_guard_whose_start_answers_are_lost_gives_the_call_back_at_zero(base: str, subject: str, route: str) -> None:
    """The start happened, its answers never came back: the guard raises and
    makes no provider call, and the reservation is settled at 0 in every
    dimension (a route limiting tokens beside requests needs the zero usage),
    not left STARTED to lose its whole hold at the execution limit."""
    publish(base, subject, route, burst=BURST, three_dimensions=True)
    async with AsyncReservoir(base) as clean:
        r = await clean.reserve(subject, route, counted_input_tokens=300, max_tokens=200)
    fault = AsyncLoseAnswers(on("POST", "/start"), lose=10)
    opened: list[bool] = []

    async def provider_stream() -> Any:
        opened.append(True)
        yield {"type": "message_stop"}

    async with AsyncReservoir(base, transport=fault, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)) as rsv:
        guard = guarded_stream(rsv, r, provider_stream(), counted_input_tokens=300)
        with pytest.raises(OutcomeUnknown):
            async with guard:
                pass
    assert fault.budget.sent >= 1 and not opened, "the start reached the ledger; the provider was never called"
    assert guard.settled is not None
    assert (guard.settled.state, guard.settled.actual_units) == ("SETTLED", 0)
    p = assert_conserved(base, subject)
    for d in [p, *p["dimensions"]]:
        assert (d["reserved_units"], d["spent_units"]) == (0, 0), d


def test_the_sync_guard_gives_the_call_back_the_same_way(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=BURST, three_dimensions=True)
    with Reservoir(base) as clean:
        r = clean.reserve(subject, route, counted_input_tokens=300, max_tokens=200)
    fault = LoseAnswers(on("POST", "/start"), lose=10)
    with Reservoir(base, transport=fault, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)) as rsv:
        guard = guarded_stream(rsv, r, iter([{"type": "message_stop"}]), counted_input_tokens=300)
        with pytest.raises(OutcomeUnknown):
            with guard:
                pass
    assert guard.settled is not None
    assert (guard.settled.state, guard.settled.actual_units) == ("SETTLED", 0)
    p = assert_conserved(base, subject)
    for d in [p, *p["dimensions"]]:
        assert (d["reserved_units"], d["spent_units"]) == (0, 0), d


async def test_a_ledger_still_recovering_is_unreachable_not_unknown(base: str, subject: str, route: str) -> None:
    """A ledger recovering from its log answers 503 ``not_ready`` before any
    writer exists: a reserve answered only that way never landed, so it ends
    in ``LedgerUnreachable`` (which a shard book may admit from), not
    ``ReservationUnknown`` (which it never does)."""
    problem = {"type": "https://reservoir.dev/problems/not_ready", "title": "Not ready", "status": 503,
               "detail": "recovering the ledger from the log"}
    answers: list[int] = []

    def recovering(request: httpx.Request) -> httpx.Response:
        answers.append(503)
        return httpx.Response(503, json=problem, headers={"retry-after": "0",
                              "content-type": "application/problem+json"})

    transport = httpx.MockTransport(recovering)
    async with AsyncReservoir(base, transport=transport, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01)) as rsv:
        with pytest.raises(LedgerUnreachable):
            await rsv.reserve(subject, route, units=100)
    assert len(answers) == 3
