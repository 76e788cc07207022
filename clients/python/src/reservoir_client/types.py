"""Typed views of what the server answers: receipts, sizing, usage, partitions.

Every parser here is tolerant on purpose. The server grows (multi-dimension
limits are adding fields to receipts and refusals while this client is
written), so unknown fields are kept in ``extra`` rather than rejected, and
fields that older or newer servers may omit are optional.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = [
    "LEDGER_SOURCE_TERMS",
    "LEDGER_DESTINATION_TERMS",
    "DimensionReceipt",
    "LogPosition",
    "PartitionView",
    "Receipt",
    "SizingReceipt",
    "Usage",
    "WouldRefuse",
]

#: The left side of the conservation equation, as ``GET /v1/partitions`` names it.
LEDGER_SOURCE_TERMS: tuple[str, ...] = (
    "opening_units",
    "minted_units",
    "reminted_units",
    "moved_in_units",
    "overdraft_issued_units",
)
#: The right side.
LEDGER_DESTINATION_TERMS: tuple[str, ...] = (
    "available_units",
    "reserved_units",
    "spent_units",
    "retired_for_emergency_units",
    "overdraft_repaid_units",
    "moved_out_units",
)

#: Reservation states after which nothing changes any more.
TERMINAL_STATES = frozenset({"SETTLED", "SETTLED_WITH_DEBT", "RELEASED", "EXPIRED"})


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    return value


def _opt_int(value: Any, name: str) -> int | None:
    return None if value is None else _int(value, name)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _rest(body: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in known}


@dataclass(frozen=True)
class LogPosition:
    """Where the server's log committed the event a receipt reflects."""

    log_partition: int
    offset: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> LogPosition:
        return cls(
            log_partition=_int(body.get("log_partition"), "log_partition"),
            offset=_int(body.get("offset"), "offset"),
        )


@dataclass(frozen=True)
class SizingReceipt:
    """How the server sized a reserve sent without ``units``:
    ``units = input_units + output_units``; ``rule`` is one of ``max_tokens``,
    ``route_default_max_tokens``, ``route_quantile``, ``sibling_quantile``,
    ``cold_ceiling`` (or a rule a newer server added)."""

    rule: str
    units: int
    input_units: int
    output_units: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset({"rule", "units", "input_units", "output_units"})

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> SizingReceipt:
        return cls(
            rule=str(body.get("rule")),
            units=_int(body.get("units"), "sizing.units"),
            input_units=_int(body.get("input_units"), "sizing.input_units"),
            output_units=_int(body.get("output_units"), "sizing.output_units"),
            extra=_rest(body, cls._KNOWN),
        )


@dataclass(frozen=True)
class DimensionReceipt:
    """A reservation's amounts in one further dimension of its policy
    (``input_tokens``, ``output_tokens``, ``requests`` or ``tokens``); the
    receipt's own fields are the primary dimension's."""

    dimension: str
    reserved_units: int
    held_units: int
    actual_units: int | None = None
    overdraft_units: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    _KNOWN = frozenset({"dimension", "reserved_units", "held_units", "actual_units", "overdraft_units"})

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> DimensionReceipt:
        return cls(
            dimension=str(body.get("dimension")),
            reserved_units=_int(body.get("reserved_units"), "dimensions[].reserved_units"),
            held_units=_int(body.get("held_units", 0), "dimensions[].held_units"),
            actual_units=_opt_int(body.get("actual_units"), "dimensions[].actual_units"),
            overdraft_units=_int(body.get("overdraft_units", 0), "dimensions[].overdraft_units"),
            extra=_rest(body, cls._KNOWN),
        )


@dataclass(frozen=True)
class WouldRefuse:
    """In shadow mode, what enforcement would have refused: ``reason`` is the
    problem type it would have answered (``insufficient_capacity``,
    ``debt_outstanding``, ``request_too_large``), ``dimension`` where."""

    reason: str
    dimension: str | None = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> WouldRefuse:
        return cls(reason=str(body.get("reason")), dimension=_opt_str(body.get("dimension")))


