"""Emergency shards on a Python gateway: :class:`ShardBook` holds the signed
``emergencyShard.v1`` documents the ledger issued to this process, admits
from them only while the ledger is unreachable, keeps each shard's own books,
and gives the body that reconciles a shard once the ledger is back. It mirrors
the Rust client's ``reservoir_client::shards`` (``crates/client/src/shards.rs``).

Pass a book as ``fallback=`` to :class:`~reservoir_client.Reservoir` or
:class:`~reservoir_client.AsyncReservoir`: a reserve that reached no ledger
before the retry deadline (:class:`~reservoir_client.LedgerUnreachable`) is
then admitted from a shard if one fits, and the reservation's ``start``,
``settle`` and ``release`` stay local. The clients' ``issue_shard`` and
``reconcile_shard`` talk to the ledger for the book.

Per shard, after every local operation (a broken equation raises, as the
ledger's own checks do, and ``python -O`` does not remove it):
``allocated = localAvailable + localReserved + localSpent + localRetired``.
Reserve moves available → reserved; settle moves the held units to spent
(what the call used, at most what it held; use above the hold is counted apart
as ``overspent`` and reported in full, so the ledger records it as debt) and
the rest back to available; release moves them back; a call whose usage is
unknown moves its hold to retired (never unused). An expired shard's available
units move to retired.

What admits nothing: a shard whose signature does not verify against the
ledger's public key, one bound to another gateway id, one from another boot
epoch (a restarted process cannot inherit its predecessor's shards), an
expired one, and one being reconciled. Without a usable shard the client
raises the ``LedgerUnreachable`` it had (fails closed).

A shard carves its route's primary dimension only, in the route's capacity
unit: a call on a route that limits requests holds one unit, on a tokens
route its units (or counted input plus its output limit). The book learns
the unit, and the route's default output limit, from the policy the client
reads when it issues the shard; a document installed by hand is taken to be
in tokens unless told otherwise.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from .types import Receipt

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "LocalReceipt",
    "ReconcileOutcome",
    "ShardBook",
    "ShardBooks",
    "ShardDocument",
    "ShardRefused",
]

SCHEMA_LINE = "reservoir.emergencyShard.v1"

CapacityUnit = Literal["tokens", "requests"]


def _field(body: Mapping[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"shard document: {name} must be {kind.__name__}, got {value!r}")
    return value


@dataclass(frozen=True)
class ShardDocument:
    """``emergencyShard.v1`` as the ledger issued it; ``raw`` is sent back
    unchanged on reconcile."""

    shard_id: str
    subject: str
    route: str
    accounting_epoch: str
    policy_generation: int
    units: int
    gateway_id: str
    gateway_boot_epoch: int
    fence_epoch: int
    issued_at_ms: int
    expires_at_ms: int
    signature: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ShardDocument:
        key = body.get("partition_key")
        if not isinstance(key, Mapping):
            raise ValueError("shard document: partition_key must be an object")
        return cls(
            shard_id=_field(body, "shard_id", str),
            subject=_field(key, "subject", str),
            route=_field(key, "route", str),
            accounting_epoch=_field(key, "accounting_epoch", str),
            policy_generation=_field(key, "policy_generation", int),
            units=_field(body, "units", int),
            gateway_id=_field(body, "gateway_id", str),
            gateway_boot_epoch=_field(body, "gateway_boot_epoch", int),
            fence_epoch=_field(body, "fence_epoch", int),
            issued_at_ms=_field(body, "issued_at_ms", int),
            expires_at_ms=_field(body, "expires_at_ms", int),
            signature=_field(body, "signature", str),
            raw=dict(body),
        )

    def canonical(self) -> bytes:
        """The bytes the ledger signed (one ``name=value`` line per field)."""
        lines = [
            SCHEMA_LINE,
            f"shard_id={self.shard_id}",
            f"subject={self.subject}",
            f"route={self.route}",
            f"accounting_epoch={self.accounting_epoch}",
            f"policy_generation={self.policy_generation}",
            f"units={self.units}",
            f"gateway_id={self.gateway_id}",
            f"boot_epoch={self.gateway_boot_epoch}",
            f"fence_epoch={self.fence_epoch}",
            f"issued_at_ms={self.issued_at_ms}",
            f"expires_at_ms={self.expires_at_ms}",
        ]
        return "\n".join(lines).encode()

    def verify(self, public_key: Ed25519PublicKey) -> bool:
        """Whether ``public_key`` signed this document."""
        from cryptography.exceptions import InvalidSignature

        prefix = "ed25519:"
        if not self.signature.startswith(prefix):
            return False
        try:
            signature = bytes.fromhex(self.signature[len(prefix) :])
        except ValueError:
            return False
        if len(signature) != 64:
            return False
        try:
            public_key.verify(signature, self.canonical())
        except InvalidSignature:
            return False
        return True


class ShardRefused(Exception):
    """A shard not taken into the book. ``reason``: ``bad_signature``,
    ``other_gateway``, ``other_boot_epoch``, ``expired``, ``duplicate`` or
    ``bad_key``. ``shard_id`` is set when ``issue_shard`` got a document the
    book refused (the ledger issued it)."""

    shard_id: str | None = None

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


@dataclass
class ShardBooks:
    """One shard's local books."""

    allocated_units: int
    local_available_units: int = 0
    local_reserved_units: int = 0
    local_spent_units: int = 0
    local_retired_units: int = 0
    #: Use reported beyond holds (not in the equation: the ledger records it as debt).
    overspent_units: int = 0

    def check(self) -> None:
        right = self.local_available_units + self.local_reserved_units + self.local_spent_units + self.local_retired_units
        terms = (self.local_available_units, self.local_reserved_units, self.local_spent_units, self.local_retired_units)
        if self.allocated_units != right or min(terms) < 0:
            raise RuntimeError(f"shard conservation broken: {self}")


