"""Cluster mode: which node owns what, learnt from the
``x-reservoir-served-by`` header a node sets on an answer it forwarded from
the partition's owner. It mirrors the Rust client's ``owners.rs``.

With ``cluster_nodes=``, a reserve whose answer was forwarded teaches the
client the owner of its subject/route, and the later reserves of that
subject/route and the later steps of that reservation (start, settle,
release, read) go to the owner directly, one hop fewer. The client only ever
follows a node in the list it was given: a header naming anything else is
ignored, so an answer cannot send the gateway's token to a URL the operator
did not name.

A node that cannot be reached, times out or answers 503 is forgotten (every
entry naming it), and the retry goes to the configured URL again, which
forwards to whoever owns the partition now. Retries keep their ids, so going
another way never makes a second reservation. Each map holds at most
:data:`MAX_ENTRIES`; a full map starts again empty.
"""

from __future__ import annotations

import threading
from typing import Iterable

SERVED_BY = "x-reservoir-served-by"
#: Entries each map holds at most.
MAX_ENTRIES = 65_536


def _normalized(url: str) -> str:
    return url.rstrip("/")


class Owners:
    """Owners learnt so far, and the nodes the client may follow."""

    def __init__(self, nodes: Iterable[str]) -> None:
        self._nodes = frozenset(_normalized(n) for n in nodes)
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, str], str] = {}
        self._ids: dict[str, str] = {}

    def listed(self, url: str) -> str | None:
        """The listed node ``url`` names, if it names one."""
        url = _normalized(url)
        return url if url in self._nodes else None

    def of(self, reservation_id: str | None, route: tuple[str, str] | None) -> str | None:
        """Where a request goes: the owner learnt for its subject/route (a
        reserve) or its reservation; ``None``: the configured URL."""
        with self._lock:
            if route is not None:
                return self._routes.get(route)
            return None if reservation_id is None else self._ids.get(reservation_id)

    def learn(
        self,
        reservation_id: str | None,
        route: tuple[str, str] | None,
        asked: str | None,
        status: int | None,
        served_by: str | None,
    ) -> None:
        """What an exchange at ``asked`` (an owner, or the configured URL when
        ``None``) teaches: no answer (``status`` None) or a 503 forgets the
        owner asked; a forwarded answer names the owner of the request's
        subject/route and reservation; an owner that answered itself keeps it."""
        if status is None or status == 503:
            if asked is not None:
                self.forget(asked)
            return
        owner = self.listed(served_by) if served_by is not None else asked
        if owner is None:
            return
        with self._lock:
            if route is not None:
                if len(self._routes) >= MAX_ENTRIES:
                    self._routes.clear()
                self._routes[route] = owner
            if reservation_id is not None:
                if len(self._ids) >= MAX_ENTRIES:
                    self._ids.clear()
                self._ids[reservation_id] = owner

    def ended(self, reservation_id: str) -> None:
        """The reservation ended (settled or released): nothing more goes to it."""
        with self._lock:
            self._ids.pop(reservation_id, None)

    def forget(self, node: str) -> None:
        """Every entry naming ``node`` (it failed, or ownership is moving)."""
        with self._lock:
            self._routes = {k: v for k, v in self._routes.items() if v != node}
            self._ids = {k: v for k, v in self._ids.items() if v != node}
