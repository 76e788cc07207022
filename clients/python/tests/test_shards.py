"""Emergency shards against the real ledger: a shard issued while it is up,
admitted from (and only within) while it is down, reconciled once after it
is back; shards that must admit nothing; and a route that limits requests,
where a sized call holds one unit. Each server here is its own process on a
data directory of its own, stopped and started again on it; conservation is
checked on the ledger's side before and after, and on the book's after every
local step (the book raises when it breaks)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import Server, assert_conserved, publish
from fault import LoseAnswers, on
from reservoir_client import (
    AsyncReservoir,
    LedgerUnreachable,
    OutcomeUnknown,
    RequestNotSent,
    ReservationUnknown,
    Reservoir,
    RetryPolicy,
    ShardBook,
    ShardBooks,
    ShardDocument,
    ShardRefused,
    Unavailable,
    Usage,
)

pytestmark = pytest.mark.anyio

# A ledger that is down is found out within a second.
QUICK = RetryPolicy(deadline_s=1.0, max_attempts=2, initial_backoff_s=0.01)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


@pytest.fixture
def ledger(data_dir: Path) -> Iterator[Server]:
    s = Server(data_dir)
    yield s
    if s.proc.poll() is None:
        s.stop()


def public_key(base: str) -> str:
    r = httpx.get(f"{base}/v1/shards/public-key")
    assert r.status_code == 200, r.text
    key = r.json()["public_key"]
    assert isinstance(key, str)
    return key


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_a_ledger_that_is_down_admits_within_the_shard_and_reconciles_once(ledger: Server, data_dir: Path) -> None:
    subject, route = unique("t"), unique("embed")
    publish(ledger.base, subject, route, burst=10_000, emergency=True)
    book = ShardBook("gw-py-1", 1, public_key(ledger.base))
    with Reservoir(ledger.base, fallback=book, retry=QUICK) as rsv:
        doc = rsv.issue_shard(subject, route, 3_000, ttl_ms=600_000)
        # Reached, so admitted by the ledger, not the shard.
        central = rsv.reserve(subject, route, units=100)
        assert "local_shard_id" not in central.extra
        rsv.release(central.id)
    before = assert_conserved(ledger.base, subject)
    assert before["retired_for_emergency_units"] == 3_000
    assert before["available_units"] == 7_000

    ledger.stop()
    with Reservoir(ledger.base, fallback=book, retry=QUICK) as rsv:
        a = rsv.reserve(subject, route, units=1_000)
        b = rsv.reserve(subject, route, units=1_500)
        assert a.extra["local_shard_id"] == doc.shard_id and a.held_units == 1_000
        with pytest.raises(LedgerUnreachable):
            rsv.reserve(subject, route, units=1_000)  # 500 left: fails closed
        started = rsv.start(a.id, "op-a")
        assert started.state == "STARTED"
        settled = rsv.settle(a.id, 800, operation_id="op-a")
        assert (settled.state, settled.actual_units) == ("SETTLED", 800)
        assert rsv.settle(a.id, 800).state == "SETTLED"  # a repeat answers the same
        assert rsv.release(b.id).state == "RELEASED"
        c = rsv.reserve(subject, route, units=400)
        rsv.start(c.id, "op-c")
        with pytest.raises(ValueError):
            rsv.release(c.id)  # started: it may have run, so it is settled, not released
        assert book.mark_usage_unknown(c.id)
        with pytest.raises(ValueError):
            rsv.settle(c.id, 10)  # its hold stays retired
        with pytest.raises(ValueError):
            rsv.start(b.id, "op-b")  # released: nothing more happens to it
    assert book.books(doc.shard_id) == ShardBooks(
        allocated_units=3_000,
        local_available_units=1_800,
        local_spent_units=800,
        local_retired_units=400,
    )
    assert [(r.reservation_id, r.state, r.used_units) for r in book.receipts(doc.shard_id)] == [
        (a.id, "SETTLED", 800),
        (b.id, "RELEASED", 0),
        (c.id, "USAGE_UNKNOWN", 400),
    ]

    back = Server(data_dir)
    try:
        with Reservoir(back.base, fallback=book, retry=QUICK) as rsv:
            assert rsv.get_reservation(a.id).state == "SETTLED"  # from the book, until reconciled
            outcome = rsv.reconcile_shard(doc.shard_id)
            assert (outcome.outcome, outcome.created) == ("reminted", True)
            assert (outcome.spent_units, outcome.unknown_units, outcome.reminted_units) == (800, 400, 1_800)
            assert rsv.reconcile_shard(doc.shard_id) == outcome  # kept in the book
            # The ledger's own repeat: the same record, nothing reminted twice.
            again = httpx.post(
                f"{back.base}/v1/shards/{doc.shard_id}/reconcile",
                json={
                    "shard": dict(doc.raw),
                    "gateway_id": "gw-py-1",
                    "gateway_boot_epoch": 1,
                    "receipts": [r.to_json() for r in book.receipts(doc.shard_id)],
                },
            )
            assert again.status_code == 200, again.text
            assert again.json()["created"] is False
            with pytest.raises(LedgerUnreachable):
                # Reconciled: the shard admits nothing any more. The ledger
                # is up, so take it away from this client alone.
                with Reservoir("http://127.0.0.1:9", fallback=book, retry=QUICK) as cut_off:
                    cut_off.reserve(subject, route, units=1)
        after = assert_conserved(back.base, subject)
        assert after["reminted_units"] == 1_800
        assert after["available_units"] == 7_000 + 1_800
        assert after["retired_for_emergency_units"] == 3_000
    finally:
        back.stop()


def test_a_foreign_restarted_tampered_or_expired_shard_admits_nothing(ledger: Server) -> None:
    subject, route = unique("t"), unique("embed")
    publish(ledger.base, subject, route, burst=10_000, emergency=True)
    key = public_key(ledger.base)
    book = ShardBook("gw-py-1", 7, key)
    with Reservoir(ledger.base, fallback=book) as rsv:
        doc = rsv.issue_shard(subject, route, 1_000, ttl_ms=60_000)
    assert_conserved(ledger.base, subject)

    def refused(other: ShardBook, document: ShardDocument) -> str:
        with pytest.raises(ShardRefused) as refusal:
            other.install(document)
        return refusal.value.reason

    assert refused(ShardBook("gw-py-2", 7, key), doc) == "other_gateway"
    assert refused(ShardBook("gw-py-1", 8, key), doc) == "other_boot_epoch"  # a restarted process
    assert refused(ShardBook("gw-py-1", 7, key), replace(doc, units=100_000)) == "bad_signature"
    assert refused(ShardBook("gw-py-1", 7, key, clock_ms=lambda: doc.expires_at_ms), doc) == "expired"
    assert refused(book, doc) == "duplicate"
    other_key = "11" * 32
    with pytest.raises(ShardRefused) as wrong_key:
        ShardBook("gw-py-1", 7, other_key).install(doc)
    assert wrong_key.value.reason in ("bad_signature", "bad_key")
    with pytest.raises(ShardRefused) as not_a_key:
        ShardBook("gw-py-1", 7, "zz")
    assert not_a_key.value.reason == "bad_key"

    # Installed, but expired by the time the ledger is unreachable: nothing.
    now = [doc.issued_at_ms]
    late = ShardBook("gw-py-1", 7, key, clock_ms=lambda: now[0])
    late.install(doc)
    now[0] = doc.expires_at_ms
    with Reservoir("http://127.0.0.1:9", fallback=late, retry=QUICK) as cut_off:
        with pytest.raises(LedgerUnreachable):
            cut_off.reserve(subject, route, units=1)
    books = late.books(doc.shard_id)
    assert books is not None and (books.local_available_units, books.local_retired_units) == (0, 1_000)


async def test_on_a_route_that_limits_requests_a_sized_call_holds_one_unit(ledger: Server, data_dir: Path) -> None:
    subject, route = unique("t"), unique("chat")
    publish(ledger.base, subject, route, burst=50_000, three_dimensions=True, emergency=True)
    book = ShardBook("gw-py-1", 1, public_key(ledger.base))
    async with AsyncReservoir(ledger.base, fallback=book, retry=QUICK) as rsv:
        doc = await rsv.issue_shard(subject, route, 2, ttl_ms=600_000)
    before = assert_conserved(ledger.base, subject)
    assert before["retired_for_emergency_units"] == 2

    ledger.stop()
    async with AsyncReservoir(ledger.base, fallback=book, retry=QUICK) as rsv:
        a = await rsv.reserve(subject, route, counted_input_tokens=500, max_tokens=1_000)
        b = await rsv.reserve(subject, route, counted_input_tokens=20_000, max_tokens=4_000)
        assert (a.held_units, b.held_units) == (1, 1)
        with pytest.raises(LedgerUnreachable):
            await rsv.reserve(subject, route, counted_input_tokens=1, max_tokens=1)
        await rsv.start(a.id, "op-a")
        settled = await rsv.settle(a.id, usage=Usage(output_tokens=700, counted_input_tokens=500))
        assert settled.actual_units == 1  # one request, whatever its tokens
        await rsv.release(b.id)
    assert book.books(doc.shard_id) == ShardBooks(allocated_units=2, local_available_units=1, local_spent_units=1)

    back = Server(data_dir)
    try:
        async with AsyncReservoir(back.base, fallback=book, retry=QUICK) as rsv:
            outcome = await rsv.reconcile_shard(doc.shard_id)
        assert (outcome.spent_units, outcome.reminted_units, outcome.excess_units) == (1, 1, 0)
        after = assert_conserved(back.base, subject)
        assert after["reminted_units"] == 1
    finally:
        back.stop()


def test_a_local_settle_counts_input_as_the_ledger_does(ledger: Server) -> None:
    """A settle from usage charges input as the ledger would: the provider's
    count when it gave one, 0 included (a provider that never took the
    request reports 0: ``StreamMeter.usage``), else the gateway's own."""
    subject, route = unique("t"), unique("embed")
    publish(ledger.base, subject, route, burst=10_000, emergency=True)
    book = ShardBook("gw-py-1", 1, public_key(ledger.base))
    with Reservoir(ledger.base, fallback=book, retry=QUICK) as rsv:
        doc = rsv.issue_shard(subject, route, 3_000, ttl_ms=600_000)
    ledger.stop()
    table = [
        # usage at the settle                                                   -> units spent
        (Usage(output_tokens=40, counted_input_tokens=100, reported_input_tokens=0), 40),
        (Usage(output_tokens=40, counted_input_tokens=100, reported_input_tokens=120), 160),
        (Usage(output_tokens=40, counted_input_tokens=100), 140),
        # Cache reads count as input, as on a policy that does not exclude them.
        (Usage(output_tokens=40, counted_input_tokens=100, reported_input_tokens=20, cache_read_input_tokens=100), 160),
    ]
    with Reservoir(ledger.base, fallback=book, retry=QUICK) as rsv:
        for usage, units in table:
            r = rsv.reserve(subject, route, counted_input_tokens=100, max_tokens=200)
            assert r.extra["local_shard_id"] == doc.shard_id
            rsv.start(r.id, unique("op"))
            assert rsv.settle(r.id, usage=usage).actual_units == units, usage
    assert book.books(doc.shard_id) == ShardBooks(
        allocated_units=3_000, local_available_units=3_000 - 500, local_spent_units=500
    )