@dataclass(frozen=True)
class LocalReceipt:
    """A terminal local reservation, as reconcile sends it."""

    reservation_id: str
    #: ``SETTLED``, ``RELEASED``, ``EXPIRED`` or ``USAGE_UNKNOWN``.
    state: str
    used_units: int

    def to_json(self) -> dict[str, Any]:
        return {"reservation_id": self.reservation_id, "state": self.state, "used_units": self.used_units}


@dataclass(frozen=True)
class ReconcileOutcome:
    """What the ledger recorded for a reconciled shard."""

    shard_id: str
    outcome: str
    issued_units: int
    spent_units: int
    unknown_units: int
    reminted_units: int
    retired_units: int
    excess_units: int
    #: False when the ledger had recorded this reconcile before (a retry).
    created: bool

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ReconcileOutcome:
        created = body.get("created")
        if not isinstance(created, bool):
            raise ValueError(f"reconcile answer: created must be a bool, got {created!r}")
        return cls(
            shard_id=_field(body, "shard_id", str),
            outcome=_field(body, "outcome", str),
            issued_units=_field(body, "issued_units", int),
            spent_units=_field(body, "spent_units", int),
            unknown_units=_field(body, "unknown_units", int),
            reminted_units=_field(body, "reminted_units", int),
            retired_units=_field(body, "retired_units", int),
            excess_units=_field(body, "excess_units", int),
            created=created,
        )


@dataclass
class _Entry:
    document: ShardDocument
    books: ShardBooks
    capacity_unit: CapacityUnit
    default_max_tokens: int | None
    #: The policy leaves cache-read input tokens out of its input dimensions.
    exclude_cache_reads: bool = False
    #: Open local reservations: id → held units.
    open: dict[str, int] = field(default_factory=dict)
    receipts: list[LocalReceipt] = field(default_factory=list)
    #: ``active``, ``reconciling`` (admits nothing; the receipts are fixed) or ``reconciled``.
    phase: str = "active"
    outcome: ReconcileOutcome | None = None


def _system_now_ms() -> int:
    return time.time_ns() // 1_000_000


