"""The running count alone, one row per case: which events count, what the
count is when the stream completed and when it was cut short. Events are
plain objects shaped like the SDKs' (the meter reads attributes only)."""

from __future__ import annotations

from types import SimpleNamespace as E
from typing import Any

import pytest

from reservoir_client import StreamMeter, Usage


def start(input_tokens: int = 50, cache_read: int | None = None, cache_creation: int | None = None) -> Any:
    usage = E(input_tokens=input_tokens, output_tokens=1, cache_read_input_tokens=cache_read, cache_creation_input_tokens=cache_creation)
    return E(type="message_start", message=E(model="claude-x", usage=usage))


def text(t: str) -> Any:
    return E(type="content_block_delta", delta=E(type="text_delta", text=t))


def delta_usage(output: int) -> Any:
    return E(type="message_delta", usage=E(output_tokens=output, input_tokens=None))


def chunk(content: str | None = None, usage: Any = None, tool_args: str | None = None) -> Any:
    calls = [E(function=E(arguments=tool_args))] if tool_args else None
    return E(
        object="chat.completion.chunk",
        model="gpt-x",
        choices=[E(delta=E(content=content, refusal=None, tool_calls=calls))] if usage is None else [],
        usage=usage,
    )


ROWS: list[tuple[str, list[Any], bool, tuple[int, int]]] = [
    # name, events, stream finished, (input charged, output counted)
    # Unless the provider refused (provider_refused): it may have run.
    ("nothing arrived: the gateway's count", [], False, (100, 0)),
    ("anthropic cut short, no usage yet: deltas", [start(), text("abcd"), text("abcdefgh")], False, (50, 3)),
    ("anthropic cumulative usage above the estimate wins", [start(), text("a"), delta_usage(40)], False, (50, 40)),
    ("anthropic completed: the final usage is the count", [start(), text("a" * 400), delta_usage(7), E(type="message_stop")], False, (50, 7)),
    ("anthropic cache tokens are input too", [start(10, cache_read=30, cache_creation=5)], False, (45, 1)),
    ("anthropic derived events are not counted twice", [start(), text("abcd"), E(type="text", text="abcd")], False, (50, 1)),
    ("openai cut short: counted input, deltas", [chunk(""), chunk("tok "), chunk("tok "), chunk(tool_args='{"a":1}')], False, (100, 4)),
    ("openai usage chunk ends it", [chunk("tok "), chunk(usage=E(prompt_tokens=120, completion_tokens=9))], False, (120, 9)),
    ("openai without usage, exhausted: the estimate", [chunk("tok "), chunk("tok ")], True, (100, 2)),
    ("openai stream-helper wrapper", [E(type="chunk", chunk=chunk("tok ")), E(type="content.delta")], False, (100, 1)),
]


@pytest.mark.parametrize(("name", "events", "finished", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_the_running_count(name: str, events: list[Any], finished: bool, expected: tuple[int, int]) -> None:
    meter = StreamMeter(counted_input_tokens=100)
    for event in events:
        meter.observe(event)
    if finished:
        meter.finished()
    assert (meter.input_tokens, meter.output_tokens) == expected
    assert meter.total_tokens == sum(expected)


def test_before_its_first_event_a_call_is_charged_its_count_unless_refused() -> None:
    """A stream that ended before any event may have run: the gateway's count
    is charged. A provider that answered an error status did not run: 0."""
    silent = StreamMeter(counted_input_tokens=80)
    assert (silent.input_tokens, silent.usage().reported_input_tokens, silent.usage().counted_input_tokens) == (80, None, 80)
    refused = StreamMeter(counted_input_tokens=80)
    refused.provider_refused()
    assert (refused.input_tokens, refused.usage().reported_input_tokens) == (0, 0)
    # Once the provider reported its input, that is the count either way.
    refused.observe(start(input_tokens=50))
    assert (refused.input_tokens, refused.usage().reported_input_tokens) == (50, 50)


@pytest.mark.parametrize(
    "model",
    ["Qwen2.5 7B Instruct (Q4_K_M)", "m" * 129, "", "modèle", "gpt-x\n", "a,b"],
)
def test_a_model_name_the_ledger_would_refuse_is_left_out(model: str) -> None:
    """The ledger refuses a settle whose usage names a model outside
    ``[A-Za-z0-9._:/@-]{1,128}`` (422): the model is left out, as the Rust
    client does, so an odd provider name never costs the hold."""
    assert Usage(model=model, output_tokens=5).to_json() == {"output_tokens": 5}
    meter = StreamMeter(counted_input_tokens=10)
    meter.observe(E(object="chat.completion.chunk", model=model, choices=[], usage=None))
    assert "model" not in meter.usage().to_json()


def test_a_model_name_the_ledger_accepts_is_sent() -> None:
    for model in ("claude-sonnet-4", "org/model:v1.5@2024_01", "m" * 128):
        assert Usage(model=model).to_json() == {"model": model}


def usage_of(meter: StreamMeter) -> dict[str, Any]:
    return meter.usage().to_json()


def test_cache_reads_are_reported_apart_from_the_input() -> None:
    """The ledger's ``reported_input_tokens`` leaves cache reads out and takes
    them in ``cache_read_input_tokens``, so a policy may exclude them.
    Anthropic: input + cache creation, and the reads; OpenAI: prompt tokens
    less the cached ones, and the cached ones. The charged input (the
    meter's ``input_tokens``, what a custom ``settle_units`` reads) is still
    all of it."""
    anthropic = StreamMeter(counted_input_tokens=100)
    anthropic.observe(start(10, cache_read=900, cache_creation=5))
    assert anthropic.input_tokens == 915
    assert usage_of(anthropic) == {
        "model": "claude-x",
        "output_tokens": 1,
        "counted_input_tokens": 100,
        "reported_input_tokens": 15,
        "cache_read_input_tokens": 900,
    }
    # A later cumulative report without the cache parts keeps them.
    anthropic.observe(E(type="message_delta", usage=E(output_tokens=50, input_tokens=10, cache_read_input_tokens=None)))
    assert (anthropic.input_tokens, usage_of(anthropic)["reported_input_tokens"], anthropic.output_tokens) == (915, 15, 50)
    openai = StreamMeter(counted_input_tokens=100)
    openai.observe(chunk(usage=E(prompt_tokens=1_000, completion_tokens=9, prompt_tokens_details=E(cached_tokens=900))))
    assert openai.input_tokens == 1_000
    assert usage_of(openai) == {
        "model": "gpt-x",
        "output_tokens": 9,
        "counted_input_tokens": 100,
        "reported_input_tokens": 100,
        "cache_read_input_tokens": 900,
    }
    # No cache details at all: nothing read from the cache is reported.
    plain = StreamMeter(counted_input_tokens=100)
    plain.observe(chunk(usage=E(prompt_tokens=120, completion_tokens=9, prompt_tokens_details=None)))
    assert "cache_read_input_tokens" not in usage_of(plain) and usage_of(plain)["reported_input_tokens"] == 120
