"""Exceptions: the server's problem+json answers, and the three ways a call can
end without one (the answer was lost, the ledger was never reached, or the
client could not send the request at all).

Every problem+json answer becomes a :class:`ProblemError` (or the subclass for
its code) carrying the problem's ``type``, ``code`` (the last segment of the
type URI), ``status``, ``detail``, ``retry_after`` (seconds, from the
``Retry-After`` header or the body's ``retry_after_ms``), ``limiting_dimension``
(which bucket refused; absent on servers or answers that do not name one) and
the full body, so fields a newer server adds are not lost.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = [
    "PROBLEM_BASE",
    "CapacityRefused",
    "IdempotencyConflict",
    "InvalidRequest",
    "LedgerUnreachable",
    "NoPolicy",
    "OutcomeUnknown",
    "ProblemError",
    "RequestNotSent",
    "RequestTooLarge",
    "ReservationUnknown",
    "ReservoirError",
    "Unavailable",
    "Forbidden",
    "Unauthorized",
    "UnknownReservation",
    "WrongState",
    "problem_from_response",
]

PROBLEM_BASE = "https://reservoir.dev/problems/"


class ReservoirError(Exception):
    """Base of every error this client raises."""

    #: Set on an error ``issue_shard`` raised once the issue may have been
    #: sent: the shard id to repeat it with (the ledger answers the shard it
    #: issued under that id; another id would issue a second one).
    shard_id: str | None = None


class ProblemError(ReservoirError):
    """The server answered with an RFC 9457 problem (any non-2xx status)."""

    def __init__(
        self,
        *,
        status: int,
        type: str,
        title: str = "",
        detail: str = "",
        retry_after: float | None = None,
        limiting_dimension: str | None = None,
        policy_generation: int | None = None,
        retryable: bool | None = None,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.retry_after = retry_after
        self.limiting_dimension = limiting_dimension
        self.policy_generation = policy_generation
        self.retryable = retryable if retryable is not None else status in (429, 502, 503, 504)
        self.body: Mapping[str, Any] = dict(body or {})
        self.headers: Mapping[str, str] = dict(headers or {})
        super().__init__(f"{status} {self.code}: {detail or title}")

    @property
    def code(self) -> str:
        """The problem code, e.g. ``insufficient_capacity``."""
        return self.type[len(PROBLEM_BASE) :] if self.type.startswith(PROBLEM_BASE) else self.type


class CapacityRefused(ProblemError):
    """429: not enough capacity now (``insufficient_capacity``), admission
    suspended while debt is outstanding (``debt_outstanding``), or too many
    open reservations (``open_reservations_limit``). Nothing was reserved;
    ``retry_after`` says when trying again may help."""


class RequestTooLarge(ProblemError):
    """422 ``request_too_large``: no policy state would ever admit it."""


class IdempotencyConflict(ProblemError):
    """The id is taken by a different request (``exists_with_different_*``)."""


class InvalidRequest(ProblemError):
    """422/400/413: the request itself is wrong (ids, values, body)."""


class Unauthorized(ProblemError):
    """401: no bearer token, or one the ledger does not know (``token=`` of
    the client; ``reservoir token create`` makes one). Not retried."""


class Forbidden(ProblemError):
    """403: the token lacks the scope for this call, or the subject (tenant)
    named is not one of the token's. Not retried."""


class UnknownReservation(ProblemError):
    """404 ``unknown_reservation``: the server has no reservation of that id."""


class NoPolicy(ProblemError):
    """404 ``no_policy``: nothing is published for the subject and route."""


class WrongState(ProblemError):
    """409: the reservation's state does not allow the step (``wrong_state``,
    ``lease_expired``, ``generation_closed``, ...)."""


class Unavailable(ProblemError):
    """503: the log is unavailable or the server still recovering; retrying
    with the same id is safe (and what the client does within its deadline)."""


class OutcomeUnknown(ReservoirError):
    """A request reached the server (or may have) but no answer came back
    before the retry deadline: the step may or may not have been applied.
    Asking again with the same id resolves it; the id is never replaced."""

    def __init__(self, method: str, path: str, body: Mapping[str, Any] | None, cause: BaseException | None) -> None:
        self.method = method
        self.path = path
        self.request_body: Mapping[str, Any] | None = body
        self.cause = cause
        super().__init__(f"{method} {path}: outcome unknown ({cause!r})")


