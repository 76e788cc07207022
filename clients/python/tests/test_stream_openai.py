"""``guarded_stream`` over the official OpenAI SDK's chat-completion stream
(``stream_options={"include_usage": True}``), pointed at the fake provider.
OpenAI reports usage only in the last chunk, so a stream cut short is
counted from its deltas and charged the gateway's counted input."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from conftest import assert_conserved, publish, route_estimate
from fake_provider import FakeProvider, Script
from reservoir_client import AsyncReservoir, Reservoir, guarded_stream

pytestmark = pytest.mark.anyio

BURST = 1_000_000
COUNTED = 100
REPORTED = 120


def request() -> dict[str, Any]:
    return {
        "model": "fake-model-1",
        "max_completion_tokens": 4_000,
        "messages": [{"role": "user", "content": "hi"}],
        "stream_options": {"include_usage": True},
    }


def async_sdk(provider: FakeProvider) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=provider.base + "/v1", api_key="test-key", max_retries=0)


def content_chunk(chunk: Any) -> bool:
    return bool(chunk.choices and chunk.choices[0].delta.content)


async def test_a_complete_stream_settles_the_reported_usage(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=300))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)
        stream = await sdk.chat.completions.create(**request(), stream=True)
        async with guarded_stream(rsv, r, stream, counted_input_tokens=COUNTED) as s:
            chunks = [c async for c in s]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 300
        assert s.settled is not None
        assert (s.settled.state, s.settled.actual_units) == ("SETTLED", REPORTED + 300)
    assert provider.requests[0][1]["stream_options"] == {"include_usage": True}
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"], p["available_units"]) == (420, 0, BURST - 420)
    assert s.settled.log_position is not None
    estimate = route_estimate(base, route, "fake-model-1", s.settled.log_position)
    assert (estimate["samples"], estimate["p50_units"]) == (1, 300)
    assert estimate["input_drift"]["reported_input_units"] == REPORTED


async def test_a_consumer_that_stops_after_900_tokens_settles_900_plus_counted_input(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)
        stream = await sdk.chat.completions.create(**request(), stream=True)
        seen = 0
        async with guarded_stream(rsv, r, stream, counted_input_tokens=COUNTED) as s:
            async for chunk in s:
                seen += content_chunk(chunk)
                if seen == 900:
                    break
        assert s.settled is not None
        assert (s.settled.state, s.settled.actual_units) == ("SETTLED", COUNTED + 900)
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["available_units"]) == (1_000, BURST - 1_000)


async def test_a_provider_error_mid_stream_settles_what_was_streamed(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000, fail_after=500))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)
        stream = await sdk.chat.completions.create(**request(), stream=True)
        guard = guarded_stream(rsv, r, stream, counted_input_tokens=COUNTED)
        with pytest.raises(openai.APIError, match="server had an error"):
            async with guard as s:
                async for _ in s:
                    pass
        assert guard.settled is not None
        assert (guard.settled.state, guard.settled.actual_units) == ("SETTLED", COUNTED + 500)
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"]) == (600, 0)


async def test_the_stream_helper_manager_is_guarded_too(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=250))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)
        # chat.completions.stream(): a manager whose events wrap each chunk.
        async with guarded_stream(rsv, r, sdk.chat.completions.stream(**request()), counted_input_tokens=COUNTED) as s:
            kinds = {e.type async for e in s}
        assert "chunk" in kinds and "content.delta" in kinds
        assert s.settled is not None and s.settled.actual_units == REPORTED + 250
    assert assert_conserved(base, subject)["spent_units"] == 370


def test_the_sync_sdk_stopped_midway_settles_the_count(base: str, subject: str, route: str, provider: FakeProvider) -> None:
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=2_000))
    sdk = openai.OpenAI(base_url=provider.base + "/v1", api_key="test-key", max_retries=0)
    with Reservoir(base) as rsv:
        r = rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)
        seen = 0
        with guarded_stream(rsv, r, sdk.chat.completions.create(**request(), stream=True), counted_input_tokens=COUNTED) as s:
            for chunk in s:
                seen += content_chunk(chunk)
                if seen == 900:
                    break
        assert s.settled is not None and s.settled.actual_units == COUNTED + 900
    sdk.close()
    assert assert_conserved(base, subject)["spent_units"] == 1_000


async def test_a_provider_model_name_the_ledger_refuses_still_settles(
    base: str, subject: str, route: str, provider: FakeProvider
) -> None:
    """An OpenAI-compatible server (vLLM, llama.cpp, a proxy) may name its
    model with spaces or parentheses, which the ledger refuses as a usage
    model (422): the settle leaves the model out and still returns the hold."""
    publish(base, subject, route, burst=BURST)
    provider.reset(Script(input_tokens=REPORTED, output_tokens=30, model="Qwen2.5 7B Instruct (Q4_K_M)"))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await rsv.reserve(subject, route, counted_input_tokens=COUNTED, max_tokens=4_000)
        stream = await sdk.chat.completions.create(**request(), stream=True)
        async with guarded_stream(rsv, r, stream, counted_input_tokens=COUNTED) as s:
            async for _ in s:
                pass
        assert s.meter.model == "Qwen2.5 7B Instruct (Q4_K_M)"
        assert s.settled is not None
        assert (s.settled.state, s.settled.actual_units) == ("SETTLED", REPORTED + 30)
    p = assert_conserved(base, subject)
    assert (p["spent_units"], p["reserved_units"]) == (REPORTED + 30, 0)


@pytest.mark.parametrize("exclude", [False, True], ids=["cache reads counted", "cache reads excluded"])
async def test_cached_prompt_tokens_are_settled_as_cache_reads(
    base: str, subject: str, route: str, provider: FakeProvider, exclude: bool
) -> None:
    """``prompt_tokens`` includes ``cached_tokens``: the settle reports the
    rest as the input and the cached ones as cache reads, so a policy that
    excludes cache reads charges the prompt less its cached part."""
    publish(base, subject, route, burst=BURST, exclude_cache_reads=exclude)
    provider.reset(Script(input_tokens=1_000, output_tokens=40, cache_read_tokens=900))
    async with AsyncReservoir(base) as rsv, async_sdk(provider) as sdk:
        r = await rsv.reserve(subject, route, counted_input_tokens=1_000, max_tokens=4_000)
        stream = await sdk.chat.completions.create(**request(), stream=True)
        async with guarded_stream(rsv, r, stream, counted_input_tokens=1_000) as s:
            async for _ in s:
                pass
        expected = (100 if exclude else 1_000) + 40
        assert s.settled is not None and s.settled.actual_units == expected
    assert assert_conserved(base, subject)["spent_units"] == expected