@dataclass(frozen=True)
class Receipt:
    """A reservation as the server committed it.

    ``created`` is True when this very call created the reservation (HTTP 201)
    and False when the server answered an earlier call's receipt again (HTTP
    200: a retry with the same id, no second debit).
    """

    id: str
    subject: str
    route: str
    state: str
    reserved_units: int
    held_units: int
    accounting_epoch: str | None = None
    policy_generation: int | None = None
    actual_units: int | None = None
    operation_id: str | None = None
    expires_at_ms: int | None = None
    sizing: SizingReceipt | None = None
    log_position: LogPosition | None = None
    #: The policy's further dimensions (empty for a one-dimension policy).
    dimensions: tuple[DimensionReceipt, ...] = ()
    #: ``enforce``, or ``shadow`` when the policy only records verdicts.
    mode: str = "enforce"
    would_refuse: WouldRefuse | None = None
    created: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The answer's rate-limit headers (``ratelimit``, ``ratelimit-policy``,
    #: ``x-ratelimit-{limit,remaining,reset}-<dimension>``, names in lower
    #: case), for a gateway to pass on to its own clients; empty on a receipt
    #: from a shard book. The subject's numbers at the time of the answer,
    #: not the reservation's, so not compared.
    rate_limits: Mapping[str, str] = field(default_factory=dict, compare=False)

    _KNOWN = frozenset(
        {
            "id",
            "subject",
            "route",
            "state",
            "reserved_units",
            "held_units",
            "accounting_epoch",
            "policy_generation",
            "actual_units",
            "operation_id",
            "expires_at_ms",
            "sizing",
            "log_position",
            "dimensions",
            "mode",
            "would_refuse",
        }
    )

    @property
    def terminal(self) -> bool:
        """Whether the reservation can no longer change."""
        return self.state in TERMINAL_STATES

    @classmethod
    def from_json(
        cls, body: Mapping[str, Any], *, created: bool = False, rate_limits: Mapping[str, str] | None = None
    ) -> Receipt:
        sizing = body.get("sizing")
        position = body.get("log_position")
        refuse = body.get("would_refuse")
        return cls(
            id=str(body.get("id")),
            subject=str(body.get("subject")),
            route=str(body.get("route")),
            state=str(body.get("state")),
            reserved_units=_int(body.get("reserved_units"), "reserved_units"),
            held_units=_int(body.get("held_units", 0), "held_units"),
            accounting_epoch=_opt_str(body.get("accounting_epoch")),
            policy_generation=_opt_int(body.get("policy_generation"), "policy_generation"),
            actual_units=_opt_int(body.get("actual_units"), "actual_units"),
            operation_id=_opt_str(body.get("operation_id")),
            expires_at_ms=_opt_int(body.get("expires_at_ms"), "expires_at_ms"),
            sizing=SizingReceipt.from_json(sizing) if isinstance(sizing, Mapping) else None,
            log_position=LogPosition.from_json(position) if isinstance(position, Mapping) else None,
            dimensions=tuple(
                DimensionReceipt.from_json(d) for d in body.get("dimensions") or () if isinstance(d, Mapping)
            ),
            mode=str(body.get("mode", "enforce")),
            would_refuse=WouldRefuse.from_json(refuse) if isinstance(refuse, Mapping) else None,
            created=created,
            extra=_rest(body, cls._KNOWN),
            rate_limits=dict(rate_limits or {}),
        )


#: What the ledger accepts as a usage's model (its id rule); it refuses a
#: settle naming any other model with 422.
_MODEL_ID = re.compile(r"[A-Za-z0-9._:/@-]{1,128}")


def _valid_model(model: str) -> bool:
    """Whether the ledger accepts ``model`` as a usage's model: 1 to 128 of
    ``A-Z a-z 0-9 . _ : / @ -``."""
    return _MODEL_ID.fullmatch(model) is not None


@dataclass(frozen=True)
class Usage:
    """What a call used, sent with a settle so the route's output estimates and
    input drift learn from it; without ``actual_units`` the ledger derives
    every dimension from it.

    ``reported_input_tokens`` is the provider's input count without cache
    reads (Anthropic: ``input_tokens`` + ``cache_creation_input_tokens``;
    OpenAI: ``prompt_tokens`` less ``prompt_tokens_details.cached_tokens``),
    ``cache_read_input_tokens`` the prompt tokens read from the provider's
    cache: the ledger counts them as input unless the policy sets
    ``exclude_cache_read_input_tokens``. A ``model`` the ledger would refuse
    (anything but 1 to 128 of ``A-Z a-z 0-9 . _ : / @ -``, e.g. a local
    server's ``"Qwen2.5 7B Instruct (Q4_K_M)"``) is left out of the body, as
    the Rust client does, so the settle still goes through."""

    model: str | None = None
    output_tokens: int | None = None
    counted_input_tokens: int | None = None
    reported_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        model = self.model if self.model is not None and _valid_model(self.model) else None
        return {
            k: v
            for k, v in (
                ("model", model),
                ("output_tokens", self.output_tokens),
                ("counted_input_tokens", self.counted_input_tokens),
                ("reported_input_tokens", self.reported_input_tokens),
                ("cache_read_input_tokens", self.cache_read_input_tokens),
            )
            if v is not None
        }


@dataclass(frozen=True)
class PartitionView:
    """One ledger partition from ``GET /v1/partitions``: its key, every term
    (``terms``, by the server's names) and the server's own check."""

    subject: str
    route: str
    accounting_epoch: str
    policy_generation: int
    conservation: str
    terms: Mapping[str, int]
    raw: Mapping[str, Any]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> PartitionView:
        terms = {
            k: v
            for k, v in body.items()
            if k.endswith("_units") and isinstance(v, int) and not isinstance(v, bool)
        }
        return cls(
            subject=str(body.get("subject")),
            route=str(body.get("route")),
            accounting_epoch=str(body.get("accounting_epoch")),
            policy_generation=_int(body.get("policy_generation"), "policy_generation"),
            conservation=str(body.get("conservation")),
            terms=terms,
            raw=dict(body),
        )

    @property
    def sources(self) -> int:
        """Opening + minted + reminted + moved in + overdraft issued."""
        return sum(self.terms.get(t, 0) for t in LEDGER_SOURCE_TERMS)

    @property
    def destinations(self) -> int:
        """Available + reserved + spent + retired + overdraft repaid + moved out."""
        return sum(self.terms.get(t, 0) for t in LEDGER_DESTINATION_TERMS)
