"""reserve → start → settle / release against the real server, through both
clients: typed receipts, sized reserves, idempotent repeats with one debit,
problem+json answers as exceptions, the bearer token on the wire (checked by
the server in ``test_auth``), and the
route-default ``max_tokens`` helper."""

from __future__ import annotations

import httpx
import pytest

from conftest import assert_conserved, publish
from reservoir_client import (
    AsyncReservoir,
    CapacityRefused,
    IdempotencyConflict,
    NoPolicy,
    Receipt,
    RequestTooLarge,
    Reservoir,
    RetryPolicy,
    UnknownReservation,
    Usage,
    WrongState,
)

pytestmark = pytest.mark.anyio

BURST = 100_000


async def test_reserve_start_settle_returns_the_unused_rest(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base) as rsv:
        r = await rsv.reserve(subject, route, units=1_000)
        assert isinstance(r, Receipt)
        assert (r.state, r.reserved_units, r.held_units, r.created) == ("RESERVED", 1_000, 1_000, True)
        assert r.id.startswith("rsv-") and r.subject == subject and r.route == route
        assert r.policy_generation == 1 and r.log_position is not None and r.sizing is None
        started = await rsv.start(r.id, "op-1")
        assert (started.state, started.operation_id) == ("STARTED", "op-1")
        settled = await rsv.settle(r.id, 600, operation_id="op-1", usage=Usage(model="m-1", output_tokens=500))
        assert (settled.state, settled.actual_units) == ("SETTLED", 600)
        assert settled.terminal
        assert (await rsv.get_reservation(r.id)) == settled
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"], p["available_units"]) == (600, 0, BURST - 600)


async def test_sized_reserve_carries_its_sizing(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, estimator={"quantile_ppm": 900_000, "floor_units": 1, "ceiling_units": 4_000, "min_samples": 100})
    async with AsyncReservoir(base) as rsv:
        r = await rsv.reserve(subject, route, counted_input_tokens=100, max_tokens=500)
        assert r.reserved_units == 600
        assert r.sizing is not None
        assert (r.sizing.rule, r.sizing.input_units, r.sizing.output_units) == ("max_tokens", 100, 500)
        cold = await rsv.reserve(subject, route, counted_input_tokens=100)
        assert cold.sizing is not None and (cold.sizing.rule, cold.reserved_units) == ("cold_ceiling", 4_100)
        released = await rsv.release(cold.id)
        assert released.state == "RELEASED"
    p = assert_conserved(base, subject)
    assert (p["reserved_units"], p["available_units"]) == (600, BURST - 600)


async def test_the_same_id_twice_is_one_debit_and_another_request_under_it_is_refused(
    base: str, subject: str, route: str
) -> None:
    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base) as rsv:
        first = await rsv.reserve(subject, route, units=700, reservation_id="same-id-1")
        again = await rsv.reserve(subject, route, units=700, reservation_id="same-id-1")
        assert (first.created, again.created) == (True, False)
        assert again.id == first.id and again.reserved_units == 700
        with pytest.raises(IdempotencyConflict) as conflict:
            await rsv.reserve(subject, route, units=701, reservation_id="same-id-1")
        assert conflict.value.status == 422
        assert conflict.value.type == "https://reservoir.dev/problems/exists_with_different_digest"
        assert conflict.value.code == "exists_with_different_digest"
    p = assert_conserved(base, subject)
    assert (p["reservations"], p["reserved_units"], p["available_units"]) == (1, 700, BURST - 700)


async def test_a_refusal_carries_type_retry_after_and_limiting_dimension(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=1_000, refill_per_s=10)
    async with AsyncReservoir(base) as rsv:
        await rsv.reserve(subject, route, units=1_000)
        with pytest.raises(CapacityRefused) as refused:
            await rsv.reserve(subject, route, units=500)
        e = refused.value
        assert e.status == 429 and e.code == "insufficient_capacity"
        assert e.type == "https://reservoir.dev/problems/insufficient_capacity"
        assert e.limiting_dimension == "tokens"
        assert e.retry_after is not None and e.retry_after > 0
        assert e.retryable and e.policy_generation == 1
        assert "retry-after" in {k.lower() for k in e.headers}
        with pytest.raises(RequestTooLarge) as too_large:
            await rsv.reserve(subject, route, units=1_001)
        assert too_large.value.status == 422 and not too_large.value.retryable
    p = assert_conserved(base, subject)
    assert p["reservations"] == 1 and p["refusals"] >= 2


async def test_refusals_are_retried_only_when_asked_and_then_admitted_once_refilled(
    base: str, subject: str, route: str
) -> None:
    # The whole burst is spent; 100 units a second refill the 50 asked for
    # within about half a second. The retry honours the refusal's
    # retry_after (not asserted: no timings here), and the admission happens
    # once, under the same id.
    publish(base, subject, route, burst=1_000, refill_per_s=100)
    async with AsyncReservoir(base, retry=RetryPolicy(retry_refusals=True, deadline_s=20, max_attempts=50)) as rsv:
        spent = await rsv.reserve(subject, route, units=1_000)
        await rsv.start(spent.id, "op")
        await rsv.settle(spent.id, 1_000)
        async with AsyncReservoir(base) as impatient:
            with pytest.raises(CapacityRefused):
                await impatient.reserve(subject, route, units=50)
        late = await rsv.reserve(subject, route, units=50, reservation_id=f"{subject}-late")
        assert late.state == "RESERVED" and late.created
    p = assert_conserved(base, subject)
    assert (p["reservations"], p["reserved_units"], p["spent_units"]) == (2, 50, 1_000)
    assert p["minted_units"] >= 50


