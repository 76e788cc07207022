"""Fixtures for the client tests: the real ``reservoir`` binary on the embedded
log in a temporary data directory (one server for the session; every test
uses subjects of its own), a fake model provider, policies, and the
conservation check every state-changing test ends with.

The binary is ``$RESERVOIR_BIN``, else ``$CARGO_TARGET_DIR/release/reservoir``
(default target ``~/.cache/reservoir-target``). A missing binary fails the
run; nothing here skips.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from fake_provider import FakeProvider

SOURCES = ("opening_units", "minted_units", "reminted_units", "moved_in_units", "overdraft_issued_units")
DESTINATIONS = (
    "available_units",
    "reserved_units",
    "spent_units",
    "retired_for_emergency_units",
    "overdraft_repaid_units",
    "moved_out_units",
)


def reservoir_bin() -> Path:
    explicit = os.environ.get("RESERVOIR_BIN")
    if explicit:
        path = Path(explicit)
    else:
        target = os.environ.get("CARGO_TARGET_DIR") or str(Path.home() / ".cache" / "reservoir-target")
        path = Path(target) / "release" / "reservoir"
    if not path.is_file():
        raise pytest.UsageError(
            f"no reservoir binary at {path}: build it with "
            "`CARGO_TARGET_DIR=$HOME/.cache/reservoir-target cargo build --release -p reservoir-server` "
            "or set RESERVOIR_BIN"
        )
    return path


class Server:
    """A running ``reservoir serve`` child process."""

    def __init__(self, data_dir: Path, *extra_args: str) -> None:
        self.stderr_lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                str(reservoir_bin()),
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--writer-shards",
                "2",
                "--sweep-interval-ms",
                "100",
                "--refill-interval-ms",
                "100",
                "--data-dir",
                str(data_dir),
                *extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "RESERVOIR_LOG_LEVEL": "info", "NO_COLOR": "1"},
        )
        addr: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_stderr, args=(addr,), daemon=True).start()
        try:
            self.base = "http://" + addr.get(timeout=30)
        except queue.Empty:
            self.proc.kill()
            raise RuntimeError("reservoir printed no address:\n" + "\n".join(self.stderr_lines)) from None
        self._wait_ready()

    def _read_stderr(self, addr: queue.Queue[str]) -> None:
        assert self.proc.stderr is not None
        sent = False
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip())
            if not sent and "addr=" in line:
                addr.put(line.split("addr=", 1)[1].split()[0])
                sent = True

    def _wait_ready(self) -> None:
        with httpx.Client(base_url=self.base) as c:
            for _ in range(3000):
                try:
                    if c.get("/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if self.proc.poll() is not None:
                    break
                threading.Event().wait(0.01)
        raise RuntimeError("reservoir never became ready:\n" + "\n".join(self.stderr_lines))

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("reservoir-data"))
    yield s
    code = s.stop()
    assert code == 0, "reservoir did not stop cleanly on SIGTERM:\n" + "\n".join(s.stderr_lines[-30:])


@pytest.fixture
def base(server: Server) -> str:
    return server.base


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def subject() -> str:
    """A subject no other test uses, so each test has partitions of its own."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def route() -> str:
    """A route no other test uses (route estimates are kept per route)."""
    return f"chat-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def provider() -> Iterator[FakeProvider]:
    p = FakeProvider()
    yield p
    p.close()


@pytest.fixture(autouse=True)
def _reset_provider(provider: FakeProvider) -> None:
    provider.reset()


def publish(
    base: str,
    subject: str,
    route: str,
    *,
    burst: int = 100_000,
    refill_per_s: int = 0,
    max_reservation: int | None = None,
    estimator: dict[str, Any] | None = None,
    three_dimensions: bool = False,
    emergency: bool = False,
    shadow: bool = False,
    exclude_cache_reads: bool = False,
    token: str | None = None,
) -> None:
    """Publishes generation 1 of a token policy, opening full; with
    ``three_dimensions``, 1,000 requests (the primary dimension) plus ``burst``
    input tokens and ``burst`` output tokens, as a provider limits them;
    with ``emergency``, shards may be carved from it; with ``shadow``, it only
    records what it would have refused; with ``exclude_cache_reads``, cache-read
    input tokens are left out of its input dimensions at settle."""
    policy = {
        "subject": subject,
        "route": route,
        "region": "test",
        "capacity_unit": "tokens",
        "refill": {"units": refill_per_s, "interval_ms": 1000},
        "burst_units": burst,
        "opening_units": burst,
        "estimator_digest": "",
        "max_reservation_units": max_reservation or burst,
        "hold_ttl_ms": 180_000,
        "hard_execution_limit_ms": 600_000,
        "max_overdraft_units": burst,
        "priority": 0,
        "emergency_mode": "enabled" if emergency else "disabled",
        "shadow_mode": shadow,
        "generation": 1,
    }
    if exclude_cache_reads:
        policy["exclude_cache_read_input_tokens"] = True
    if three_dimensions:
        policy.update(capacity_unit="requests", burst_units=1_000, opening_units=1_000, max_reservation_units=1)
        policy["dimensions"] = [
            {
                "dimension": name,
                "refill": {"units": refill_per_s, "interval_ms": 1000},
                "burst_units": burst,
                "opening_units": burst,
                "max_reservation_units": max_reservation or burst,
                "max_overdraft_units": burst,
            }
            for name in ("input_tokens", "output_tokens")
        ]
    body: dict[str, Any] = {"accounting_epoch": "e", "policy": policy}
    if estimator is not None:
        body["estimator"] = estimator
    r = httpx.post(f"{base}/v1/policies", json=body, headers=_bearer(token))
    assert r.status_code == 201, r.text


def _bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"authorization": f"Bearer {token}"}


def partitions(base: str, token: str | None = None) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/v1/partitions", headers=_bearer(token))
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list)
    return body


def assert_conserved(base: str, subject: str, token: str | None = None) -> dict[str, Any]:
    """Conservation on every partition of the server, recomputed here from
    the terms (not trusting the server's own verdict alone); returns the one
    partition of ``subject`` (each test publishes one route per subject)."""
    mine = []
    for partition in partitions(base, token):
        for p in [partition, *partition.get("dimensions", [])]:
            _check_terms(p)
        if partition["subject"] == subject:
            mine.append(partition)
    assert len(mine) == 1, f"expected one partition of {subject}, found {mine}"
    return mine[0]


def _check_terms(p: dict[str, Any]) -> None:
    """One dimension's books: the equation and the debt line."""
    assert p["conservation"] == "ok", json.dumps(p)
    sources = sum(p[t] for t in SOURCES)
    destinations = sum(p[t] for t in DESTINATIONS)
    assert sources == destinations, json.dumps(p)
    assert p["debt_units"] == (
        p["overdraft_issued_units"] + p["debt_moved_in_units"] - p["overdraft_repaid_units"] - p["debt_moved_out_units"]
    ), json.dumps(p)


def route_estimate(base: str, route: str, model: str, receipt_position: Any) -> dict[str, Any]:
    """The route's learnt output estimate for ``model``, once the projection
    has consumed the log up to ``receipt_position`` (a settle's receipt)."""
    r = httpx.get(
        f"{base}/v1/routes/{route}/estimate",
        params={
            "model": model,
            "min_position": f"{receipt_position.log_partition}:{receipt_position.offset}",
            "wait_ms": "10000",
        },
        timeout=15,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, dict)
    return body
