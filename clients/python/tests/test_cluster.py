"""Both clients against two cluster nodes on Apache Kafka (the broker
``scripts/test`` starts; ``RESERVOIR_TEST_BROKERS``). Given the nodes, a
client learns the owner of a subject/route from the first answer a node
forwarded, and sends the later reserves of that route and every later step of
those reservations to the owner directly: the configured node forwards
nothing more. When the owner is killed, the client forgets it, goes back
through the configured node, and its steps complete once the partition is
taken over. Conservation holds on every partition afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import assert_conserved, publish, reservoir_bin
from reservoir_client import AsyncReservoir, Reservoir, RetryPolicy

pytestmark = pytest.mark.anyio

PARTITIONS = 4
# Take-over after a kill within the broker's session timeout set here.
SESSION_TIMEOUT_MS = "6000"


def brokers() -> str:
    found = os.environ.get("RESERVOIR_TEST_BROKERS")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but RESERVOIR_TEST_BROKERS is not set")
    pytest.skip("RESERVOIR_TEST_BROKERS is not set: scripts/test starts Apache Kafka (or eval $(scripts/kafka start))")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """Two ``reservoir serve`` nodes (c1, c2) of one group on a fresh topic."""

    def __init__(self, tmp: Path, brokers: str) -> None:
        topic = f"reservoir.python-cluster.{uuid.uuid4().hex[:12]}"
        ports = [free_port(), free_port()]
        self.bases = [f"http://127.0.0.1:{p}" for p in ports]
        self.procs: list[subprocess.Popen[bytes]] = []
        for i, port in enumerate(ports):
            self.procs.append(
                subprocess.Popen(
                    [
                        str(reservoir_bin()),
                        "serve",
                        "--log", "kafka",
                        "--brokers", brokers,
                        "--topic", topic,
                        "--topic-partitions", str(PARTITIONS),
                        "--cluster-group", f"{topic}.group",
                        "--node-id", f"c{i + 1}",
                        "--listen", f"127.0.0.1:{port}",
                        "--peers", ",".join(self.bases),
                        "--session-timeout-ms", SESSION_TIMEOUT_MS,
                        "--writer-shards", "2",
                        "--data-dir", str(tmp / f"c{i + 1}"),
                    ],  # fmt: skip
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "RESERVOIR_LOG_LEVEL": "warn"},
                )
            )
        self.wait_served({"c1", "c2"}, every_owner_serves=True)

    def wait_served(self, owners: set[str], *, every_owner_serves: bool, timeout_s: float = 60) -> None:
        """Until every node still running sees each partition served by ``owners``."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            ok = True
            for base, proc in zip(self.bases, self.procs):
                if proc.poll() is not None:
                    continue
                try:
                    view = httpx.get(f"{base}/v1/cluster", timeout=5).json()
                except (httpx.HTTPError, ValueError) as e:
                    ok, last = False, e
                    continue
                parts = view.get("partitions") or []
                served = {p.get("node_id") for p in parts}
                ok = ok and (
                    len(parts) == PARTITIONS
                    and all(p.get("state") == "serving" and p.get("node_id") in owners for p in parts)
                    and (not every_owner_serves or owners <= served)
                )
                last = view
            if ok:
                return
            time.sleep(0.2)
        raise AssertionError(f"partitions not served by {owners} within {timeout_s} s: {last}")

    def kill(self, i: int) -> None:
        self.procs[i].kill()
        self.procs[i].wait(10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, brokers())
    yield c
    c.stop()


def forwarded(base: str) -> int:
    """``reservoir_cluster_forwarded_total`` on the node at ``base``."""
    for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith("reservoir_cluster_forwarded_total "):
            return int(float(line.split()[1]))
    return 0


def subject_served_by(base: str, owner: str) -> str:
    """A fresh subject whose ``chat`` partition the node at ``owner`` serves,
    found by asking: a reserve through ``base`` names its owner when forwarded."""
    for _ in range(100):
        subject = f"t-{uuid.uuid4().hex[:10]}"
        publish(base, subject, "chat", burst=100_000)
        rid = f"probe-{uuid.uuid4().hex}"
        r = httpx.post(
            f"{base}/v1/reservations",
            json={"id": rid, "subject": subject, "route": "chat", "units": 1},
            headers={"idempotency-key": rid},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        httpx.post(f"{base}/v1/reservations/{rid}/release", json={}, timeout=30).raise_for_status()
        if (r.headers.get("x-reservoir-served-by") or "").rstrip("/") == owner:
            return subject
    raise AssertionError(f"no subject served by {owner} in 100 tries")


async def test_a_client_given_the_nodes_goes_to_the_owner_and_back_when_it_dies(cluster: Cluster) -> None:
    c1, c2 = cluster.bases
    subject = subject_served_by(c1, c2)

    def cycle(rsv: Reservoir, n: int) -> None:
        r = rsv.reserve(subject, "chat", units=10, reservation_id=f"{subject}-{n}-{uuid.uuid4().hex[:6]}")
        rsv.start(r.id, f"op-{r.id}")
        settled = rsv.settle(r.id, 4)
        assert (settled.state, settled.actual_units) == ("SETTLED", 4)

    slow = RetryPolicy(deadline_s=60, max_attempts=60, initial_backoff_s=0.05, max_backoff_s=1.0)
    # Without the nodes, every step through c1 is forwarded to c2.
    with Reservoir(c1, retry=slow) as unlisted:
        before = forwarded(c1)
        cycle(unlisted, 0)
        assert forwarded(c1) - before >= 3
    # With them, only the first reserve is.
    with Reservoir(c1, retry=slow, cluster_nodes=[c1, c2]) as listed:
        before = forwarded(c1)
        for n in range(1, 6):
            cycle(listed, n)
        assert 1 <= forwarded(c1) - before <= 2  # a 503 on the way sends one retry back through c1

    # The async client does the same; then the owner dies.
    async with AsyncReservoir(c1, retry=slow, cluster_nodes=[c1, c2]) as rsv:
        r = await rsv.reserve(subject, "chat", units=10)
        before = forwarded(c1)
        await rsv.start(r.id, f"op-{r.id}")
        assert forwarded(c1) == before
        cluster.kill(1)
        settled = await rsv.settle(r.id, 4)  # c2 is gone: back through c1, which takes the partition over
        assert settled.state == "SETTLED"
        again = await rsv.reserve(subject, "chat", units=10)
        await rsv.release(again.id)
    cluster.wait_served({"c1"}, every_owner_serves=False)
    books = assert_conserved(c1, subject)
    # 7 cycles of 10 reserved and 4 spent; the probe and the last one released.
    assert (books["spent_units"], books["reserved_units"]) == (7 * 4, 0)
