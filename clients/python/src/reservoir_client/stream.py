"""``guarded_stream``: a provider stream bound to a reservation, settled exactly
once against the running count however the stream ends.

::

    receipt = await reservoir.reserve("tenant-7", "chat",
                                      counted_input_tokens=n, max_tokens=1024)
    async with guarded_stream(reservoir, receipt, anthropic.messages.stream(**req),
                              counted_input_tokens=n) as stream:
        async for event in stream:
            yield event            # to the gateway's own client

On entry the reservation is started (RESERVED → STARTED, with
``operation_id``), then the provider stream is opened. On exit — the stream
completed, the provider failed mid-stream, the task was cancelled, or the
consumer stopped reading (its client hung up) — the provider stream is closed
(so the provider stops generating) and the reservation settled with
``input + output`` as the :class:`~reservoir_client.meter.StreamMeter` counted
them, with the usage (model, counted and reported input, cache reads, output)
recorded for the route's estimates and drift. Tokens that streamed are never refunded. The
settle runs shielded from cancellation (anyio), so a cancelled gateway task
still settles, within the client's retry deadline.

If the start fails (no answer before the deadline, a refusal, a
cancellation), no provider call is made: the guard gives the reservation
back — released, or, when the start did happen and only its answers were
lost, settled at 0 with a usage of no input and no output — and re-raises.

The guard accepts what the official SDKs hand out: a stream manager (entered
here, e.g. ``messages.stream(...)``, ``chat.completions.stream(...)``) or an
already open stream (``messages.create(stream=True)``,
``chat.completions.create(stream=True, stream_options={"include_usage": True})``).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import (
    Any,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Generic,
    Iterable,
    Iterator,
    TypeVar,
    overload,
)

import anyio

from .client import AsyncReservoir, Reservoir
from .errors import ReservoirError, WrongState
from .meter import StreamMeter, default_estimate_tokens
from .types import Receipt, Usage

__all__ = ["AsyncGuardedStream", "GuardedStream", "guarded_stream"]

log = logging.getLogger("reservoir_client")

#: What a call given back before its provider call used: a usage of no input
#: and no output, which a route limiting tokens beside requests needs to
#: settle at all (without one the ledger refuses the settle with
#: ``usage_missing``).
_NOTHING_USED = Usage(output_tokens=0, reported_input_tokens=0)

#: States in which a started call whose provider call never ran is settled at 0.
_STARTED = ("STARTED", "USAGE_UNKNOWN")

E = TypeVar("E")

#: How the settled units follow from the count (default: input + output).
SettleUnits = Callable[[StreamMeter], "int | None"]


def _from_usage(meter: StreamMeter) -> int | None:
    """The default: no ``actual_units``; the ledger derives every dimension of
    the route's policy from the usage the meter reports (tokens = input +
    output, requests = 1, input and output tokens each as counted)."""
    return None


class _Guard:
    """The parts both guards share: the meter and the settle bookkeeping."""

    def __init__(
        self,
        receipt: Receipt,
        *,
        counted_input_tokens: int,
        operation_id: str | None,
        estimate_tokens: Callable[[str], int],
        settle_units: SettleUnits,
    ) -> None:
        self.reservation = receipt
        self.reservation_id = receipt.id
        # A reservation the caller already started keeps its operation id.
        self.operation_id = operation_id or receipt.operation_id or f"op-{receipt.id}"[:128]
        self.meter = StreamMeter(counted_input_tokens=counted_input_tokens, estimate_tokens=estimate_tokens)
        self._settle_units = settle_units
        #: The settled receipt, once settled.
        self.settled: Receipt | None = None
        #: Why the settle failed, when it did while another error was propagating.
        self.settle_error: BaseException | None = None
        self._done = False

    @property
    def efficiency(self) -> float | None:
        """Settled ÷ reserved units once settled (the seed's reservation
        efficiency, for the gateway's own metrics)."""
        if self.settled is None or self.settled.actual_units is None or not self.settled.reserved_units:
            return None
        return self.settled.actual_units / self.settled.reserved_units

    def _must_start(self) -> bool:
        return self.reservation.state == "RESERVED"

    def _settle_args(self) -> tuple[int | None, dict[str, Any]]:
        return self._settle_units(self.meter), {"operation_id": self.operation_id, "usage": self.meter.usage()}

    def _opening_failed(self, error: BaseException) -> None:
        """Opening the provider stream raised: an error status from the
        provider (the SDKs' status errors carry ``status_code``) means the
        call did not run; anything else (no connection, a timeout, a
        cancellation) leaves it unknown, and the gateway's count is charged."""
        if isinstance(getattr(error, "status_code", None), int):
            self.meter.provider_refused()

    def _settle_failed(self, error: BaseException, propagating: BaseException | None) -> None:
        if propagating is None:
            raise error
        self.settle_error = error
        log.error(
            "reservoir: settling %s failed while the stream ended with %r: %r",
            self.reservation_id,
            propagating,
            error,
        )


class AsyncGuardedStream(_Guard, Generic[E]):
    """The async guard; see the module documentation."""

    def __init__(
        self,
        reservoir: AsyncReservoir,
        receipt: Receipt,
        source: Any,
        *,
        counted_input_tokens: int,
        operation_id: str | None = None,
        estimate_tokens: Callable[[str], int] = default_estimate_tokens,
        settle_units: SettleUnits = _from_usage,
    ) -> None:
        super().__init__(
            receipt,
            counted_input_tokens=counted_input_tokens,
            operation_id=operation_id,
            estimate_tokens=estimate_tokens,
            settle_units=settle_units,
        )
        self._reservoir = reservoir
        self._source = source
        self._manager: Any = None
        self._stream: Any = None
        self._iterator: AsyncIterator[E] | None = None

    async def __aenter__(self) -> AsyncGuardedStream[E]:
        if self._must_start():
            try:
                self.reservation = await self._reservoir.start(self.reservation_id, self.operation_id)
            except BaseException:
                await self._give_back()
                raise
        try:
            if hasattr(self._source, "__aenter__") and not hasattr(self._source, "__anext__"):
                self._manager = self._source
                self._stream = await self._source.__aenter__()
            else:
                self._stream = self._source
            iterable: AsyncIterable[E] = self._stream
            self._iterator = iterable.__aiter__()
        except BaseException as exc:
            self._opening_failed(exc)
            await self._finish(exc)
            raise
        return self

    def __aiter__(self) -> AsyncGuardedStream[E]:
        return self

    async def __anext__(self) -> E:
        if self._iterator is None:
            raise RuntimeError("enter the guarded stream with `async with` first")
        try:
            event = await self._iterator.__anext__()
        except StopAsyncIteration:
            self.meter.finished()
            raise
        self.meter.observe(event)
        return event

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._finish(exc)

    async def _close_provider(self, exc: BaseException | None) -> None:
        try:
            if self._manager is not None:
                await self._manager.__aexit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
            elif self._stream is not None and hasattr(self._stream, "close"):
                closed = self._stream.close()
                if hasattr(closed, "__await__"):
                    await closed
        except Exception as close_error:  # the settle below matters more
            log.warning("reservoir: closing the provider stream failed: %r", close_error)

    async def _give_back(self) -> None:
        """The start failed (no answer, a refusal, a cancellation): no
        provider call will run on this reservation. Release it, or, if the
        start happened after all (its answers were lost), settle it at 0."""
        self._done = True
        with anyio.CancelScope(shield=True):
            try:
                try:
                    await self._reservoir.release(self.reservation_id)
                except WrongState:
                    receipt = await self._reservoir.get_reservation(self.reservation_id)
                    if receipt.state in _STARTED:
                        self.settled = await self._reservoir.settle(
                            self.reservation_id, 0, operation_id=self.operation_id, usage=_NOTHING_USED
                        )
            except ReservoirError as error:
                log.warning("reservoir: giving back %s after its start failed: %r", self.reservation_id, error)

    async def _finish(self, exc: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        with anyio.CancelScope(shield=True):
            await self._close_provider(exc)
            units, kwargs = self._settle_args()
            try:
                self.settled = await self._reservoir.settle(self.reservation_id, units, **kwargs)
            except ReservoirError as error:
                self._settle_failed(error, exc)


class GuardedStream(_Guard, Generic[E]):
    """The blocking guard, for the SDKs' sync clients; see the module documentation."""

    def __init__(
        self,
        reservoir: Reservoir,
        receipt: Receipt,
        source: Any,
        *,
        counted_input_tokens: int,
        operation_id: str | None = None,
        estimate_tokens: Callable[[str], int] = default_estimate_tokens,
        settle_units: SettleUnits = _from_usage,
    ) -> None:
        super().__init__(
            receipt,
            counted_input_tokens=counted_input_tokens,
            operation_id=operation_id,
            estimate_tokens=estimate_tokens,
            settle_units=settle_units,
        )
        self._reservoir = reservoir
        self._source = source
        self._manager: Any = None
        self._stream: Any = None
        self._iterator: Iterator[E] | None = None

    def __enter__(self) -> GuardedStream[E]:
        if self._must_start():
            try:
                self.reservation = self._reservoir.start(self.reservation_id, self.operation_id)
            except BaseException:
                self._give_back()
                raise
        try:
            if hasattr(self._source, "__enter__") and not hasattr(self._source, "__next__"):
                self._manager = self._source
                self._stream = self._source.__enter__()
            else:
                self._stream = self._source
            iterable: Iterable[E] = self._stream
            self._iterator = iter(iterable)
        except BaseException as exc:
            self._opening_failed(exc)
            self._finish(exc)
            raise
        return self

    def __iter__(self) -> GuardedStream[E]:
        return self

    def __next__(self) -> E:
        if self._iterator is None:
            raise RuntimeError("enter the guarded stream with `with` first")
        try:
            event = next(self._iterator)
        except StopIteration:
            self.meter.finished()
            raise
        self.meter.observe(event)
        return event

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish(exc)

    def _close_provider(self, exc: BaseException | None) -> None:
        try:
            if self._manager is not None:
                self._manager.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
            elif self._stream is not None and hasattr(self._stream, "close"):
                self._stream.close()
        except Exception as close_error:
            log.warning("reservoir: closing the provider stream failed: %r", close_error)

    def _give_back(self) -> None:
        """See :meth:`AsyncGuardedStream._give_back`."""
        self._done = True
        try:
            try:
                self._reservoir.release(self.reservation_id)
            except WrongState:
                receipt = self._reservoir.get_reservation(self.reservation_id)
                if receipt.state in _STARTED:
                    self.settled = self._reservoir.settle(
                        self.reservation_id, 0, operation_id=self.operation_id, usage=_NOTHING_USED
                    )
        except ReservoirError as error:
            log.warning("reservoir: giving back %s after its start failed: %r", self.reservation_id, error)

    def _finish(self, exc: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        self._close_provider(exc)
        units, kwargs = self._settle_args()
        try:
            self.settled = self._reservoir.settle(self.reservation_id, units, **kwargs)
        except ReservoirError as error:
            self._settle_failed(error, exc)


@overload
def guarded_stream(
    reservoir: AsyncReservoir,
    receipt: Receipt,
    source: Any,
    *,
    counted_input_tokens: int,
    operation_id: str | None = ...,
    estimate_tokens: Callable[[str], int] = ...,
    settle_units: SettleUnits = ...,
) -> AsyncGuardedStream[Any]: ...


@overload
def guarded_stream(
    reservoir: Reservoir,
    receipt: Receipt,
    source: Any,
    *,
    counted_input_tokens: int,
    operation_id: str | None = ...,
    estimate_tokens: Callable[[str], int] = ...,
    settle_units: SettleUnits = ...,
) -> GuardedStream[Any]: ...


def guarded_stream(
    reservoir: AsyncReservoir | Reservoir,
    receipt: Receipt,
    source: Any,
    *,
    counted_input_tokens: int,
    operation_id: str | None = None,
    estimate_tokens: Callable[[str], int] = default_estimate_tokens,
    settle_units: SettleUnits = _from_usage,
) -> AsyncGuardedStream[Any] | GuardedStream[Any]:
    """Binds ``source`` (an SDK stream or stream manager) to ``receipt``'s
    reservation: ``async with`` it for :class:`AsyncReservoir`, ``with`` it for
    :class:`Reservoir`, and iterate it for the provider's events."""
    if isinstance(reservoir, AsyncReservoir):
        return AsyncGuardedStream(
            reservoir,
            receipt,
            source,
            counted_input_tokens=counted_input_tokens,
            operation_id=operation_id,
            estimate_tokens=estimate_tokens,
            settle_units=settle_units,
        )
    return GuardedStream(
        reservoir,
        receipt,
        source,
        counted_input_tokens=counted_input_tokens,
        operation_id=operation_id,
        estimate_tokens=estimate_tokens,
        settle_units=settle_units,
    )
