"""Retry policy and the bookkeeping of one call's attempts (no I/O here).

A call is retried only in ways that cannot debit twice: every attempt sends the
same reservation id and the same body, so the server answers a repeat with the
receipt it already committed. What is retried: transport failures, 502/503/504,
and (only when asked for) 429 refusals whose ``Retry-After`` still fits in the
deadline. Delays are exponential with full jitter, never past the deadline.

Whether a failed attempt *may have been applied* is tracked: a refused
connection never reached the server, a read error after the request was sent
may have, and so may a write answered 502, 503 or 504 (a writer that
appended and was then fenced answers 503; a proxy whose read timeout is
shorter than the ledger's answer answers 502 or 504 after forwarding it).
Once any attempt may have been applied, running out of time ends in
:class:`~reservoir_client.errors.OutcomeUnknown` (``ReservationUnknown`` for a
reserve) rather than in a plain transport error.

An attempt that was never sent for a reason of the client's own is not a
sign of an unreachable ledger: a pool timeout (its connection pool stayed
full) is retried, and a request httpx refuses to encode
(``LocalProtocolError``) is not; either ends in
:class:`~reservoir_client.errors.RequestNotSent` unless some try failed to
connect (:class:`~reservoir_client.errors.LedgerUnreachable`, which a shard
book admits from).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import httpx

from .errors import (
    LedgerUnreachable,
    OutcomeUnknown,
    ProblemError,
    RequestNotSent,
    ReservationUnknown,
    ReservoirError,
)

__all__ = ["RetryPolicy"]

#: Statuses answered by the server or a proxy in front of it that say "not now".
RETRYABLE_STATUSES = frozenset({502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often one call is tried.

    ``deadline_s`` bounds the whole call, sleeps included; ``max_attempts``
    bounds the tries. Backoff before try *n* (0-based, n >= 1) is uniform in
    ``[0, min(max_backoff_s, initial_backoff_s * multiplier**(n-1))]`` (full
    jitter), raised to the server's ``Retry-After`` when it gave one.
    """

    deadline_s: float = 10.0
    max_attempts: int = 8
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    #: Also retry 429 refusals (insufficient capacity, debt) while their
    #: ``Retry-After`` fits in the deadline. Off by default: a gateway usually
    #: wants to pass the refusal on at once.
    retry_refusals: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.deadline_s <= 0 or self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("deadline and backoffs must be positive")


#: Errors raised before any byte of the request left: nothing was applied.
_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
)
#: Of those, the ones that say the ledger could not be reached.
_UNREACHABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)
#: Of those, the client's own: they tell nothing about the ledger.
CLIENT_SIDE = (httpx.PoolTimeout, httpx.LocalProtocolError)
#: Of those, the ones no retry can help: httpx refused to encode the request
#: (a header value with a newline, ...), and will again.
_UNSENDABLE = (httpx.LocalProtocolError,)


class Attempts:
    """The state of one call's tries; the sync and async clients drive it."""

    def __init__(
        self,
        policy: RetryPolicy,
        rng: random.Random,
        *,
        method: str,
        path: str,
        body: dict[str, object] | None,
        reservation_id: str | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.rng = rng
        self.clock = clock
        self.deadline = clock() + policy.deadline_s
        self.method = method
        self.path = path
        self.body = body
        self.reservation_id = reservation_id
        self.tries = 0
        self.maybe_applied = False
        #: Some try failed to connect to the ledger.
        self.unreachable = False
        self.last: BaseException | None = None

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock())

    def _backoff(self, floor_s: float | None) -> float | None:
        """The delay before the next try, or None when there is none to make."""
        if self.tries >= self.policy.max_attempts:
            return None
        cap = min(self.policy.max_backoff_s, self.policy.initial_backoff_s * self.policy.multiplier ** (self.tries - 1))
        delay = self.rng.uniform(0.0, cap)
        if floor_s is not None:
            delay = max(delay, floor_s)
        if delay >= self.remaining():
            return None
        return delay

    def transport_failed(self, exc: httpx.TransportError) -> float | None:
        self.tries += 1
        self.last = exc
        if not isinstance(exc, _NOT_SENT):
            self.maybe_applied = True
        if isinstance(exc, _UNREACHABLE):
            self.unreachable = True
        if isinstance(exc, _UNSENDABLE):
            return None
        return self._backoff(None)

    def answered(self, problem: ProblemError) -> float | None:
        """A definite answer; the delay before retrying it, or None to stop."""
        self.tries += 1
        self.last = problem
        # A ledger still recovering from its log answers 503 not_ready: it
        # decided nothing, and cannot now (as good as unreachable).
        not_ready = problem.status == 503 and problem.code == "not_ready"
        if not_ready:
            self.unreachable = True
        elif problem.status in RETRYABLE_STATUSES and self.method == "POST":
            # A writer that appended and was then fenced answers 503 (as the
            # Rust client reads it), a proxy that forwarded the request and
            # gave up waiting 502 or 504: the step may have happened.
            self.maybe_applied = True
        if problem.status in RETRYABLE_STATUSES:
            return self._backoff(problem.retry_after)
        if problem.status == 429 and self.policy.retry_refusals and problem.retry_after is not None:
            return self._backoff(problem.retry_after)
        return None

    def give_up(self) -> ReservoirError:
        """The error to raise when no more tries are made."""
        last = self.last
        if isinstance(last, ProblemError) and not self._unknown_after(last) and not self._not_ready_only():
            return last
        if self.maybe_applied:
            if (
                self.reservation_id is not None
                and self.body is not None
                and self.method == "POST"
                and self.path == "/v1/reservations"
            ):
                return ReservationUnknown(self.reservation_id, self.path, self.body, last)
            return OutcomeUnknown(self.method, self.path, self.body, last)
        if not self.unreachable:
            return RequestNotSent(self.method, self.path, last)
        return LedgerUnreachable(f"{self.method} {self.path}: ledger unreachable after {self.tries} tries ({last!r})")

    def _not_ready_only(self) -> bool:
        # Every answer said "recovering" (or no answer came): nothing applied.
        last = self.last
        return (
            self.unreachable
            and not self.maybe_applied
            and isinstance(last, ProblemError)
            and last.status == 503
            and last.code == "not_ready"
        )

    def _unknown_after(self, problem: ProblemError) -> bool:
        # A "not now" answer after an attempt that may have landed tells
        # nothing about that attempt; any other answer is about the id itself.
        return self.maybe_applied and problem.status in RETRYABLE_STATUSES
