"""Sign-in with three real server processes on one PostgreSQL and one state dir (one
token key), as an operator runs several workers: every step of a sign-in may reach
another process, and single use, rotation, revocation and the budgets still hold.

Each test signs in from its own network (a trusted proxy's X-Forwarded-For, one /24
of the benchmarking range 198.18.0.0/15 each), so the per-address and per-network
budgets of one test do not touch another's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx2
import pytest
import sqlalchemy as sa
from db_testkit import fresh_postgres_blocking
from e2e_server import DEFAULT_SHARES, RunningServer, Servers, free_port
from mcp_http import call_tool
from oauth_browser import ManualClient, pkce_pair, query_of, read_page
from sqlalchemy.ext.asyncio import create_async_engine

from auth.config import AuthConfig

pytestmark = pytest.mark.e2e

SIGNINS_PER_MINUTE = 3
REGISTRATIONS_PER_MINUTE = 6  # of which one address may spend 5%, rounded up: 1
VERIFIED_CACHE_S = AuthConfig(issuer="https://unused").verified_cache_s  # the server's own


@dataclass
class Cluster:
    servers: list[RunningServer]
    database_url: str
    client_id: str

    def client(self, number: int) -> ManualClient:
        """The module's registered client, talking to process ``number``."""
        return ManualClient(self.servers[number].base_url, self.client_id)


@pytest.fixture(scope="module")
def cluster(serve_module: Servers) -> Iterator[Cluster]:
    first_port = free_port()
    with fresh_postgres_blocking() as database_url:
        env = {
            "SANDBOX_MCP_AUTH": "oauth",
            "SANDBOX_MCP_DATABASE_URL": database_url,
            # One public address for all three, as behind the operator's proxy.
            "SANDBOX_MCP_PUBLIC_URL": f"http://127.0.0.1:{first_port}",
            "SANDBOX_MCP_TRUSTED_PROXIES": "127.0.0.1",
            "SANDBOX_MCP_POOL_SIZE": "2",
            "SANDBOX_MCP_SIGNINS_PER_MINUTE": str(SIGNINS_PER_MINUTE),
            "SANDBOX_MCP_REGISTRATIONS_PER_MINUTE": str(REGISTRATIONS_PER_MINUTE),
            "SANDBOX_MCP_SANDBOXES_PER_ADDRESS": "1000",
            **DEFAULT_SHARES,
        }
        servers: list[RunningServer] = []
        try:
            servers.append(serve_module(port=first_port, **env))
            for _ in range(2):  # processes of the first one's deployment: its state dir
                servers.append(serve_module(state_dir=servers[0].state_dir, **env))
            response = httpx2.post(
                f"{servers[0].base_url}/register",
                json={"redirect_uris": ["http://127.0.0.1:9/callback"], "client_name": "c"},
                headers={"x-forwarded-for": "192.0.2.1"},
            )
            assert response.status_code == 201, response.text
            yield Cluster(servers, database_url, response.json()["client_id"])
        finally:  # before their database goes
            for server in servers:
                serve_module.stop(server)


_next_address = iter(range(10, 250))


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    """A browser and client on a network of its own."""
    address = f"198.18.{next(_next_address)}.1"
    async with httpx2.AsyncClient(timeout=30, headers={"x-forwarded-for": address}) as client:
        yield client


async def sign_in(
    http: httpx2.AsyncClient, cluster: Cluster, page_on: int, button_on: int
) -> tuple[str, str]:
    """The page from one process, the button pressed on another: (code, verifier)."""
    verifier, challenge = pkce_pair()
    page = read_page(await http.get(cluster.client(page_on).authorize_url(challenge)))
    pressed = await http.post(
        f"{cluster.servers[button_on].base_url}/authorize",
        data={"tx": page.tx, "csrf": page.csrf},
        headers={"cookie": f"{page.cookie_name}={page.cookie}"},
    )
    assert pressed.status_code == 303, pressed.text
    return query_of(pressed.headers["location"])["code"], verifier


