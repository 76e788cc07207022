"""The clients: :class:`Reservoir` (blocking) and :class:`AsyncReservoir`
(asyncio/trio through anyio), one method per server step, on httpx.

Both share :class:`_Protocol`, which builds every request and parses every
answer, so the two differ only in how they wait. Every step is retried under
the client's :class:`~reservoir_client.retry.RetryPolicy` with the same id and
body on every try; see :mod:`reservoir_client.retry` for what is retried.

Bearer tokens: ``token=`` is sent as ``Authorization: Bearer <token>`` on every
request; the ledger's 401 and 403 are :class:`~reservoir_client.errors.Unauthorized`
and :class:`~reservoir_client.errors.Forbidden`. Whitespace around the token
(the newline of a token read from a file) is stripped; a token that is then
empty or holds anything but visible ASCII is refused with ``ValueError``
when the client is made.

Emergency shards: with ``fallback=`` a :class:`~reservoir_client.shards.ShardBook`,
a reserve that reached no ledger (:class:`~reservoir_client.errors.LedgerUnreachable`)
is admitted from a shard if one fits; its receipt names the shard in
``extra["local_shard_id"]``, and its ``start``, ``settle``, ``release`` and
``get_reservation`` stay in the book. ``issue_shard`` and ``reconcile_shard``
ask the ledger for a shard and give its unused units back. A pool timeout or
a request httpx will not send is :class:`~reservoir_client.errors.RequestNotSent`,
never admitted from a shard.

Cluster mode: with ``cluster_nodes=``, every try goes to the owner learnt for
its subject/route or reservation (:mod:`reservoir_client.owners`), else to the
configured URL.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import replace
from typing import Any, Mapping, Sequence
from urllib.parse import quote

import anyio
import httpx

from .errors import LedgerUnreachable, ProblemError, ReservationUnknown, problem_from_response
from .max_tokens import with_default_max_tokens
from .owners import SERVED_BY, Owners
from .retry import CLIENT_SIDE, RETRYABLE_STATUSES, Attempts, RetryPolicy
from .shards import ReconcileOutcome, ShardBook, ShardDocument
from .types import PartitionView, Receipt, Usage

__all__ = ["AsyncReservoir", "Reservoir", "new_reservation_id"]

DEFAULT_TIMEOUT_S = 5.0
#: How long a route's default ``max_tokens`` is cached before asking again.
DEFAULT_POLICY_CACHE_TTL_S = 60.0


def new_reservation_id() -> str:
    """A fresh reservation id (``rsv-`` and 32 hex digits)."""
    return f"rsv-{uuid.uuid4().hex}"


def _seg(value: str) -> str:
    """One path segment, with ``/`` and everything else percent-encoded."""
    return quote(value, safe="")


def _bearer(token: str) -> str:
    """The ``Authorization`` value for ``token``, stripped of the whitespace
    around it (a token file ends with a newline). Anything but visible ASCII
    left inside cannot be sent in a header (httpx would refuse every try);
    it is refused here, at once."""
    stripped = token.strip()
    if not stripped:
        raise ValueError("token is empty (pass token=None for a ledger without authentication)")
    bad = next((c for c in stripped if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ValueError(
            f"token contains {bad!r} at {stripped.index(bad)}: only visible ASCII can be sent as a bearer token"
        )
    return f"Bearer {stripped}"


class _Request:
    """One step's request. ``reservation_id`` is set on a reserve (its
    errors name it); ``about`` is the reservation a step is about and
    ``route`` a reserve's subject/route (where a cluster client sends it);
    ``ends`` marks a settle or release (nothing more goes to its owner)."""

    __slots__ = ("method", "path", "body", "reservation_id", "headers", "about", "route", "ends")

    def __init__(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        reservation_id: str | None = None,
        headers: dict[str, str] | None = None,
        about: str | None = None,
        route: tuple[str, str] | None = None,
        ends: bool = False,
    ) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.reservation_id = reservation_id
        self.headers = headers or {}
        self.about = about or reservation_id
        self.route = route
        self.ends = ends


class _Protocol:
    """Request building and answer parsing shared by both clients (no I/O)."""

    def __init__(
        self,
        *,
        token: str | None,
        retry: RetryPolicy,
        rng: random.Random | None,
        policy_cache_ttl_s: float,
        cluster_nodes: Sequence[str] | None = None,
    ) -> None:
        self.retry = retry
        self.rng = rng or random.Random()
        self.headers = {"accept": "application/json"}
        if token is not None:
            self.headers["authorization"] = _bearer(token)
        self.policy_cache_ttl_s = policy_cache_ttl_s
        self._max_tokens_cache: dict[tuple[str, str], tuple[float, int | None]] = {}
        self.fallback: ShardBook | None = None
        self.owners = Owners(cluster_nodes) if cluster_nodes else None

    def attempts(self, request: _Request) -> Attempts:
        return Attempts(
            self.retry,
            self.rng,
            method=request.method,
            path=request.path,
            body=request.body,
            reservation_id=request.reservation_id,
        )

    @staticmethod
    def reserve(
        subject: str,
        route: str,
        *,
        reservation_id: str | None,
        units: int | None,
        counted_input_tokens: int | None,
        max_tokens: int | None,
    ) -> _Request:
        if units is None and counted_input_tokens is None:
            raise ValueError("give units, or counted_input_tokens (and max_tokens) for the server to size it")
        if units is not None and (counted_input_tokens is not None or max_tokens is not None):
            raise ValueError("give units, or counted_input_tokens and max_tokens, not both")
        rid = reservation_id or new_reservation_id()
        body: dict[str, Any] = {"id": rid, "subject": subject, "route": route}
        if units is not None:
            body["units"] = units
        else:
            body["counted_input_tokens"] = counted_input_tokens
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
        return _Request(
            "POST",
            "/v1/reservations",
            body,
            reservation_id=rid,
            headers={"idempotency-key": rid},
            route=(subject, route),
        )

    @staticmethod
    def start(reservation_id: str, operation_id: str) -> _Request:
        return _Request(
            "POST", f"/v1/reservations/{_seg(reservation_id)}/start", {"operation_id": operation_id}, about=reservation_id
        )

    @staticmethod
    def settle(reservation_id: str, actual_units: int | None, operation_id: str | None, usage: Usage | None) -> _Request:
        if actual_units is not None and actual_units < 0:
            raise ValueError("actual_units must not be negative")
        if actual_units is None and usage is None:
            raise ValueError("give actual_units, or usage for the ledger to derive every dimension from")
        body: dict[str, Any] = {}
        if actual_units is not None:
            body["actual_units"] = actual_units
        if operation_id is not None:
            body["operation_id"] = operation_id
        if usage is not None:
            body["usage"] = usage.to_json()
        return _Request("POST", f"/v1/reservations/{_seg(reservation_id)}/settle", body, about=reservation_id, ends=True)

    @staticmethod
    def release(reservation_id: str) -> _Request:
        return _Request("POST", f"/v1/reservations/{_seg(reservation_id)}/release", {}, about=reservation_id, ends=True)

    @staticmethod
    def get_reservation(reservation_id: str) -> _Request:
        return _Request("GET", f"/v1/reservations/{_seg(reservation_id)}", about=reservation_id)

    @staticmethod
    def policy(subject: str, route: str) -> _Request:
        return _Request("GET", f"/v1/policies/{_seg(subject)}/{_seg(route)}")

    @staticmethod
    def partitions() -> _Request:
        return _Request("GET", "/v1/partitions")

    def target(self, request: _Request) -> tuple[str | None, str]:
        """The owner a request goes to (``None``: the configured URL), and its URL."""
        owner = None if self.owners is None else self.owners.of(request.about, request.route)
        return owner, request.path if owner is None else owner + request.path

    def learn(
        self,
        request: _Request,
        asked: str | None,
        response: httpx.Response | None,
        error: httpx.TransportError | None = None,
    ) -> None:
        """What an exchange at ``asked`` teaches: a reserve the ledger decided
        (anything but 502/503/504, which decide nothing) starts the shard
        book's count of consecutive failures again; the owner maps learn the
        owner (see :mod:`.owners`). A try the client never sent for a reason
        of its own (a pool timeout, a request httpx refuses) teaches nothing."""
        if response is None and isinstance(error, CLIENT_SIDE):
            return
        decided = response is not None and response.status_code not in RETRYABLE_STATUSES
        if self.fallback is not None and decided and request.route is not None:
            self.fallback.note_ledger_reachable()
        if self.owners is None:
            return
        status = None if response is None else response.status_code
        served_by = None if response is None else response.headers.get(SERVED_BY)
        self.owners.learn(request.about, request.route, asked, status, served_by)
        if request.ends and request.about is not None and response is not None and response.is_success:
            self.owners.ended(request.about)

    def http_kwargs(self, request: _Request, attempts: Attempts, timeout_s: float) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "headers": {**self.headers, **request.headers},
            "timeout": max(0.001, min(timeout_s, attempts.remaining())),
        }
        if request.body is not None:
            kwargs["json"] = request.body
        return kwargs

    @staticmethod
    def problem(response: httpx.Response) -> ProblemError:
        return problem_from_response(response.status_code, dict(response.headers), response.content)

    @staticmethod
    def receipt(response: httpx.Response) -> Receipt:
        limits = {
            name: value
            for name, value in response.headers.items()
            if name.startswith(("ratelimit", "x-ratelimit-"))
        }
        return Receipt.from_json(response.json(), created=response.status_code == 201, rate_limits=limits)

    @staticmethod
    def policy_body(response: httpx.Response) -> dict[str, Any]:
        body = response.json()
        if not isinstance(body, dict):
            raise ValueError(f"/v1/policies: expected an object, got {type(body).__name__}")
        return body

    @staticmethod
    def partition_views(response: httpx.Response) -> list[PartitionView]:
        body = response.json()
        if not isinstance(body, list):
            raise ValueError(f"/v1/partitions: expected a list, got {type(body).__name__}")
        return [PartitionView.from_json(p) for p in body]

    @staticmethod
    def default_max_tokens(active_policy: Mapping[str, Any]) -> int | None:
        estimator = active_policy.get("estimator")
        if not isinstance(estimator, Mapping):
            return None
        value = estimator.get("default_max_tokens")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def cached_max_tokens(self, subject: str, route: str) -> tuple[bool, int | None]:
        hit = self._max_tokens_cache.get((subject, route))
        if hit is not None and time.monotonic() - hit[0] < self.policy_cache_ttl_s:
            return True, hit[1]
        return False, None

    def cache_max_tokens(self, subject: str, route: str, value: int | None) -> None:
        self._max_tokens_cache[(subject, route)] = (time.monotonic(), value)

    # Emergency shards: the book's side of each step (no I/O).

    def book(self) -> ShardBook:
        if self.fallback is None:
            raise ValueError("this client has no shard book: pass fallback=ShardBook(...)")
        return self.fallback

    def local_reserve(self, unreachable: LedgerUnreachable, request: _Request) -> Receipt:
        """A reserve that reached no ledger, admitted from a shard, or the
        ``LedgerUnreachable`` again (fail closed)."""
        body = request.body or {}
        rid = request.reservation_id
        if self.fallback is None or rid is None:
            raise unreachable
        held = self.fallback.reserve(
            rid,
            body["subject"],
            body["route"],
            units=body.get("units"),
            counted_input_tokens=body.get("counted_input_tokens"),
            max_tokens=body.get("max_tokens"),
        )
        if held is None:
            raise unreachable
        shard_id, units = held
        receipt = Receipt(
            id=rid,
            subject=body["subject"],
            route=body["route"],
            state="RESERVED",
            reserved_units=units,
            held_units=units,
            created=True,
            extra={"local_shard_id": shard_id},
        )
        self.fallback.keep_receipt(receipt)
        return receipt

    def local_step(
        self,
        reservation_id: str,
        step: str,
        *,
        operation_id: str | None = None,
        actual_units: int | None = None,
        usage: Usage | None = None,
    ) -> Receipt | None:
        """``step`` (start, settle, release, get) of a reservation admitted
        from a shard: its new local receipt, or ``None`` if it is not local.
        A repeat of the step that ended it answers that receipt again."""
        book = self.fallback
        receipt = None if book is None else book.local_receipt(reservation_id)
        if book is None or receipt is None:
            return None
        ends = {"settle": "SETTLED", "release": "RELEASED"}
        if step == "get" or (receipt.terminal and ends.get(step) == receipt.state):
            return receipt
        # As on the ledger: release gives back a call that never started.
        allowed = {"start": ("RESERVED",), "settle": ("RESERVED", "STARTED"), "release": ("RESERVED",)}
        if receipt.state not in allowed[step]:
            raise ValueError(f"local reservation {reservation_id} is {receipt.state}: cannot {step}")
        ended = True
        if step == "start":
            new = replace(receipt, state="STARTED", operation_id=operation_id, created=False)
        elif step == "settle":
            used = actual_units
            if used is None:
                if usage is None:
                    raise ValueError("give actual_units, or usage to count the units from")
                # As the ledger counts it: a reported 0 is a count, not a missing one.
                reported = usage.reported_input_tokens
                input_tokens = reported if reported is not None else (usage.counted_input_tokens or 0)
                used = book.units_used(
                    reservation_id, input_tokens, usage.output_tokens or 0, usage.cache_read_input_tokens or 0
                )
            ended = book.settle(reservation_id, used)
            new = replace(receipt, state="SETTLED", actual_units=used, held_units=0, created=False)
        else:
            ended = book.release(reservation_id)
            new = replace(receipt, state="RELEASED", held_units=0, created=False)
        if not ended:
            # Marked usage-unknown in the book meanwhile: its hold stays retired.
            raise ValueError(f"local reservation {reservation_id} is no longer open in the shard book")
        book.keep_receipt(new)
        return new

    def issue_shard(self, subject: str, route: str, units: int, ttl_ms: int, shard_id: str | None) -> _Request:
        book = self.book()
        sid = shard_id or f"sh-{uuid.uuid4().hex}"
        body = {
            "subject": subject,
            "route": route,
            "units": units,
            "gateway_id": book.gateway_id,
            "gateway_boot_epoch": book.boot_epoch,
            "ttl_ms": ttl_ms,
            "shard_id": sid,
        }
        return _Request("POST", "/v1/shards", body)

    @staticmethod
    def issue_failed(request: _Request, error: Exception) -> None:
        """An issue that failed once it may have been sent: ``error`` names
        the shard id it was sent with (``error.shard_id``, and a note), so
        the caller can repeat it with that id (the ledger answers the same
        document; a new id would retire ``units`` a second time)."""
        shard_id = (request.body or {}).get("shard_id")
        try:
            setattr(error, "shard_id", shard_id)
        except AttributeError:  # pragma: no cover - an exception with __slots__
            pass
        note = getattr(error, "add_note", None)  # Python 3.11+
        if callable(note):
            note(f"issue_shard: repeat with shard_id={shard_id!r}: the shard may have been issued")

    def install_issued(self, response: httpx.Response, active_policy: Mapping[str, Any]) -> ShardDocument:
        """The issued shard into the book, in the unit of the policy it was
        carved under (tokens, the conservative reading, if the active policy
        is already another generation)."""
        document = ShardDocument.from_json(response.json())
        policy = active_policy.get("policy")
        same = isinstance(policy, Mapping) and policy.get("generation") == document.policy_generation
        unit = policy.get("capacity_unit") if same and isinstance(policy, Mapping) else "tokens"
        return self.book().install(
            document,
            capacity_unit="requests" if unit == "requests" else "tokens",
            default_max_tokens=self.default_max_tokens(active_policy) if same else None,
            exclude_cache_reads=same and isinstance(policy, Mapping) and policy.get("exclude_cache_read_input_tokens") is True,
        )

    def begin_reconcile(self, shard_id: str) -> ReconcileOutcome | _Request:
        begun = self.book().begin_reconcile(shard_id)
        if isinstance(begun, ReconcileOutcome):
            return begun
        return _Request("POST", f"/v1/shards/{_seg(shard_id)}/reconcile", begun)

    def note_reconciled(self, shard_id: str, response: httpx.Response) -> ReconcileOutcome:
        outcome = ReconcileOutcome.from_json(response.json())
        self.book().note_reconciled(shard_id, outcome)
        return outcome


class Reservoir:
    """Blocking client. Use as a context manager, or call :meth:`close`.

    ``transport`` replaces httpx's (tests inject faults there); ``http_client``
    replaces the whole httpx client (its base URL must be the server's).
    ``fallback`` is a shard book (see :mod:`.shards`); ``cluster_nodes`` the
    cluster's node URLs, which the client may go to directly once a node
    forwarded it to one of them (see :mod:`.owners`).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        http_client: httpx.Client | None = None,
        rng: random.Random | None = None,
        policy_cache_ttl_s: float = DEFAULT_POLICY_CACHE_TTL_S,
        fallback: ShardBook | None = None,
        cluster_nodes: Sequence[str] | None = None,
    ) -> None:
        self._p = _Protocol(
            token=token,
            retry=retry or RetryPolicy(),
            rng=rng,
            policy_cache_ttl_s=policy_cache_ttl_s,
            cluster_nodes=cluster_nodes,
        )
        self._p.fallback = fallback
        self._timeout_s = timeout_s
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(base_url=base_url, transport=transport)

    def __enter__(self) -> Reservoir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def _send(self, request: _Request) -> httpx.Response:
        attempts = self._p.attempts(request)
        while True:
            asked, url = self._p.target(request)
            try:
                response = self._http.request(
                    request.method, url, **self._p.http_kwargs(request, attempts, self._timeout_s)
                )
            except httpx.TransportError as exc:
                self._p.learn(request, asked, None, exc)
                delay = attempts.transport_failed(exc)
            else:
                self._p.learn(request, asked, response)
                if response.is_success:
                    return response
                delay = attempts.answered(self._p.problem(response))
            if delay is None:
                raise attempts.give_up()
            time.sleep(delay)

    def reserve(
        self,
        subject: str,
        route: str,
        *,
        units: int | None = None,
        counted_input_tokens: int | None = None,
        max_tokens: int | None = None,
        reservation_id: str | None = None,
    ) -> Receipt:
        """Reserve capacity: ``units`` exactly, or let the server size it from
        ``counted_input_tokens`` and ``max_tokens`` (else the route's default
        ``max_tokens``, else its output distribution). Without
        ``reservation_id`` a fresh one is made, and kept on every retry.

        Raises :class:`~reservoir_client.errors.ReservationUnknown` when the
        answer was lost until the deadline; :meth:`resolve` settles that.
        With a ``fallback`` shard book, a reserve that reached no ledger is
        admitted from a shard if one fits (else ``LedgerUnreachable``)."""
        request = self._p.reserve(
            subject,
            route,
            reservation_id=reservation_id,
            units=units,
            counted_input_tokens=counted_input_tokens,
            max_tokens=max_tokens,
        )
        try:
            response = self._send(request)
        except LedgerUnreachable as unreachable:
            return self._p.local_reserve(unreachable, request)
        return self._p.receipt(response)

    def resolve(self, unknown: ReservationUnknown) -> Receipt:
        """Ask again, with the same id and body, for a reserve whose answer was
        lost: the receipt the server committed (``created`` False), or a new
        reservation if the lost try never landed. Never a second debit."""
        return self._p.receipt(
            self._send(
                _Request(
                    "POST",
                    unknown.path,
                    dict(unknown.request_body or {}),
                    reservation_id=unknown.reservation_id,
                    headers={"idempotency-key": unknown.reservation_id},
                )
            )
        )

    def start(self, reservation_id: str, operation_id: str) -> Receipt:
        """RESERVED → STARTED, binding the provider call's ``operation_id``."""
        local = self._p.local_step(reservation_id, "start", operation_id=operation_id)
        return local or self._p.receipt(self._send(self._p.start(reservation_id, operation_id)))

    def settle(
        self,
        reservation_id: str,
        actual_units: int | None = None,
        *,
        operation_id: str | None = None,
        usage: Usage | None = None,
    ) -> Receipt:
        """Settle with what the call used; the unused rest goes back, any excess
        becomes debt. ``usage`` teaches the route's estimates and drift; without
        ``actual_units`` the ledger derives every dimension of the policy from
        it (requests 1, input as reported plus cache reads unless the policy
        excludes them, output as reported, tokens their sum)."""
        local = self._p.local_step(reservation_id, "settle", actual_units=actual_units, usage=usage)
        return local or self._p.receipt(self._send(self._p.settle(reservation_id, actual_units, operation_id, usage)))

    def release(self, reservation_id: str) -> Receipt:
        """Give back a reservation that was never started."""
        local = self._p.local_step(reservation_id, "release")
        return local or self._p.receipt(self._send(self._p.release(reservation_id)))

    def get_reservation(self, reservation_id: str) -> Receipt:
        """The committed receipt of ``reservation_id`` (a local one's, from the book)."""
        local = self._p.local_step(reservation_id, "get")
        return local or self._p.receipt(self._send(self._p.get_reservation(reservation_id)))

    def issue_shard(self, subject: str, route: str, units: int, *, ttl_ms: int, shard_id: str | None = None) -> ShardDocument:
        """Asks the ledger for a shard of ``units`` bound to the fallback
        book's gateway and boot epoch, and installs it (retried with the
        same ``shard_id``: one shard however many tries). The route's policy
        (the shard's unit) is read first, so a failure there issues nothing.
        An error once the issue may have been sent carries ``shard_id`` (made
        up here when not given): call again with it, not without."""
        active = self.policy(subject, route)
        request = self._p.issue_shard(subject, route, units, ttl_ms, shard_id)
        try:
            return self._p.install_issued(self._send(request), active)
        except Exception as error:
            self._p.issue_failed(request, error)
            raise

    def reconcile_shard(self, shard_id: str) -> ReconcileOutcome:
        """Closes ``shard_id`` for admission and sends its terminal receipts:
        the ledger records what was spent and remints the unused rest, once.
        After an error, call again: the same receipts go out."""
        begun = self._p.begin_reconcile(shard_id)
        if isinstance(begun, ReconcileOutcome):
            return begun
        return self._p.note_reconciled(shard_id, self._send(begun))

    def policy(self, subject: str, route: str) -> dict[str, Any]:
        """The active policy of a subject and route, with its estimator, as JSON."""
        return self._p.policy_body(self._send(self._p.policy(subject, route)))

    def route_default_max_tokens(self, subject: str, route: str) -> int | None:
        """The route's configured default ``max_tokens`` (cached a while)."""
        hit, value = self._p.cached_max_tokens(subject, route)
        if not hit:
            value = self._p.default_max_tokens(self.policy(subject, route))
            self._p.cache_max_tokens(subject, route, value)
        return value

    def fill_max_tokens(
        self, subject: str, route: str, request: Mapping[str, Any], *, key: str = "max_tokens"
    ) -> dict[str, Any]:
        """``request`` with the route's default ``max_tokens`` under ``key``
        when it sets no output limit of its own (see
        :func:`~reservoir_client.max_tokens.with_default_max_tokens`)."""
        return with_default_max_tokens(request, self.route_default_max_tokens(subject, route), key=key)

    def partitions(self) -> list[PartitionView]:
        """Every partition's ledger terms and the server's conservation check."""
        return self._p.partition_views(self._send(self._p.partitions()))