class ReservationUnknown(OutcomeUnknown):
    """RESERVATION_UNKNOWN: a reserve whose answer was lost. ``reservation_id``
    is the id the reserve was sent with; ``Reservoir.resolve`` (or simply
    calling ``reserve`` again with the same id and inputs) turns it into the
    receipt the server committed, or reserves it now if the first try never
    landed, without a second debit either way."""

    def __init__(self, reservation_id: str, path: str, body: Mapping[str, Any], cause: BaseException | None) -> None:
        self.reservation_id = reservation_id
        super().__init__("POST", path, body, cause)


class LedgerUnreachable(ReservoirError):
    """No attempt reached the server, and one failed to connect to it
    (connection refused, DNS, connect timeout): nothing was applied. The
    caller decides whether to fail open or closed; a client with a shard book
    admits from a shard."""


class RequestNotSent(ReservoirError):
    """The client gave up without sending the request, for a reason of its
    own rather than an unreachable ledger: its connection pool stayed full
    until the deadline (``httpx.PoolTimeout``, retried meanwhile), or httpx
    refused to encode the request (``httpx.LocalProtocolError``, e.g. a
    header value with a newline; not retried). Nothing was applied, and no
    shard is used. ``cause`` is the last httpx error."""

    def __init__(self, method: str, path: str, cause: BaseException | None) -> None:
        self.method = method
        self.path = path
        self.cause = cause
        super().__init__(f"{method} {path}: not sent ({cause!r})")


_BY_CODE: dict[str, type[ProblemError]] = {
    "insufficient_capacity": CapacityRefused,
    "debt_outstanding": CapacityRefused,
    "open_reservations_limit": CapacityRefused,
    "request_too_large": RequestTooLarge,
    "exists_with_different_digest": IdempotencyConflict,
    "exists_with_different_operation_id": IdempotencyConflict,
    "exists_with_different_actual_units": IdempotencyConflict,
    "exists_with_different_fields": IdempotencyConflict,
    "unknown_reservation": UnknownReservation,
    "no_policy": NoPolicy,
    "unavailable": Unavailable,
    "not_ready": Unavailable,
}


def _class_for(code: str, status: int) -> type[ProblemError]:
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code.startswith("exists_with_different"):
        return IdempotencyConflict
    if status == 401:
        return Unauthorized
    if status == 403:
        return Forbidden
    if status == 429:
        return CapacityRefused
    if status == 503:
        return Unavailable
    if status == 409:
        return WrongState
    if status in (400, 413, 415, 422):
        return InvalidRequest
    return ProblemError


def _retry_after_header(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: the server sends seconds, a proxy might not
    return seconds if seconds >= 0 else None


def problem_from_response(status: int, headers: Mapping[str, str], content: bytes) -> ProblemError:
    """The exception for a non-2xx answer, whatever its body turned out to be."""
    body: dict[str, Any] = {}
    try:
        parsed = json.loads(content) if content else {}
        if isinstance(parsed, dict):
            body = parsed
    except ValueError:
        body = {"detail": content[:500].decode("utf-8", "replace")}
    problem_type = str(body.get("type") or f"about:blank#{status}")
    code = problem_type[len(PROBLEM_BASE) :] if problem_type.startswith(PROBLEM_BASE) else problem_type
    lower = {k.lower(): v for k, v in headers.items()}
    retry_after = _retry_after_header(lower.get("retry-after"))
    retry_after_ms = body.get("retry_after_ms")
    if isinstance(retry_after_ms, int) and not isinstance(retry_after_ms, bool):
        # The body is exact; the header is rounded up to whole seconds.
        retry_after = retry_after_ms / 1000.0
    generation = body.get("policy_generation")
    retryable = body.get("retryable")
    dimension = body.get("limiting_dimension")
    cls = _class_for(code, status)
    return cls(
        status=status,
        type=problem_type,
        title=str(body.get("title") or ""),
        detail=str(body.get("detail") or ""),
        retry_after=retry_after,
        limiting_dimension=str(dimension) if dimension is not None else None,
        policy_generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else None,
        retryable=retryable if isinstance(retryable, bool) else None,
        body=body,
        headers=dict(headers),
    )