async def tokens_via(
    http: httpx2.AsyncClient, cluster: Cluster, page_on: int, button_on: int, token_on: int
) -> dict[str, str]:
    code, verifier = await sign_in(http, cluster, page_on, button_on)
    answer = await cluster.client(token_on).exchange(http, code, verifier)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def test_authorize_button_and_token_each_on_another_process(
    http: httpx2.AsyncClient, cluster: Cluster
) -> None:
    pair = await tokens_via(http, cluster, page_on=0, button_on=1, token_on=2)
    for server in cluster.servers:
        called = await call_tool(http, server.base_url, pair["access_token"])
        assert called.status_code == 200, called.text


async def test_a_double_press_on_two_processes_gives_one_code(
    http: httpx2.AsyncClient, cluster: Cluster
) -> None:
    _, challenge = pkce_pair()
    page = read_page(await http.get(cluster.client(0).authorize_url(challenge)))
    answers = [
        await http.post(
            f"{server.base_url}/authorize",
            data={"tx": page.tx, "csrf": page.csrf},
            headers={"cookie": f"{page.cookie_name}={page.cookie}"},
        )
        for server in cluster.servers[1:]
    ]
    assert [a.status_code for a in answers] == [303, 303]
    assert answers[0].headers["location"] == answers[1].headers["location"]


async def test_a_code_replayed_on_another_process_is_refused_and_revokes(
    http: httpx2.AsyncClient, cluster: Cluster
) -> None:
    code, verifier = await sign_in(http, cluster, page_on=0, button_on=0)
    first = await cluster.client(0).exchange(http, code, verifier)
    assert first.status_code == 200, first.text
    replay = await cluster.client(1).exchange(http, code, verifier)
    assert replay.status_code == 400
    assert replay.json()["error"] == "invalid_grant"
    assert "already used" in replay.json()["error_description"]
    refreshed = await cluster.client(2).refresh(http, first.json()["refresh_token"])
    assert refreshed.status_code == 400, "the replay revoked the whole family"
    for server in cluster.servers:
        called = await call_tool(http, server.base_url, first.json()["access_token"])
        assert called.status_code == 401


async def test_a_refresh_raced_on_two_processes_gets_one_pair(
    http: httpx2.AsyncClient, cluster: Cluster
) -> None:
    pair = await tokens_via(http, cluster, page_on=1, button_on=1, token_on=1)
    engine = create_async_engine(cluster.database_url)
    try:
        for _ in range(5):  # five races, each released at once on two processes
            racing = await asyncio.gather(
                cluster.client(0).refresh(http, pair["refresh_token"]),
                cluster.client(2).refresh(http, pair["refresh_token"]),
            )
            assert [r.status_code for r in racing] == [200, 200], [r.text for r in racing]
            assert racing[0].json() == racing[1].json(), "both got the same pair"
            pair = dict(racing[0].json())
            async with engine.connect() as conn:
                widest = await conn.execute(
                    sa.text(
                        "SELECT max(n) FROM (SELECT count(*) AS n FROM oauth_tokens "
                        "WHERE role = 'refresh' AND rotated_at IS NULL GROUP BY grant_id) AS f"
                    )
                )
                assert widest.scalar_one() == 1, "no family forked: one live refresh token"
    finally:
        await engine.dispose()
    called = await call_tool(http, cluster.servers[1].base_url, pair["access_token"])
    assert called.status_code == 200


