"""Test doubles for fetching client metadata documents over real sockets.

``loopback_too`` admits 127.0.0.1 besides public addresses, so the document
server can run on loopback; everything else in the fetch is production code.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpcore2
from tls_testkit import ThrowawayCA

from auth.client_documents import ClientDocuments
from auth.ratelimit import Shares
from auth.safe_fetch import PublicFetcher
from jail.addresses import IPAddress, is_public_address


class SpyNetwork(httpcore2.AsyncNetworkBackend):
    """The real network, recording which address each connection went to."""

    def __init__(self) -> None:
        self.connected_to: list[str] = []
        self._real = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore2's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        self.connected_to.append(host)
        return await self._real.connect_tcp(host, port, timeout, local_address, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._real.sleep(seconds)


class Resolver:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError("Name or service not known")
        return self.answers[host]


def loopback_too(address: IPAddress) -> bool:
    return address.is_loopback or is_public_address(address)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


WHOLE_BUDGET = Shares(100, 100)


def documents(
    ca: ThrowawayCA,
    clock: Clock,
    *,
    timeout_s: float = 10.0,
    shares: Shares = WHOLE_BUDGET,
    **kw: float,
) -> ClientDocuments:
    """Documents from ``client.test`` (on loopback); by default one caller may spend the
    whole budget (the tests of the shares pass their own)."""
    fetcher = PublicFetcher(
        resolver=Resolver({"client.test": ["127.0.0.1"]}),
        allow=loopback_too,
        ssl_context=ca.client_context(),
        network=SpyNetwork(),
        ports=None,  # the test server listens on a random port
        timeout_s=timeout_s,
    )
    return ClientDocuments(fetcher, clock=clock, shares=shares, **kw)  # type: ignore[arg-type]