def test_a_503_decides_nothing_so_the_count_of_failures_goes_on(ledger: Server) -> None:
    """With ``min_failures=2`` the second reserve that cannot reach the ledger
    is admitted from the shard, even when the ledger answered 503 to one in
    between: a 503 decides nothing (the reserve is unknown), so it does not
    start the count again; only a decision does, as in the Rust client. The
    outages are scripted by an httpx transport (connection refused, 503)."""
    subject, route = unique("t"), unique("embed")
    publish(ledger.base, subject, route, burst=10_000, emergency=True)
    book = ShardBook("gw-py-1", 1, public_key(ledger.base), min_failures=2)
    with Reservoir(ledger.base, fallback=book) as rsv:
        doc = rsv.issue_shard(subject, route, 1_000, ttl_ms=60_000)
    mode = ["down"]

    def outage(request: httpx.Request) -> httpx.Response:
        if mode[0] == "503":
            body = {"type": "about:blank", "code": "log_unavailable", "detail": "log unavailable", "status": 503}
            return httpx.Response(503, json=body, headers={"content-type": "application/problem+json"})
        raise httpx.ConnectError("connection refused", request=request)

    with Reservoir(ledger.base, fallback=book, retry=QUICK, transport=httpx.MockTransport(outage)) as cut_off:
        with pytest.raises(LedgerUnreachable):
            cut_off.reserve(subject, route, units=10)  # the first failure: not yet
        mode[0] = "503"
        with pytest.raises(ReservationUnknown):
            cut_off.reserve(subject, route, units=10)  # may have landed: never local
        mode[0] = "down"
        local = cut_off.reserve(subject, route, units=10)  # the second failure
    assert local.extra.get("local_shard_id") == doc.shard_id, local
    books = book.books(doc.shard_id)
    assert books is not None and books.local_reserved_units == 10