async def test_a_token_revoked_on_one_process_is_refused_by_another_within_seconds(
    http: httpx2.AsyncClient, cluster: Cluster
) -> None:
    pair = await tokens_via(http, cluster, page_on=0, button_on=0, token_on=0)
    # Process 0 verifies the token and caches it.
    assert (
        await call_tool(http, cluster.servers[0].base_url, pair["access_token"])
    ).status_code == 200
    revoked = await http.post(
        f"{cluster.servers[1].base_url}/revoke",
        data={"token": pair["refresh_token"], "client_id": cluster.client_id},
    )
    assert revoked.status_code == 200
    started = time.monotonic()
    slowest_round = 0.0
    while True:
        round_started = time.monotonic()
        status = (
            await call_tool(http, cluster.servers[0].base_url, pair["access_token"])
        ).status_code
        if status == 401:
            break
        assert status == 200
        # Only a bound on the loop: the verdict is the measured bound below, which
        # slow rounds on a busy machine can push past 20 s.
        assert time.monotonic() - started < 120, "still accepted 120 s after the revocation"
        await asyncio.sleep(0.25)
        slowest_round = max(slowest_round, time.monotonic() - round_started)
    elapsed = time.monotonic() - started
    print(
        f"revocation on process 1 refused on process 0 after {elapsed:.1f} s "
        f"(slowest poll round {slowest_round:.2f} s)"
    )
    # The floor, measured here: the cache's 5 s, and the poll rounds around its end
    # (the refusal can come a round after the expiry, which a call can also straddle).
    bound = VERIFIED_CACHE_S + 2 * slowest_round + 1
    assert elapsed < bound, f"the verified-token cache holds a token {VERIFIED_CACHE_S} s at most"


async def refused_after(http: httpx2.AsyncClient, url: str, token: str) -> float:
    """Seconds until ``token`` is refused at ``url`` (asked every 20 ms), bounded at 20 s."""
    started = time.monotonic()
    while (status := (await call_tool(http, url, token)).status_code) == 200:
        assert time.monotonic() - started < 20, "still accepted 20 s after the revocation"
        await asyncio.sleep(0.02)
    assert status == 401
    return time.monotonic() - started


@pytest.mark.parametrize("revoked", ["refresh_token", "access_token"])
async def test_a_revocation_reaches_every_process_at_once(
    http: httpx2.AsyncClient, cluster: Cluster, revoked: str
) -> None:
    """Issue 23, finding 10: process 0 cached the token it verified, and went on accepting
    it for up to 5 s after process 1 revoked it. Now the revoking transaction notifies
    every process, which drops it at once."""
    pair = await tokens_via(http, cluster, page_on=0, button_on=0, token_on=0)
    url = cluster.servers[0].base_url
    cached_at = time.monotonic()
    assert (await call_tool(http, url, pair["access_token"])).status_code == 200  # cached
    revoked_answer = await http.post(
        f"{cluster.servers[1].base_url}/revoke",
        data={"token": pair[revoked], "client_id": cluster.client_id},
    )
    assert revoked_answer.status_code == 200
    # How long the cache alone would still accept it (measured, not assumed).
    cache_left = VERIFIED_CACHE_S - (time.monotonic() - cached_at)
    assert cache_left > 1, "the revocation took most of the cache's life: this run cannot tell"
    elapsed = await refused_after(http, url, pair["access_token"])
    print(
        f"{revoked} revoked on process 1: refused on process 0 after {elapsed:.3f} s "
        f"(the cache alone: {cache_left:.2f} s more)"
    )
    assert elapsed < cache_left / 2, "refused on the notification, not at the cache's end"


async def test_the_signin_burst_is_one_budget_for_all_processes(
    http: httpx2.AsyncClient, cluster: Cluster
) -> None:
    for number in range(SIGNINS_PER_MINUTE):
        await sign_in(http, cluster, page_on=number, button_on=number)
    _, challenge = pkce_pair()
    for server in cluster.servers:
        page = read_page(await http.get(cluster.client(0).authorize_url(challenge)))
        refused = await http.post(
            f"{server.base_url}/authorize",
            data={"tx": page.tx, "csrf": page.csrf},
            headers={"cookie": f"{page.cookie_name}={page.cookie}"},
        )
        assert refused.status_code == 429, "another process did not grant the budget again"
        assert "in the last minute" in refused.text


async def test_registrations_are_one_budget_for_all_processes(
    http: httpx2.AsyncClient, cluster: Cluster
) -> None:
    statuses = []
    for server in cluster.servers:
        response = await http.post(
            f"{server.base_url}/register", json={"redirect_uris": ["http://127.0.0.1:9/cb"]}
        )
        statuses.append(response.status_code)
    # One address may spend 5% of the budget, rounded up: 1, whichever process it asks.
    assert statuses == [201, 429, 429]
