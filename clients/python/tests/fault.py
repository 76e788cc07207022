"""The fault injector for lost answers: an httpx transport that sends the
request to the real server, waits for its answer (so the server has
committed whatever it decided), and then raises a read error instead of
returning it, as a connection dropped after the server replied would.

With ``reach_server=False`` the request is lost on the way instead: the
client sees the same read error, but nothing reached the server. From the
client's side the two cannot be told apart, which is the point.
"""

from __future__ import annotations

from typing import Callable

import httpx

Match = Callable[[httpx.Request], bool]


def on(method: str, path_suffix: str) -> Match:
    return lambda r: r.method == method and r.url.path.endswith(path_suffix)


class _Budget:
    def __init__(self, match: Match, lose: int, reach_server: bool) -> None:
        self.match = match
        self.lose = lose
        self.reach_server = reach_server
        self.lost: list[int] = []  # statuses of the answers that were dropped
        self.sent = 0  # matching requests that reached the server

    def lose_request(self, request: httpx.Request) -> bool:
        """Whether to drop ``request`` before it reaches the server."""
        if self.reach_server or not self.match(request) or len(self.lost) >= self.lose:
            return False
        self.lost.append(0)
        return True

    def drop(self, request: httpx.Request, response: httpx.Response) -> bool:
        if not self.match(request):
            return False
        self.sent += 1
        if not self.reach_server or len(self.lost) >= self.lose:
            return False
        self.lost.append(response.status_code)
        return True


class LoseAnswers(httpx.BaseTransport):
    """Drops the answers of the first ``lose`` requests ``match`` selects."""

    def __init__(self, match: Match, lose: int = 1, *, reach_server: bool = True) -> None:
        self.inner = httpx.HTTPTransport()
        self.budget = _Budget(match, lose, reach_server)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.budget.lose_request(request):
            raise httpx.ReadError("fault injector: request lost", request=request)
        response = self.inner.handle_request(request)
        response.read()
        if self.budget.drop(request, response):
            response.close()
            raise httpx.ReadError("fault injector: answer lost", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncLoseAnswers(httpx.AsyncBaseTransport):
    """The async twin of :class:`LoseAnswers`."""

    def __init__(self, match: Match, lose: int = 1, *, reach_server: bool = True) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.budget = _Budget(match, lose, reach_server)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.budget.lose_request(request):
            raise httpx.ReadError("fault injector: request lost", request=request)
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if self.budget.drop(request, response):
            await response.aclose()
            raise httpx.ReadError("fault injector: answer lost", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class AsyncProxyAnswers(httpx.AsyncBaseTransport):
    """A proxy in front of the server that forwards the first ``times``
    requests ``match`` selects, waits for the server's answer (so it
    committed), and answers ``status`` (502, 504) with an HTML page of its
    own instead, as a proxy whose read timeout is shorter than the server's
    answer does."""

    def __init__(self, match: Match, status: int, times: int = 1) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.budget = _Budget(match, times, reach_server=True)
        self.status = status

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if self.budget.drop(request, response):
            await response.aclose()
            page = f"<html><body><h1>{self.status}</h1>the upstream did not answer in time</body></html>"
            return httpx.Response(self.status, headers={"content-type": "text/html"}, text=page, request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()
