"""``guarded_stream`` over the official Anthropic SDK, pointed at the fake
provider: however the stream ends, the reservation is settled once with the
input plus the output the count reached, and the usage is recorded (checked
through the route's learnt estimate and input drift)."""

from __future__ import annotations

from typing import Any, AsyncGenerator

import anthropic
import anyio
import pytest

from conftest import assert_conserved, publish, route_estimate
from fake_provider import FakeProvider, Script
from reservoir_client import AsyncReservoir, Receipt, Reservoir, guarded_stream

pytestmark = pytest.mark.anyio

BURST = 1_000_000
COUNTED = 100  # what the gateway counted; the provider reports 120
REPORTED = 120


def request(max_tokens: int = 4_000) -> dict[str, Any]:
    return {"model": "fake-model-1", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}


def async_sdk(provider: FakeProvider) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=provider.base, api_key="test-key", max_retries=0)


async def reserve(rsv: AsyncReservoir, subject: str, route: str) -> Receipt:
    return await rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)


def is_text_delta(event: Any) -> bool:
    return bool(event.type == "content_block_delta" and event.delta.type == "text_delta")


async def test_a_complete_stream_settles_the_reported_usage(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=300))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await reserve(rsv, subject, route)
        assert r.reserved_units == COUNTED + 4_000
        texts = 0
        async with guarded_stream(rsv, r, sdk.messages.stream(**request()), counted_input_tokens=COUNTED) as s:
            async for event in s:
                texts += event.type == "text"
        assert texts == 300
        assert s.settled is not None
        assert (s.settled.state, s.settled.actual_units) == ("SETTLED", REPORTED + 300)
        assert s.settled.operation_id == f"op-{r.id}"
        assert s.efficiency == 420 / 4_100
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"], p["available_units"]) == (420, 0, BURST - 420)
    assert s.settled.log_position is not None
    estimate = route_estimate(base, route, "fake-model-1", s.settled.log_position)
    assert (estimate["samples"], estimate["p50_units"]) == (1, 300)
    drift = estimate["input_drift"]
    assert (drift["samples"], drift["counted_input_units"], drift["reported_input_units"]) == (1, COUNTED, REPORTED)


async def test_a_consumer_that_stops_after_900_tokens_settles_900_plus_input(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000, usage_every=100))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await reserve(rsv, subject, route)
        seen = 0
        async with guarded_stream(rsv, r, sdk.messages.stream(**request()), counted_input_tokens=COUNTED) as s:
            async for event in s:
                seen += is_text_delta(event)
                if seen == 900:
                    break  # the gateway's own client hung up
        assert s.settled is not None
        assert (s.settled.state, s.settled.actual_units) == ("SETTLED", REPORTED + 900)
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["available_units"]) == (1_020, BURST - 1_020)


async def test_without_mid_stream_usage_the_deltas_are_the_count(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    # As the real API streams: usage only in message_start and the last message_delta.
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000, usage_every=0))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await reserve(rsv, subject, route)
        raw = await sdk.messages.create(**request(), stream=True)  # the raw event stream
        seen = 0
        async with guarded_stream(rsv, r, raw, counted_input_tokens=COUNTED) as s:
            async for event in s:
                seen += is_text_delta(event)
                if seen == 900:
                    break
        assert s.settled is not None and s.settled.actual_units == REPORTED + 900
    assert assert_conserved(base, subject)["spent_units"] == 1_020


async def test_a_provider_error_mid_stream_settles_what_was_streamed(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000, fail_after=500))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await reserve(rsv, subject, route)
        guard = guarded_stream(rsv, r, sdk.messages.stream(**request()), counted_input_tokens=COUNTED)
        with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
            async with guard as s:
                async for _ in s:
                    pass
        assert guard.settled is not None
        assert (guard.settled.state, guard.settled.actual_units) == ("SETTLED", REPORTED + 500)
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"]) == (620, 0)


async def test_a_cancelled_task_still_settles_what_streamed(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000))
    guards: list[Any] = []
    reached = anyio.Event()
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await reserve(rsv, subject, route)

        async def gateway_task() -> None:
            seen = 0
            guard = guarded_stream(rsv, r, sdk.messages.stream(**request()), counted_input_tokens=COUNTED)
            guards.append(guard)
            async with guard as s:
                async for event in s:
                    seen += is_text_delta(event)
                    if seen == 700:
                        reached.set()
                        await anyio.sleep_forever()  # cancelled here, mid-stream

        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway_task)
            await reached.wait()
            tg.cancel_scope.cancel()
        (guard,) = guards
        assert guard.settled is not None
        assert (guard.settled.state, guard.settled.actual_units) == ("SETTLED", REPORTED + 700)
    assert assert_conserved(base, subject)["spent_units"] == 820


async def test_a_gateway_generator_closed_on_client_disconnect_settles_the_count(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    # The first seed's shape: the gateway's handler is an async generator
    # around the guard; when its HTTP client disconnects, the web server
    # stops iterating and closes the generator (GeneratorExit at the yield).
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000))
    guards: list[Any] = []
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        lease = await reserve(rsv, subject, route)

        async def handler() -> AsyncGenerator[str, None]:
            guard = guarded_stream(rsv, lease, sdk.messages.stream(**request()), counted_input_tokens=COUNTED)
            guards.append(guard)
            async with guard as s:
                async for event in s:
                    if is_text_delta(event):
                        yield event.delta.text

        body = handler()
        sent = 0
        async for _ in body:
            sent += 1
            if sent == 900:
                break
        await body.aclose()  # what the server does once the client is gone
        (guard,) = guards
        assert guard.settled is not None
        assert (guard.settled.state, guard.settled.actual_units) == ("SETTLED", REPORTED + 900)
    assert assert_conserved(base, subject)["spent_units"] == 1_020


