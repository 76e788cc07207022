"""Reservoir's Python client: what a Python gateway embeds to reserve LLM
capacity before a provider call and settle it after.

- :class:`Reservoir` / :class:`AsyncReservoir` (``client.py``): ``reserve``,
  ``start``, ``settle``, ``release``, ``get_reservation``, ``resolve``, the
  route-default ``max_tokens`` helper and ``partitions``, on httpx, retried with
  the same reservation id under a :class:`RetryPolicy` (``retry.py``).
- Receipts and other answers as typed, tolerant dataclasses (``types.py``).
- problem+json answers as exceptions carrying ``type``, ``retry_after`` and
  ``limiting_dimension`` (``errors.py``); a reserve whose answer was lost is
  :class:`ReservationUnknown`, resolved by asking again with the same id.
- :func:`guarded_stream` (``stream.py``): the official Anthropic and OpenAI SDK
  streams bound to a reservation, settled against the running count
  (``meter.py``) on completion, error, cancellation or disconnect.

- :class:`ShardBook` (``shards.py``): emergency shards, the gateway-side
  buckets for when the ledger is unreachable, as the clients' ``fallback=``;
  ``issue_shard`` and ``reconcile_shard`` on either client.
- ``cluster_nodes=`` (``owners.py``): in cluster mode, each step goes to the
  node that owns its partition once a forwarded answer named it.
- :class:`AsyncStartScheduler` / :class:`StartScheduler` (``scheduler.py``):
  the fair start scheduler, which picks the already-reserved call that starts
  next when only so many may run at once (stride scheduling by tenant weight).

It mirrors the Rust client (``crates/client``, issue 13) over the same HTTP
contract. ``token=`` is sent as ``Authorization: Bearer``; the ledger's 401
and 403 are :class:`Unauthorized` and :class:`Forbidden`.
"""

from .client import AsyncReservoir, Reservoir, new_reservation_id
from .errors import (
    CapacityRefused,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    LedgerUnreachable,
    NoPolicy,
    OutcomeUnknown,
    ProblemError,
    RequestNotSent,
    RequestTooLarge,
    ReservationUnknown,
    ReservoirError,
    Unauthorized,
    Unavailable,
    UnknownReservation,
    WrongState,
)
from .max_tokens import requested_max_tokens, with_default_max_tokens
from .meter import StreamMeter, default_estimate_tokens
from .retry import RetryPolicy
from .scheduler import (
    AsyncStartScheduler,
    FairnessGap,
    FairQueue,
    QueueFull,
    StartScheduler,
    TenantShare,
)
from .shards import LocalReceipt, ReconcileOutcome, ShardBook, ShardBooks, ShardDocument, ShardRefused
from .stream import AsyncGuardedStream, GuardedStream, guarded_stream
from .types import DimensionReceipt, LogPosition, PartitionView, Receipt, SizingReceipt, Usage, WouldRefuse

__version__ = "0.1.0"

__all__ = [
    "AsyncGuardedStream",
    "AsyncReservoir",
    "AsyncStartScheduler",
    "CapacityRefused",
    "DimensionReceipt",
    "FairQueue",
    "FairnessGap",
    "Forbidden",
    "GuardedStream",
    "IdempotencyConflict",
    "InvalidRequest",
    "LedgerUnreachable",
    "LocalReceipt",
    "LogPosition",
    "NoPolicy",
    "OutcomeUnknown",
    "PartitionView",
    "ProblemError",
    "QueueFull",
    "Receipt",
    "ReconcileOutcome",
    "RequestNotSent",
    "RequestTooLarge",
    "ReservationUnknown",
    "Reservoir",
    "ReservoirError",
    "RetryPolicy",
    "ShardBook",
    "ShardBooks",
    "ShardDocument",
    "ShardRefused",
    "SizingReceipt",
    "StartScheduler",
    "StreamMeter",
    "TenantShare",
    "Unauthorized",
    "Unavailable",
    "UnknownReservation",
    "Usage",
    "WouldRefuse",
    "WrongState",
    "__version__",
    "default_estimate_tokens",
    "guarded_stream",
    "new_reservation_id",
    "requested_max_tokens",
    "with_default_max_tokens",
]
