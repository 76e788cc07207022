"""The running count alone, one row per case: which events count, what the
count is when the stream completed and when it was cut short. Events are
plain objects shaped like the SDKs' (the meter reads attributes only)."""

from __future__ import annotations

from types import SimpleNamespace as E
from typing import Any

import pytest

from reservoir_client import StreamMeter


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