async def test_wrong_state_unknown_and_no_policy_are_typed(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base) as rsv:
        r = await rsv.reserve(subject, route, units=10)
        await rsv.release(r.id)
        again = await rsv.release(r.id)
        assert again.state == "RELEASED"  # a repeat answers the same receipt
        with pytest.raises(WrongState) as wrong:
            await rsv.settle(r.id, 5)
        assert wrong.value.status == 409
        with pytest.raises(UnknownReservation):
            await rsv.get_reservation(f"{subject}-never")
        with pytest.raises(NoPolicy):
            await rsv.reserve(f"{subject}-x", route, units=1)
    p = assert_conserved(base, subject)
    assert (p["reserved_units"], p["spent_units"], p["available_units"]) == (0, 0, BURST)


def test_the_sync_client_does_the_same_steps(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=BURST)
    with Reservoir(base) as rsv:
        r = rsv.reserve(subject, route, units=2_000)
        assert r.created and r.state == "RESERVED"
        rsv.start(r.id, "op-sync")
        # Above the reservation: the excess comes out of available (no debt while it lasts).
        settled = rsv.settle(r.id, 2_500, operation_id="op-sync")
        assert (settled.state, settled.actual_units) == ("SETTLED", 2_500)
        other = rsv.reserve(subject, route, units=5)
        assert rsv.release(other.id).state == "RELEASED"
    p = assert_conserved(base, subject)
    assert p["spent_units"] == 2_500 and p["reserved_units"] == 0


async def test_the_bearer_token_is_sent_on_every_request(base: str, subject: str, route: str) -> None:
    seen: list[str | None] = []

    class Spy(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request.headers.get("authorization"))
            return await self.inner.handle_async_request(request)

    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base, token="secret-token", transport=Spy()) as rsv:
        r = await rsv.reserve(subject, route, units=1)
        await rsv.release(r.id)
    assert seen == ["Bearer secret-token", "Bearer secret-token"]
    assert_conserved(base, subject)


async def test_route_default_max_tokens_fills_requests_without_one(base: str, subject: str) -> None:
    route = f"chat/{subject}"  # a `/` in the route: percent-encoded in the path
    publish(
        base,
        subject,
        route,
        burst=BURST,
        estimator={"quantile_ppm": 900_000, "floor_units": 1, "ceiling_units": 8_000, "min_samples": 100, "default_max_tokens": 1_500},
    )
    async with AsyncReservoir(base) as rsv:
        assert await rsv.route_default_max_tokens(subject, route) == 1_500
        filled = await rsv.fill_max_tokens(subject, route, {"model": "m", "messages": []})
        assert filled == {"model": "m", "messages": [], "max_tokens": 1_500}
        kept = await rsv.fill_max_tokens(subject, route, {"max_completion_tokens": 64}, key="max_completion_tokens")
        assert kept == {"max_completion_tokens": 64}
        # Reserved as input + the filled max_tokens: the exact rule, not an estimate.
        r = await rsv.reserve(subject, route, counted_input_tokens=200, max_tokens=filled["max_tokens"])
        assert r.sizing is not None and (r.sizing.rule, r.reserved_units) == ("max_tokens", 1_700)
        # Without max_tokens the server applies the same default itself.
        d = await rsv.reserve(subject, route, counted_input_tokens=200)
        assert d.sizing is not None and (d.sizing.rule, d.reserved_units) == ("route_default_max_tokens", 1_700)
    with Reservoir(base) as sync:
        assert sync.route_default_max_tokens(subject, route) == 1_500
    p = assert_conserved(base, subject)
    assert p["reserved_units"] == 3_400


async def test_a_route_without_a_default_leaves_requests_alone(base: str, subject: str, route: str) -> None:
    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base) as rsv:
        assert await rsv.route_default_max_tokens(subject, route) is None
        assert await rsv.fill_max_tokens(subject, route, {"model": "m"}) == {"model": "m"}


async def test_in_shadow_mode_the_receipt_says_what_enforcement_would_have_refused(
    base: str, subject: str, route: str
) -> None:
    publish(base, subject, route, burst=1_000, shadow=True)
    async with AsyncReservoir(base) as rsv:
        fits = await rsv.reserve(subject, route, units=600)
        over = await rsv.reserve(subject, route, units=600)
        assert (fits.mode, fits.would_refuse) == ("shadow", None)
        assert over.mode == "shadow" and over.would_refuse is not None
        assert over.would_refuse.reason == "insufficient_capacity"
        assert "would_refuse" not in over.extra and over.dimensions == ()
        for r in (fits, over):
            await rsv.release(r.id)
    assert_conserved(base, subject)


async def test_a_receipt_carries_the_rate_limit_headers_for_a_gateway_to_pass_on(
    base: str, subject: str, route: str
) -> None:
    """Every reservation answer's ``RateLimit``, ``RateLimit-Policy`` and
    ``x-ratelimit-*`` headers, as ``Receipt.rate_limits`` (names in lower
    case); they are not part of the receipt's equality."""
    publish(base, subject, route, burst=BURST)
    async with AsyncReservoir(base) as rsv:
        r = await rsv.reserve(subject, route, units=1_000)
        assert r.rate_limits["x-ratelimit-limit-tokens"] == str(BURST)
        assert r.rate_limits["x-ratelimit-remaining-tokens"] == str(BURST - 1_000)
        assert r.rate_limits["ratelimit"].startswith('"tokens";r=99000;')
        assert r.rate_limits["ratelimit-policy"].startswith(f'"tokens";q={BURST};')
        assert not {k for k in r.rate_limits if not k.startswith(("ratelimit", "x-ratelimit-"))}
        released = await rsv.release(r.id)
        assert released.rate_limits["x-ratelimit-remaining-tokens"] == str(BURST)
        assert released == await rsv.get_reservation(r.id)
    assert_conserved(base, subject)