class ShardBook:
    """The gateway's emergency shards (see the module documentation).

    ``public_key_hex`` is the ledger's key (``GET /v1/shards/public-key``);
    ``min_failures`` admits locally only from the n-th consecutive unreachable
    reserve on; ``clock_ms`` is the clock expiry is judged by."""

    def __init__(
        self,
        gateway_id: str,
        boot_epoch: int,
        public_key_hex: str,
        *,
        min_failures: int = 1,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        try:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        except ImportError as missing:  # pragma: no cover - the test extra has it
            raise ImportError("emergency shards need the 'shards' extra: pip install 'reservoir-client[shards]'") from missing
        try:
            self._key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex))
        except ValueError as bad:
            raise ShardRefused("bad_key", f"not an ed25519 public key: {public_key_hex!r} ({bad})") from bad
        self.gateway_id = gateway_id
        self.boot_epoch = boot_epoch
        self._min_failures = max(1, min_failures)
        self._now_ms = clock_ms or _system_now_ms
        self._lock = threading.Lock()
        self._shards: dict[str, _Entry] = {}
        self._failures = 0
        #: The clients' receipts of reservations admitted from a shard, kept
        #: here (any client of the process answers for them) until the
        #: shard is reconciled.
        self._local_receipts: dict[str, Receipt] = {}

    def note_ledger_reachable(self) -> None:
        """The ledger answered: the count of consecutive failures starts again."""
        with self._lock:
            self._failures = 0

    def install(
        self,
        document: ShardDocument | Mapping[str, Any],
        *,
        capacity_unit: CapacityUnit = "tokens",
        default_max_tokens: int | None = None,
        exclude_cache_reads: bool = False,
    ) -> ShardDocument:
        """Takes a shard into the book after checking its signature and binding.
        ``capacity_unit``, ``default_max_tokens`` and ``exclude_cache_reads``
        (``exclude_cache_read_input_tokens``) are its policy's."""
        doc = document if isinstance(document, ShardDocument) else ShardDocument.from_json(document)
        if not doc.verify(self._key):
            raise ShardRefused("bad_signature", "the signature does not verify against the ledger's key")
        if doc.gateway_id != self.gateway_id:
            raise ShardRefused("other_gateway", f"bound to gateway {doc.gateway_id}")
        if doc.gateway_boot_epoch != self.boot_epoch:
            raise ShardRefused("other_boot_epoch", f"bound to boot epoch {doc.gateway_boot_epoch}")
        if self._now_ms() >= doc.expires_at_ms:
            raise ShardRefused("expired", f"expired at {doc.expires_at_ms}")
        books = ShardBooks(allocated_units=doc.units, local_available_units=doc.units)
        books.check()
        with self._lock:
            if doc.shard_id in self._shards:
                raise ShardRefused("duplicate", f"shard {doc.shard_id} is already in the book")
            self._shards[doc.shard_id] = _Entry(doc, books, capacity_unit, default_max_tokens, exclude_cache_reads)
        return doc

    def books(self, shard_id: str) -> ShardBooks | None:
        """A copy of one shard's books (``None``: not in the book)."""
        with self._lock:
            entry = self._shards.get(shard_id)
            return None if entry is None else ShardBooks(**vars(entry.books))

    def receipts(self, shard_id: str) -> list[LocalReceipt]:
        """The terminal receipts a reconcile of ``shard_id`` would send."""
        with self._lock:
            entry = self._shards.get(shard_id)
            return [] if entry is None else list(entry.receipts)

    def holds(self, reservation_id: str) -> bool:
        """Whether ``reservation_id`` is an open local reservation of this book."""
        with self._lock:
            return any(reservation_id in e.open for e in self._shards.values())

    def reserve(
        self,
        reservation_id: str,
        subject: str,
        route: str,
        *,
        units: int | None = None,
        counted_input_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> tuple[str, int] | None:
        """A local hold for a reserve that reached no ledger: ``(shard id,
        units held)``, or ``None`` (no usable shard fits, or too few
        consecutive failures yet)."""
        now = self._now_ms()
        with self._lock:
            self._failures += 1
            if self._failures < self._min_failures:
                return None
            self._retire_expired(now)
            for shard_id, entry in self._shards.items():
                doc = entry.document
                # (Its gateway id and boot epoch were checked when it was installed.)
                if entry.phase != "active" or doc.subject != subject or doc.route != route:
                    continue
                held = self._units_of(entry, units, counted_input_tokens, max_tokens)
                if held is None or held <= 0 or now >= doc.expires_at_ms:
                    continue
                if entry.books.local_available_units < held or reservation_id in entry.open:
                    continue
                entry.books.local_available_units -= held
                entry.books.local_reserved_units += held
                entry.open[reservation_id] = held
                entry.books.check()
                return shard_id, held
            return None

    @staticmethod
    def _units_of(entry: _Entry, units: int | None, counted_input: int | None, max_tokens: int | None) -> int | None:
        if units is not None:
            return units
        if entry.capacity_unit == "requests":
            return 1
        output = max_tokens if max_tokens is not None else entry.default_max_tokens
        if output is None:
            return None  # no bound on its output: not admitted offline
        return (counted_input or 0) + output

    def units_used(
        self, reservation_id: str, input_tokens: int, output_tokens: int, cache_read_input_tokens: int = 0
    ) -> int:
        """What a local call with this usage spent, in its shard's unit (cache
        reads counted as input unless its policy excludes them, as the ledger
        counts them)."""
        with self._lock:
            for entry in self._shards.values():
                if reservation_id in entry.open:
                    if entry.capacity_unit == "requests":
                        return 1
                    reads = 0 if entry.exclude_cache_reads else cache_read_input_tokens
                    return input_tokens + reads + output_tokens
        return input_tokens + cache_read_input_tokens + output_tokens

    def settle(self, reservation_id: str, used_units: int) -> bool:
        """Ends an open local reservation with what it used (False: not open here)."""
        if used_units < 0:
            raise ValueError("used_units must not be negative")
        return self._finish(reservation_id, "SETTLED", used_units)

    def release(self, reservation_id: str) -> bool:
        """Gives an open local reservation back unused (False: not open here)."""
        return self._finish(reservation_id, "RELEASED", 0)

    def mark_usage_unknown(self, reservation_id: str) -> bool:
        """A local call whose usage cannot be known: its hold stays retired."""
        with self._lock:
            for entry in self._shards.values():
                held = entry.open.pop(reservation_id, None)
                if held is None:
                    continue
                entry.books.local_reserved_units -= held
                entry.books.local_retired_units += held
                entry.receipts.append(LocalReceipt(reservation_id, "USAGE_UNKNOWN", held))
                entry.books.check()
                return True
        return False

    def _finish(self, reservation_id: str, state: str, used_units: int) -> bool:
        with self._lock:
            for entry in self._shards.values():
                held = entry.open.pop(reservation_id, None)
                if held is None:
                    continue
                spent = min(used_units, held)
                entry.books.local_reserved_units -= held
                entry.books.local_spent_units += spent
                entry.books.overspent_units += used_units - spent
                entry.books.local_available_units += held - spent
                entry.receipts.append(LocalReceipt(reservation_id, state, used_units))
                entry.books.check()
                return True
        return False

    def _retire_expired(self, now_ms: int) -> None:
        for entry in self._shards.values():
            if now_ms >= entry.document.expires_at_ms and entry.books.local_available_units > 0:
                entry.books.local_retired_units += entry.books.local_available_units
                entry.books.local_available_units = 0
                entry.books.check()

    def begin_reconcile(self, shard_id: str) -> ReconcileOutcome | dict[str, Any]:
        """Closes ``shard_id`` for admission (its expired units retired first)
        and gives the body of ``POST /v1/shards/{id}/reconcile``, the same on
        every call until :meth:`note_reconciled`; after it, the recorded
        outcome. Raises ``KeyError`` for a shard not in the book and
        ``RuntimeError`` while local reservations of it are open."""
        with self._lock:
            self._retire_expired(self._now_ms())
            entry = self._shards.get(shard_id)
            if entry is None:
                raise KeyError(f"no shard {shard_id} in the book")
            if entry.outcome is not None:
                return entry.outcome
            if entry.open:
                raise RuntimeError(f"{len(entry.open)} local reservations are still open; settle or release them first")
            entry.phase = "reconciling"
            return {
                "shard": dict(entry.document.raw),
                "gateway_id": self.gateway_id,
                "gateway_boot_epoch": self.boot_epoch,
                "receipts": [r.to_json() for r in entry.receipts],
            }

    def note_reconciled(self, shard_id: str, outcome: ReconcileOutcome) -> None:
        """The ledger's answer to the body :meth:`begin_reconcile` gave."""
        with self._lock:
            self._failures = 0
            entry = self._shards.get(shard_id)
            if entry is not None:
                entry.phase = "reconciled"
                entry.outcome = outcome
            # Every local reservation of the shard ended before its reconcile began.
            self._local_receipts = {
                k: r for k, r in self._local_receipts.items() if r.extra.get("local_shard_id") != shard_id
            }

    def local_receipt(self, reservation_id: str) -> Receipt | None:
        """The latest receipt of a reservation admitted from a shard (until
        the shard is reconciled)."""
        with self._lock:
            return self._local_receipts.get(reservation_id)

    def keep_receipt(self, receipt: Receipt) -> None:
        """A client's receipt of a local reservation, for the next step."""
        with self._lock:
            self._local_receipts[receipt.id] = receipt