class PolicyUnavailable(httpx.HTTPTransport):
    """The real server, except that reading a policy answers 503."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.startswith("/v1/policies/"):
            body = {"type": "https://reservoir.dev/problems/unavailable", "status": 503, "detail": "not now"}
            return httpx.Response(503, json=body, headers={"content-type": "application/problem+json"})
        return super().handle_request(request)


def test_issue_shard_reads_the_policy_before_it_issues(base: str, subject: str, route: str) -> None:
    """The policy (the shard's unit) is read first: when that read fails,
    nothing has been issued, so no units are retired out of reach."""
    publish(base, subject, route, burst=10_000, emergency=True)
    book = ShardBook("gw-py-1", 1, public_key(base))
    with Reservoir(base, fallback=book, retry=QUICK, transport=PolicyUnavailable()) as rsv:
        with pytest.raises(Unavailable):
            rsv.issue_shard(subject, route, 3_000, ttl_ms=600_000)
    p = assert_conserved(base, subject)
    assert (p["retired_for_emergency_units"], p["available_units"]) == (0, 10_000)


async def test_an_issue_whose_answers_are_lost_names_its_shard_id_for_the_repeat(base: str, subject: str, route: str) -> None:
    """The issue happened but its answers were lost: the error carries the
    shard id the call made up, and repeating the issue with it installs that
    one shard (the ledger answers the same document), not a second."""
    publish(base, subject, route, burst=10_000, emergency=True)
    book = ShardBook("gw-py-1", 1, public_key(base))
    fault = LoseAnswers(on("POST", "/v1/shards"), lose=10)
    with Reservoir(base, fallback=book, transport=fault, retry=QUICK) as rsv:
        with pytest.raises(OutcomeUnknown) as lost:
            rsv.issue_shard(subject, route, 3_000, ttl_ms=600_000)
    assert fault.budget.lost and fault.budget.lost[0] == 201
    shard_id = lost.value.shard_id
    assert shard_id is not None and shard_id.startswith("sh-")
    async with AsyncReservoir(base, fallback=book) as rsv:
        doc = await rsv.issue_shard(subject, route, 3_000, ttl_ms=600_000, shard_id=shard_id)
    assert (doc.shard_id, doc.units) == (shard_id, 3_000)
    p = assert_conserved(base, subject)
    assert (p["retired_for_emergency_units"], p["available_units"]) == (3_000, 7_000)


def test_a_full_connection_pool_never_admits_from_a_shard(base: str, subject: str, route: str) -> None:
    """A pool timeout says the client's own connections are busy, not that
    the ledger is down: the reserve raises ``RequestNotSent`` and the shard
    stays untouched."""
    publish(base, subject, route, burst=10_000, emergency=True)
    book = ShardBook("gw-py-1", 1, public_key(base))
    with Reservoir(base, fallback=book) as rsv:
        doc = rsv.issue_shard(subject, route, 1_000, ttl_ms=60_000)

    def starved(request: httpx.Request) -> httpx.Response:
        raise httpx.PoolTimeout("no connection free in the pool", request=request)

    with Reservoir(base, fallback=book, retry=QUICK, transport=httpx.MockTransport(starved)) as busy:
        with pytest.raises(RequestNotSent):
            busy.reserve(subject, route, units=10)
    assert book.books(doc.shard_id) == ShardBooks(allocated_units=1_000, local_available_units=1_000)


def test_a_local_settle_leaves_cache_reads_out_where_the_policy_does(base: str, subject: str, route: str) -> None:
    """The shard keeps its policy's ``exclude_cache_read_input_tokens``: a
    local settle from usage then charges the input without its cache reads,
    as the ledger would."""
    publish(base, subject, route, burst=10_000, emergency=True, exclude_cache_reads=True)
    book = ShardBook("gw-py-1", 1, public_key(base))
    with Reservoir(base, fallback=book) as rsv:
        doc = rsv.issue_shard(subject, route, 3_000, ttl_ms=60_000)

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with Reservoir(base, fallback=book, retry=QUICK, transport=httpx.MockTransport(down)) as cut_off:
        r = cut_off.reserve(subject, route, counted_input_tokens=100, max_tokens=200)
        assert r.extra["local_shard_id"] == doc.shard_id
        cut_off.start(r.id, "op")
        usage = Usage(output_tokens=40, counted_input_tokens=100, reported_input_tokens=20, cache_read_input_tokens=900)
        assert cut_off.settle(r.id, usage=usage).actual_units == 60