class AsyncReservoir:
    """Async client (asyncio or trio, through anyio). ``async with`` it, or
    call :meth:`aclose`. Same methods as :class:`Reservoir`, awaited."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        policy_cache_ttl_s: float = DEFAULT_POLICY_CACHE_TTL_S,
        fallback: ShardBook | None = None,
        cluster_nodes: Sequence[str] | None = None,
    ) -> None:
        self._p = _Protocol(
            token=token,
            retry=retry or RetryPolicy(),
            rng=rng,
            policy_cache_ttl_s=policy_cache_ttl_s,
            cluster_nodes=cluster_nodes,
        )
        self._p.fallback = fallback
        self._timeout_s = timeout_s
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(base_url=base_url, transport=transport)

    async def __aenter__(self) -> AsyncReservoir:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _send(self, request: _Request) -> httpx.Response:
        attempts = self._p.attempts(request)
        while True:
            asked, url = self._p.target(request)
            try:
                response = await self._http.request(
                    request.method, url, **self._p.http_kwargs(request, attempts, self._timeout_s)
                )
            except httpx.TransportError as exc:
                self._p.learn(request, asked, None, exc)
                delay = attempts.transport_failed(exc)
            else:
                self._p.learn(request, asked, response)
                if response.is_success:
                    return response
                delay = attempts.answered(self._p.problem(response))
            if delay is None:
                raise attempts.give_up()
            await anyio.sleep(delay)

    async def reserve(
        self,
        subject: str,
        route: str,
        *,
        units: int | None = None,
        counted_input_tokens: int | None = None,
        max_tokens: int | None = None,
        reservation_id: str | None = None,
    ) -> Receipt:
        """See :meth:`Reservoir.reserve`."""
        request = self._p.reserve(
            subject,
            route,
            reservation_id=reservation_id,
            units=units,
            counted_input_tokens=counted_input_tokens,
            max_tokens=max_tokens,
        )
        try:
            response = await self._send(request)
        except LedgerUnreachable as unreachable:
            return self._p.local_reserve(unreachable, request)
        return self._p.receipt(response)

    async def resolve(self, unknown: ReservationUnknown) -> Receipt:
        """See :meth:`Reservoir.resolve`."""
        return self._p.receipt(
            await self._send(
                _Request(
                    "POST",
                    unknown.path,
                    dict(unknown.request_body or {}),
                    reservation_id=unknown.reservation_id,
                    headers={"idempotency-key": unknown.reservation_id},
                )
            )
        )

    async def start(self, reservation_id: str, operation_id: str) -> Receipt:
        """See :meth:`Reservoir.start`."""
        local = self._p.local_step(reservation_id, "start", operation_id=operation_id)
        return local or self._p.receipt(await self._send(self._p.start(reservation_id, operation_id)))

    async def settle(
        self,
        reservation_id: str,
        actual_units: int | None = None,
        *,
        operation_id: str | None = None,
        usage: Usage | None = None,
    ) -> Receipt:
        """See :meth:`Reservoir.settle`."""
        local = self._p.local_step(reservation_id, "settle", actual_units=actual_units, usage=usage)
        return local or self._p.receipt(await self._send(self._p.settle(reservation_id, actual_units, operation_id, usage)))

    async def release(self, reservation_id: str) -> Receipt:
        """See :meth:`Reservoir.release`."""
        local = self._p.local_step(reservation_id, "release")
        return local or self._p.receipt(await self._send(self._p.release(reservation_id)))

    async def get_reservation(self, reservation_id: str) -> Receipt:
        """See :meth:`Reservoir.get_reservation`."""
        local = self._p.local_step(reservation_id, "get")
        return local or self._p.receipt(await self._send(self._p.get_reservation(reservation_id)))

    async def issue_shard(
        self, subject: str, route: str, units: int, *, ttl_ms: int, shard_id: str | None = None
    ) -> ShardDocument:
        """See :meth:`Reservoir.issue_shard`."""
        active = await self.policy(subject, route)
        request = self._p.issue_shard(subject, route, units, ttl_ms, shard_id)
        try:
            return self._p.install_issued(await self._send(request), active)
        except Exception as error:
            self._p.issue_failed(request, error)
            raise

    async def reconcile_shard(self, shard_id: str) -> ReconcileOutcome:
        """See :meth:`Reservoir.reconcile_shard`."""
        begun = self._p.begin_reconcile(shard_id)
        if isinstance(begun, ReconcileOutcome):
            return begun
        return self._p.note_reconciled(shard_id, await self._send(begun))

    async def policy(self, subject: str, route: str) -> dict[str, Any]:
        """See :meth:`Reservoir.policy`."""
        return self._p.policy_body(await self._send(self._p.policy(subject, route)))

    async def route_default_max_tokens(self, subject: str, route: str) -> int | None:
        """See :meth:`Reservoir.route_default_max_tokens`."""
        hit, value = self._p.cached_max_tokens(subject, route)
        if not hit:
            value = self._p.default_max_tokens(await self.policy(subject, route))
            self._p.cache_max_tokens(subject, route, value)
        return value

    async def fill_max_tokens(
        self, subject: str, route: str, request: Mapping[str, Any], *, key: str = "max_tokens"
    ) -> dict[str, Any]:
        """See :meth:`Reservoir.fill_max_tokens`."""
        return with_default_max_tokens(request, await self.route_default_max_tokens(subject, route), key=key)

    async def partitions(self) -> list[PartitionView]:
        """See :meth:`Reservoir.partitions`."""
        return self._p.partition_views(await self._send(self._p.partitions()))