async def test_a_reservation_started_by_the_caller_keeps_its_operation_id(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=50))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        lease = await reserve(rsv, subject, route)
        started = await rsv.start(lease.id, "gateway-op-7")
        async with guarded_stream(rsv, started, sdk.messages.stream(**request()), counted_input_tokens=COUNTED) as s:
            async for _ in s:
                pass
        assert s.settled is not None
        assert (s.settled.operation_id, s.settled.actual_units) == ("gateway-op-7", REPORTED + 50)
    assert assert_conserved(base, subject)["spent_units"] == 170


@pytest.mark.parametrize(
    ("case", "raised", "charged"),
    [
        # The provider's own rate limit: it did not run, nothing is charged.
        ("refused", anthropic.RateLimitError, 0),
        # No answer at all (nothing listens there): the request may have run,
        # so the settle charges the gateway's count.
        ("unreachable", anthropic.APIConnectionError, COUNTED),
    ],
)
async def test_a_call_that_ends_before_streaming_is_charged_its_input_unless_refused(
    base: str, subject: str, route: str, provider: FakeProvider, case: str, raised: type[Exception], charged: int
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(refuse_status=429))
    if case == "refused":
        sdk_client = async_sdk(provider)
    else:
        sdk_client = anthropic.AsyncAnthropic(base_url="http://127.0.0.1:9", api_key="test-key", max_retries=0)
    async with AsyncReservoir(base) as rsv, sdk_client as sdk:
        r = await reserve(rsv, subject, route)
        guard = guarded_stream(rsv, r, sdk.messages.stream(**request()), counted_input_tokens=COUNTED)
        with pytest.raises(raised):
            async with guard:
                pass
        assert guard.settled is not None
        assert (guard.settled.state, guard.settled.actual_units) == ("SETTLED", charged)
        assert guard.meter.refused == (case == "refused")
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"], p["available_units"]) == (charged, 0, BURST - charged)


def test_the_sync_sdk_and_client_settle_the_same_way(base: str, subject: str, route: str, provider: FakeProvider) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=1_500))
    sdk = anthropic.Anthropic(base_url=provider.base, api_key="test-key", max_retries=0)
    with Reservoir(base) as rsv:
        r = rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)
        seen = 0
        with guarded_stream(rsv, r, sdk.messages.stream(**request()), counted_input_tokens=COUNTED) as s:
            for event in s:
                seen += is_text_delta(event)
                if seen == 900:
                    break
        assert s.settled is not None and s.settled.actual_units == REPORTED + 900
        done = rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)
        with guarded_stream(rsv, done, sdk.messages.stream(**request()), counted_input_tokens=COUNTED) as s2:
            for _ in s2:
                pass
        assert s2.settled is not None and s2.settled.actual_units == REPORTED + 1_500
    sdk.close()
    assert assert_conserved(base, subject)["spent_units"] == 1_020 + 1_620


async def test_a_three_dimension_route_settles_each_dimension_from_the_usage(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    """Requests, input and output tokens limited at once: the guard sends the
    usage and the ledger spends each dimension by it (1 request, the reported
    input, the 900 streamed output tokens), never the token total as requests."""
    publish(base, subject, route, burst=BURST, three_dimensions=True)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000, usage_every=100))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await reserve(rsv, subject, route)
        assert r.reserved_units == 1
        # Each further dimension typed: input as counted, output as sized.
        held = {d.dimension: d.reserved_units for d in r.dimensions}
        assert set(held) == {"input_tokens", "output_tokens"} and held["input_tokens"] == COUNTED, r
        assert "dimensions" not in r.extra and r.mode == "enforce" and r.would_refuse is None
        seen = 0
        async with guarded_stream(rsv, r, sdk.messages.stream(**request()), counted_input_tokens=COUNTED) as s:
            async for event in s:
                seen += is_text_delta(event)
                if seen == 900:
                    break
        assert s.settled is not None
        assert (s.settled.state, s.settled.actual_units) == ("SETTLED", 1)
        used = {d.dimension: d.actual_units for d in s.settled.dimensions}
        assert used == {"input_tokens": REPORTED, "output_tokens": 900}
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"]) == (1, 0)
    spent = {d["dimension"]: d["spent_units"] for d in p["dimensions"]}
    assert spent == {"input_tokens": REPORTED, "output_tokens": 900}
    assert all(d["reserved_units"] == 0 for d in p["dimensions"])


@pytest.mark.parametrize("exclude", [False, True], ids=["cache reads counted", "cache reads excluded"])
async def test_cache_reads_are_settled_apart_so_a_policy_can_exclude_them(
    base: str, subject: str, route: str, provider: FakeProvider, exclude: bool
) -> None:
    """Anthropic's ``input_tokens`` and ``cache_creation_input_tokens`` are the
    reported input, its ``cache_read_input_tokens`` the cache reads: a policy
    with ``exclude_cache_read_input_tokens`` charges 10 + 5 input tokens for a
    prompt that read 900 from the cache, one without it 915."""
    publish(base, subject, route, burst=BURST, exclude_cache_reads=exclude)
    provider.reset(Script(input_tokens=10, output_tokens=40, cache_creation_tokens=5, cache_read_tokens=900))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await reserve(rsv, subject, route)
        async with guarded_stream(rsv, r, sdk.messages.stream(**request()), counted_input_tokens=COUNTED) as s:
            async for _ in s:
                pass
        expected = (15 if exclude else 915) + 40
        assert s.settled is not None
        assert (s.settled.state, s.settled.actual_units) == ("SETTLED", expected)
    assert assert_conserved(base, subject)["spent_units"] == expected
