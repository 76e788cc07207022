"""The running count of a provider stream: folds the official SDKs' stream
events into input and output token counts, without I/O.

Understood, by shape (the SDKs are not imported here):

- Anthropic (``client.messages.stream(...)`` or ``messages.create(stream=True)``):
  ``message_start`` (model, input tokens incl. cache creation, cache reads,
  initial output count), ``content_block_delta`` (text, tool-input JSON,
  thinking), ``message_delta`` (cumulative ``usage.output_tokens``),
  ``message_stop``. The SDK's derived events (``text``, ``input_json``, ...)
  repeat a raw delta and are not counted again.
- OpenAI chat completions (``chat.completions.create(stream=True,
  stream_options={"include_usage": True})``, or the ``chunk`` events of
  ``chat.completions.stream(...)``): ``chat.completion.chunk`` objects; the
  final one carries ``usage`` (prompt and completion tokens, and the cached
  prompt tokens in ``prompt_tokens_details``).

Cache reads are kept apart from the reported input, as the ledger takes them
(:class:`~reservoir_client.types.Usage`): Anthropic's ``input_tokens`` +
``cache_creation_input_tokens`` is the reported input and its
``cache_read_input_tokens`` the cache reads; OpenAI's ``prompt_tokens`` less
``cached_tokens`` the reported input and ``cached_tokens`` the cache reads.

Output tokens are the provider's cumulative usage where it sent one, and, where
it did not (yet), an estimate from the deltas streamed: OpenAI reports usage
only in its last chunk and Anthropic's last ``message_delta`` comes at the end,
so a stream cut short has nothing better. The estimate is
``estimate_tokens(delta_text)`` per delta (default: at least 1 token per
delta, 4 characters per token); pass a tokenizer for exact counts. While the
stream is incomplete the count is the larger of the two, so an interrupted
stream is never under-counted to a refund; once it completed, the provider's
final usage is the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .types import Usage

__all__ = ["StreamMeter", "default_estimate_tokens"]


def default_estimate_tokens(text: str) -> int:
    """At least one token per delta, about four characters per token."""
    return max(1, math.ceil(len(text) / 4))


def _int_attr(obj: Any, name: str) -> int | None:
    value = getattr(obj, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class StreamMeter:
    """What one provider stream has used so far."""

    counted_input_tokens: int
    estimate_tokens: Callable[[str], int] = default_estimate_tokens
    model: str | None = None
    #: Input the provider reported, cache reads not included (Anthropic: at
    #: ``message_start``).
    reported_input_tokens: int | None = None
    #: Prompt tokens the provider read from its cache, when it said.
    cache_read_input_tokens: int | None = None
    #: The provider's latest cumulative output count.
    reported_output_tokens: int | None = None
    #: Output estimated from the deltas streamed.
    estimated_output_tokens: int = 0
    #: The provider answered the call with an error status before streaming
    #: (a 429, a 400, a 5xx): it did not run, so no input is charged.
    refused: bool = False
    #: The stream reached its end (``message_stop``, OpenAI's usage chunk, or
    #: the iterator was exhausted).
    completed: bool = False
    events: int = field(default=0)
    _cache_creation_input_tokens: int = field(default=0, init=False, repr=False)

    # ------------------------------------------------------------ results

    @property
    def output_tokens(self) -> int:
        """The running output count."""
        if self.completed and self.reported_output_tokens is not None:
            return self.reported_output_tokens
        return max(self.reported_output_tokens or 0, self.estimated_output_tokens)

    @property
    def input_tokens(self) -> int:
        """Input to charge: the provider's count if it gave one (cache reads
        included, as a policy counts them by default), nothing if it refused
        the call, else the gateway's: a stream that ended before its first
        event for any other reason (a dropped connection, a timeout) may have
        run, and an unknown use is never counted as unused."""
        if self.reported_input_tokens is not None:
            return self.reported_input_tokens + (self.cache_read_input_tokens or 0)
        return 0 if self.refused else self.counted_input_tokens

    @property
    def total_tokens(self) -> int:
        """Input + output so far: what a stream ending now has used."""
        return self.input_tokens + self.output_tokens

    def provider_refused(self) -> None:
        """The provider answered the call with an error status before streaming."""
        self.refused = True

    def usage(self) -> Usage:
        """What the call used, for the settle. A provider that refused the
        request before streaming reports 0 input: the ledger then charges no
        input in any dimension, and no drift sample is made."""
        if self.refused and self.reported_input_tokens is None:
            return Usage(model=self.model, output_tokens=self.output_tokens, reported_input_tokens=0)
        return Usage(
            model=self.model,
            output_tokens=self.output_tokens,
            counted_input_tokens=self.counted_input_tokens,
            reported_input_tokens=self.reported_input_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens,
        )

    # ------------------------------------------------------------ folding

    def observe(self, event: Any) -> None:
        """Folds one event from either SDK's stream into the count."""
        self.events += 1
        if getattr(event, "object", None) == "chat.completion.chunk":
            self._openai_chunk(event)
            return
        kind = getattr(event, "type", None)
        if kind == "chunk" and getattr(getattr(event, "chunk", None), "object", None) == "chat.completion.chunk":
            self._openai_chunk(event.chunk)  # ChatCompletionStreamManager's wrapper
        elif kind == "message_start":
            self._anthropic_start(event)
        elif kind == "content_block_delta":
            self._count(self._anthropic_delta_text(getattr(event, "delta", None)))
        elif kind == "message_delta":
            self._anthropic_usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.completed = True

    def finished(self) -> None:
        """The stream's iterator ended without error."""
        self.completed = True

    def _count(self, text: str | None) -> None:
        if text:
            self.estimated_output_tokens += self.estimate_tokens(text)

    def _anthropic_start(self, event: Any) -> None:
        message = getattr(event, "message", None)
        model = getattr(message, "model", None)
        if isinstance(model, str):
            self.model = model
        usage = getattr(message, "usage", None)
        self._anthropic_usage(usage)

    def _anthropic_usage(self, usage: Any) -> None:
        if usage is None:
            return
        output = _int_attr(usage, "output_tokens")
        if output is not None:
            self.reported_output_tokens = max(output, self.reported_output_tokens or 0)
        # Cumulative totals: a later report replaces an earlier one (a part
        # it leaves out stays as reported before).
        creation = _int_attr(usage, "cache_creation_input_tokens")
        if creation is not None:
            self._cache_creation_input_tokens = creation
        read = _int_attr(usage, "cache_read_input_tokens")
        if read is not None:
            self.cache_read_input_tokens = read
        input_tokens = _int_attr(usage, "input_tokens")
        if input_tokens is not None:
            self.reported_input_tokens = input_tokens + self._cache_creation_input_tokens

    @staticmethod
    def _anthropic_delta_text(delta: Any) -> str | None:
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            return getattr(delta, "text", None)
        if kind == "input_json_delta":
            return getattr(delta, "partial_json", None)
        if kind == "thinking_delta":
            return getattr(delta, "thinking", None)
        return None

    def _openai_chunk(self, chunk: Any) -> None:
        model = getattr(chunk, "model", None)
        if isinstance(model, str) and model:
            self.model = model
        for choice in getattr(chunk, "choices", None) or ():
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            self._count(getattr(delta, "content", None))
            self._count(getattr(delta, "refusal", None))
            for call in getattr(delta, "tool_calls", None) or ():
                function = getattr(call, "function", None)
                self._count(getattr(function, "arguments", None))
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            completion = _int_attr(usage, "completion_tokens")
            prompt = _int_attr(usage, "prompt_tokens")
            if completion is not None:
                self.reported_output_tokens = completion
            if prompt is not None:
                # prompt_tokens includes the cached ones: the ledger takes them apart.
                cached = _int_attr(getattr(usage, "prompt_tokens_details", None), "cached_tokens")
                self.reported_input_tokens = max(0, prompt - (cached or 0))
                self.cache_read_input_tokens = cached
            # With include_usage the usage chunk is the stream's last.
            self.completed = True
