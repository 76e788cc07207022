"""Both clients against a server that authenticates (its own process, with a
tokens file made by ``reservoir token create``): the gateway token of
``token=`` is sent on every step; no token is :class:`Unauthorized`, another
tenant's token is :class:`Forbidden` for a reserve and sees the reservation as
one that does not exist. Neither refusal is retried."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from conftest import Server, assert_conserved, publish, reservoir_bin
from reservoir_client import AsyncReservoir, Forbidden, Reservoir, RetryPolicy, Unauthorized, UnknownReservation

pytestmark = pytest.mark.anyio

TENANT_A = f"t-a-{uuid.uuid4().hex[:8]}"
TENANT_B = f"t-b-{uuid.uuid4().hex[:8]}"


def create_token(tokens_file: Path, principal: str, *args: str) -> str:
    out = subprocess.run(
        [str(reservoir_bin()), "token", "create", "--tokens-file", str(tokens_file), "--principal", principal, *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


class Authenticated:
    def __init__(self, data_dir: Path) -> None:
        tokens = data_dir / "tokens.toml"
        self.operator = create_token(tokens, "ops", "--scope", "operator")
        self.gateway_a = create_token(tokens, "gw-a", "--scope", "gateway", "--subject", TENANT_A)
        self.gateway_b = create_token(tokens, "gw-b", "--scope", "gateway", "--subject", TENANT_B)
        self.server = Server(data_dir, "--tokens-file", str(tokens))
        self.base = self.server.base


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Authenticated]:
    a = Authenticated(tmp_path_factory.mktemp("reservoir-auth"))
    yield a
    assert a.server.stop() == 0


def no_retry() -> RetryPolicy:
    return RetryPolicy(deadline_s=5)


def test_sync_gateway_token_reserves_and_refusals_are_typed(ledger: Authenticated) -> None:
    route = f"chat-{uuid.uuid4().hex[:8]}"
    publish(ledger.base, TENANT_A, route, token=ledger.operator)
    with Reservoir(ledger.base, token=ledger.gateway_a) as rsv:
        r = rsv.reserve(TENANT_A, route, units=500)
        rsv.start(r.id, "op-1")
        assert rsv.settle(r.id, actual_units=200).state == "SETTLED"
    with Reservoir(ledger.base, retry=no_retry()) as anonymous:
        with pytest.raises(Unauthorized) as e:
            anonymous.reserve(TENANT_A, route, units=1)
        assert e.value.status == 401 and not e.value.retryable
    with Reservoir(ledger.base, token=ledger.gateway_b, retry=no_retry()) as other:
        with pytest.raises(Forbidden) as f:
            other.reserve(TENANT_A, route, units=1)
        assert f.value.status == 403
        with pytest.raises(UnknownReservation):
            other.get_reservation(r.id)
    p = assert_conserved(ledger.base, TENANT_A, token=ledger.operator)
    assert (p["spent_units"], p["reserved_units"]) == (200, 0)


async def test_async_gateway_token_reserves_and_releases(ledger: Authenticated) -> None:
    route = f"chat-{uuid.uuid4().hex[:8]}"
    publish(ledger.base, TENANT_B, route, token=ledger.operator)
    async with AsyncReservoir(ledger.base, token=ledger.gateway_b) as rsv:
        r = await rsv.reserve(TENANT_B, route, units=300)
        assert (await rsv.release(r.id)).state == "RELEASED"
    async with AsyncReservoir(ledger.base, token="rsv_not-a-token", retry=no_retry()) as bad:
        with pytest.raises(Unauthorized):
            await bad.reserve(TENANT_B, route, units=1)
    p = assert_conserved(ledger.base, TENANT_B, token=ledger.operator)
    assert (p["spent_units"], p["reserved_units"]) == (0, 0)


def test_a_token_read_from_a_file_keeps_working_with_its_newline(ledger: Authenticated, tmp_path: Path) -> None:
    """``reservoir token create`` and the server's operator.token end with a
    newline; read from a file, the token still authenticates (the
    surrounding whitespace is stripped), as ``Bearer $(cat ...)`` does."""
    route = f"chat-{uuid.uuid4().hex[:8]}"
    publish(ledger.base, TENANT_A, route, token=ledger.operator)
    saved = tmp_path / "gateway.token"
    saved.write_text(ledger.gateway_a + "\n")
    with Reservoir(ledger.base, token=saved.read_text(), retry=RetryPolicy(deadline_s=1)) as rsv:
        r = rsv.reserve(TENANT_A, route, units=10)
        assert rsv.release(r.id).state == "RELEASED"


@pytest.mark.parametrize("token", ["rsv_a b", "rsv_a\nb", "rsv_\x00", "rsv_é", "", " \n"])
def test_a_token_that_cannot_be_a_header_is_refused_at_once(token: str) -> None:
    """Not an answer lost after 10 s of retries: a ``ValueError`` when the
    client is made."""
    with pytest.raises(ValueError, match="token"):
        Reservoir("http://127.0.0.1:9", token=token)
    with pytest.raises(ValueError, match="token"):
        AsyncReservoir("http://127.0.0.1:9", token=token)
