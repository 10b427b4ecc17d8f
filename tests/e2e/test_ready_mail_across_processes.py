"""The "ready" e-mail with three real server processes on one PostgreSQL (issue 14).

A pool of one slot, a real SMTP server (aiosmtpd on loopback) and an hourly cap of
one message. User A holds the slot through process 1, the elected watchdog's.
User B presses the button on process 2 with an address (kept in process 2's memory
only) and queues there; user C does the same on process 3. The watchdog (process 1)
empties A's idle slot and reserves it for B: process 1 has no address, so it tells
the others, and process 2 sends B's message, once. B is served, goes quiet, and
the slot passes to C: process 3 holds C's address but the hour's one message is
spent (by process 2), so it sends nothing and logs that it skipped one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from db_testkit import fresh_postgres
from e2e_server import RunningServer, free_port, start_server, stop_server
from mcp_http import probe
from oauth_browser import ManualClient, pkce_pair, press_button, query_of, read_page
from smtp_testkit import smtp_server

pytestmark = pytest.mark.e2e

IDLE_S = 10  # the shortest idle timeout
B_MAIL, C_MAIL = "b-waiter@example.test", "c-waiter@example.test"


async def sign_in(http: httpx2.AsyncClient, server: RunningServer, email: str = "") -> str:
    """The button pressed on ``server`` (with ``email`` typed in); an access token."""
    client = await ManualClient.register(http, server.base_url)
    verifier, challenge = pkce_pair()
    page = read_page(await http.get(client.authorize_url(challenge)))
    assert "E-mail me once" in page.html  # SMTP configured: the page offers it
    answer = await press_button(http, server.base_url, page, email=email)
    assert answer.status_code == 303, answer.text
    code = query_of(answer.headers["location"])["code"]
    response = await client.exchange(http, code, verifier)
    assert response.status_code == 200, response.text
    return str(response.json()["access_token"])


async def until(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def wait_in_queue(
    http: httpx2.AsyncClient, server: RunningServer, token: str, served: asyncio.Event
) -> None:
    """Keep a place in the queue as a waiting client does, until served once."""
    while True:
        result = await probe(http, server, token)
        if not result["is_error"]:
            served.set()
            return
        assert result["error"]["code"] == "SANDBOX_QUEUED", result
        await asyncio.sleep(1)


async def test_the_holder_of_the_address_sends_once_and_the_cap_spans_processes(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with smtp_server("none") as (inbox, smtp_port):
        async with fresh_postgres() as url:
            ports = [free_port() for _ in range(3)]
            env = {
                "SANDBOX_MCP_AUTH": "oauth",
                "SANDBOX_MCP_DATABASE_URL": url,
                "SANDBOX_MCP_PUBLIC_URL": f"http://127.0.0.1:{ports[0]}",
                "SANDBOX_MCP_POOL_SIZE": "1",
                "SANDBOX_MCP_IDLE_TIMEOUT_S": str(IDLE_S),
                "SANDBOX_MCP_QUEUE_WAIT_S": "0",
                "SANDBOX_MCP_SMTP_HOST": "127.0.0.1",
                "SANDBOX_MCP_SMTP_PORT": str(smtp_port),
                "SANDBOX_MCP_SMTP_SECURITY": "none",
                "SANDBOX_MCP_SMTP_SENDER": "sandbox@example.test",
                "SANDBOX_MCP_SMTP_MAX_PER_HOUR": "1",
            }
            servers: list[RunningServer] = []
            try:
                # Process 1 first, so that it holds the watchdog: the hand-overs happen
                # there, where no address is.
                servers.append(start_server(state, probe=True, port=ports[0], **env))
                first = servers[0]
                await until(lambda: "watchdog.elected" in first.log(), "an elected watchdog", 30)
                for port in ports[1:]:
                    servers.append(start_server(state, probe=True, port=port, **env))
                one, two, three = servers
                holder = await sign_in(http, one)
                b_token = await sign_in(http, two, B_MAIL)
                c_token = await sign_in(http, three, C_MAIL)
                assert not (await probe(http, one, holder))["is_error"]
                queued = await probe(http, two, b_token)
                assert queued["error"]["code"] == "SANDBOX_QUEUED", queued
                b_served, c_served = asyncio.Event(), asyncio.Event()
                b_waits = asyncio.create_task(wait_in_queue(http, two, b_token, b_served))
                c_waits = asyncio.create_task(wait_in_queue(http, three, c_token, c_served))
                # A goes quiet: the watchdog frees its slot after the idle timeout.
                await asyncio.wait_for(b_served.wait(), 6 * IDLE_S)
                await inbox.arrival(1, to=B_MAIL, timeout_s=30)
                # B goes quiet too: the slot passes to C, whose message the cap stops.
                await asyncio.wait_for(c_served.wait(), 6 * IDLE_S)
                await b_waits
                await c_waits
                await until(
                    lambda: '"mail.skipped_rate_limit"' in three.log(), "the skipped message", 30
                )
                # The hand-overs were process 1's (checked before the stop: once process 1
                # stops, another process takes the watchdog over, as it should).
                assert "watchdog.elected" not in two.log() + three.log()
            finally:
                for server in servers:
                    stop_server(server)
    assert [message.recipients for message in inbox.received] == [[B_MAIL]]
    assert '"mail.sent"' in two.log()
    assert '"mail.sent"' not in one.log() + three.log()
    for server in servers:
        assert B_MAIL not in server.log()
        assert C_MAIL not in server.log()
