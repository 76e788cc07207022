"""The route-default ``max_tokens``: fill it into requests that arrive without
an output limit, so the reservation is exact input + ``max_tokens`` instead of
an estimate (the first seed: a config change turns the hard case into the easy
one).

Usage::

    req = await reservoir.fill_max_tokens("tenant-7", "chat", incoming)
    receipt = await reservoir.reserve("tenant-7", "chat",
        counted_input_tokens=n, max_tokens=requested_max_tokens(req))
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["OUTPUT_LIMIT_KEYS", "requested_max_tokens", "with_default_max_tokens"]

#: Keys under which the provider SDKs take an output limit: Anthropic's
#: ``max_tokens``, OpenAI chat's ``max_completion_tokens`` (and its older
#: ``max_tokens``).
OUTPUT_LIMIT_KEYS: tuple[str, ...] = ("max_tokens", "max_completion_tokens")


def requested_max_tokens(request: Mapping[str, Any]) -> int | None:
    """The output limit a provider request sets, if any."""
    for key in OUTPUT_LIMIT_KEYS:
        value = request.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def with_default_max_tokens(
    request: Mapping[str, Any], default_max_tokens: int | None, *, key: str = "max_tokens"
) -> dict[str, Any]:
    """A copy of ``request`` with ``default_max_tokens`` under ``key`` when the
    request sets no output limit (under any of :data:`OUTPUT_LIMIT_KEYS`) and a
    default exists. A limit the request sets is kept as it is."""
    if key not in OUTPUT_LIMIT_KEYS:
        raise ValueError(f"key must be one of {OUTPUT_LIMIT_KEYS}")
    filled = dict(request)
    if default_max_tokens is not None and requested_max_tokens(request) is None:
        filled[key] = default_max_tokens
    return filled
