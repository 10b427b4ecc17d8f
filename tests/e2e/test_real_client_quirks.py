"""What real MCP clients do, over HTTP against the real server (issue 11).

Each test replays a publicly reported client behaviour with raw JSON-RPC, the way
the client sends it:

- claude.ai never echoes ``Mcp-Session-Id`` and sends consecutive requests from
  different backend nodes (anthropics/claude-ai-mcp#975, #99, #583);
- it keeps replaying a session id from before a restart and never re-initializes
  (anthropics/claude-code#27425, #48557);
- its connectors send a 2026-07-28 body under a ``MCP-Protocol-Version: 2025-11-25``
  header (anthropics/claude-code#93290), or under no header (anthropics/claude-ai-mcp#70).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
from e2e_server import RunningServer, Servers, start_server, stop_server
from held_slot import QUEUE_WAIT_S, a_held_slot
from mcp_http import LEGACY, SESSIONLESS_META, legacy_rpc, read_jsonrpc
from oauth_browser import new_user, new_users

pytestmark = pytest.mark.e2e

ENV = {
    "SANDBOX_MCP_AUTH": "oauth",
    "SANDBOX_MCP_POOL_SIZE": "2",
    "SANDBOX_MCP_SIGNINS_PER_MINUTE": "100",
}
MISMATCH_EVENT = "mcp.protocol_version_header_mismatch"


@pytest.fixture
def oauth_server(serve: Servers) -> RunningServer:
    return serve(**ENV)


async def initialize(
    http: httpx2.AsyncClient, server: RunningServer, token: str, name: str = "claude-ai"
) -> httpx2.Response:
    response = await legacy_rpc(
        http,
        server,
        token,
        "initialize",
        {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": name, "version": "1.0"},
        },
    )
    assert response.status_code == 200, response.text
    result = read_jsonrpc(response)["result"]
    assert result["protocolVersion"] == LEGACY
    assert result["serverInfo"]["name"] == "sandbox-mcp"
    return response


async def legacy_tool(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    name: str,
    arguments: dict[str, Any],
    *,
    session_id: str | None = None,
    request_id: int = 1,
    **meta: str,
) -> dict[str, Any]:
    """A legacy tools/call (no session id unless given); asserts a normal result,
    returns its structured content."""
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta:
        params["_meta"] = meta
    response = await legacy_rpc(
        http, server, token, "tools/call", params, session_id=session_id, request_id=request_id
    )
    assert response.status_code == 200, response.text
    result = read_jsonrpc(response)["result"]
    assert not result.get("isError"), result
    return dict(result["structuredContent"])


async def legacy_status(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    *,
    session_id: str | None = None,
    request_id: int = 2,
) -> dict[str, Any]:
    """A legacy tools/call of sandbox_status."""
    return await legacy_tool(
        http, server, token, "sandbox_status", {}, session_id=session_id, request_id=request_id
    )


async def test_a_client_that_never_echoes_the_session_id_calls_tools(
    http: httpx2.AsyncClient, oauth_server: RunningServer
) -> None:
    token = await new_user(http, oauth_server.base_url)
    await initialize(http, oauth_server, token)
    # Whatever the initialize answer carried, this client never sends it back.
    initialized = await legacy_rpc(
        http, oauth_server, token, "notifications/initialized", request_id=None
    )
    assert initialized.status_code == 202, initialized.text
    listed = await legacy_rpc(http, oauth_server, token, "tools/list", {})
    assert listed.status_code == 200, listed.text
    names = {tool["name"] for tool in read_jsonrpc(listed)["result"]["tools"]}
    assert {"sandbox_status", "create_experiment"} <= names
    sandboxes = {
        (await legacy_status(http, oauth_server, token, request_id=3 + n))["sandbox"]
        for n in range(4)
    }
    assert len(sandboxes) == 1, "every call reaches the same sandbox, with no session"


async def test_a_session_id_from_before_a_kill_9_keeps_working(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    server = start_server(state, **ENV)
    port = urlsplit(server.base_url).port
    try:
        token = await new_user(http, server.base_url)
        opened = await initialize(http, server, token)
        # A stateless server issues no session id; the id a stateful deploy before it
        # issued is just as stale after the restart, so the client holds one of those.
        held = opened.headers.get("mcp-session-id") or uuid.uuid4().hex
        before = await legacy_status(http, server, token, session_id=held)

        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=15)
        server = start_server(state, port=port, **ENV)

        # The client replays the old id and never re-initializes.
        for n in range(3):
            after = await legacy_status(http, server, token, session_id=held, request_id=10 + n)
            assert after["sandbox"] == before["sandbox"], "the same sandbox after the restart"
    finally:
        stop_server(server)


async def modern_body_call(
    http: httpx2.AsyncClient, server: RunningServer, token: str, headers: dict[str, str]
) -> httpx2.Response:
    """A 2026-07-28 tools/call body (``_meta`` protocol version) with the given headers."""
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "sandbox_status", "arguments": {}, "_meta": SESSIONLESS_META},
    }
    return await http.post(
        server.mcp_url,
        content=json.dumps(body),
        headers={
            "authorization": f"Bearer {token}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **headers,
        },
    )


async def test_a_2026_body_under_a_2025_header_gets_a_normal_result(
    http: httpx2.AsyncClient, oauth_server: RunningServer
) -> None:
    token = await new_user(http, oauth_server.base_url)
    # As the claude.ai connector sends it: legacy header, no Mcp-Method / Mcp-Name.
    for _ in range(3):
        response = await modern_body_call(
            http, oauth_server, token, {"mcp-protocol-version": LEGACY}
        )
        assert response.status_code == 200, response.text
        result = read_jsonrpc(response)["result"]
        assert not result.get("isError"), result
        assert result["structuredContent"]["holds_slot"] is False
        # Served by the body: as a 2026-07-28 result, which must say its resultType.
        assert result["resultType"] == "complete", result
    # ... and with no version header at all.
    bare = await modern_body_call(http, oauth_server, token, {})
    assert bare.status_code == 200, bare.text
    assert not read_jsonrpc(bare)["result"].get("isError")
    # The mismatch is logged once per client and kind, not once per request.
    log = oauth_server.log()
    assert log.count(MISMATCH_EVENT) == 2, log[-3000:]


async def test_an_unknown_session_id_is_served_in_both_eras(
    http: httpx2.AsyncClient, oauth_server: RunningServer
) -> None:
    token = await new_user(http, oauth_server.base_url)
    status = await legacy_status(http, oauth_server, token, session_id=uuid.uuid4().hex)
    assert status["holds_slot"] is False
    modern = await modern_body_call(
        http,
        oauth_server,
        token,
        {
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": "sandbox_status",
            "mcp-session-id": "not-a-session-" + uuid.uuid4().hex,
        },
    )
    assert modern.status_code == 200, modern.text
    assert read_jsonrpc(modern)["result"]["structuredContent"]["sandbox"] == status["sandbox"]


async def test_get_and_delete_answer_405_and_open_no_stream(
    http: httpx2.AsyncClient, oauth_server: RunningServer
) -> None:
    token = await new_user(http, oauth_server.base_url)
    base = {"authorization": f"Bearer {token}", "mcp-protocol-version": LEGACY}
    requests = [
        ("GET", {**base, "accept": "text/event-stream"}),
        ("GET", {**base, "accept": "text/event-stream", "mcp-session-id": uuid.uuid4().hex}),
        ("DELETE", {**base, "mcp-session-id": uuid.uuid4().hex}),
        ("DELETE", base),
    ]
    for method, headers in requests:
        # A stream held open would run into the timeout instead of answering.
        response = await http.request(method, oauth_server.mcp_url, headers=headers, timeout=10)
        assert response.status_code == 405, (method, headers, response.text)
        assert response.headers["allow"] == "POST"
        assert "stateless" in response.json()["error"]["message"]
    # The bearer check still comes first: no token, no answer about the method.
    anonymous = await http.get(oauth_server.mcp_url, headers={"accept": "text/event-stream"})
    assert anonymous.status_code == 401


async def test_thousands_of_initializes_open_nothing_and_lock_out_no_one(
    http: httpx2.AsyncClient, oauth_server: RunningServer
) -> None:
    flooder, other = await new_users(http, oauth_server.base_url, 2)
    other_session = (await initialize(http, oauth_server, other)).headers.get("mcp-session-id")
    count, parallel = 2000, 16
    statuses: list[int] = []
    session_ids: list[str] = []

    async def flood(worker: int) -> None:
        for n in range(worker, count, parallel):
            response = await initialize(http, oauth_server, flooder, name=f"flood-{n}")
            statuses.append(response.status_code)
            if "mcp-session-id" in response.headers:
                session_ids.append(response.headers["mcp-session-id"])

    started = time.monotonic()
    await asyncio.gather(*(flood(worker) for worker in range(parallel)))
    elapsed = time.monotonic() - started
    assert statuses == [200] * count
    assert session_ids == [], "an initialize opens no session that could pile up"
    # The other user is served, with or without the id it was given.
    await legacy_status(http, oauth_server, other, session_id=other_session)
    await legacy_status(http, oauth_server, other)
    print(f"{count} initializes in {elapsed:.1f} s")


async def test_a_queued_legacy_call_without_a_session_gets_progress(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    async with a_held_slot(http, tmp_path / "state", ENV) as (server, waiter):
        started = time.monotonic()
        response = await legacy_rpc(
            http,
            server,
            waiter,
            "tools/call",
            {"name": "probe_sandbox", "arguments": {}, "_meta": {"progressToken": "queue-1"}},
            request_id=9,
        )
        waited = time.monotonic() - started
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        progress = [
            json.loads(line[5:])
            for line in response.text.splitlines()
            if line.startswith("data:") and "notifications/progress" in line
        ]
        assert progress, response.text
        assert progress[0]["params"]["progressToken"] == "queue-1"
        assert "number 1 in the queue" in progress[0]["params"]["message"]
        result = read_jsonrpc(response)["result"]
        assert not result.get("isError"), result
        assert result["structuredContent"]["files"] == [], "the freed slot was emptied first"
        assert 5 < waited < QUEUE_WAIT_S  # it waited, and got the slot within its wait


async def test_a_long_synchronous_command_without_a_session_returns_its_result(
    http: httpx2.AsyncClient, oauth_server: RunningServer
) -> None:
    token = await new_user(http, oauth_server.base_url)
    created = await legacy_tool(http, oauth_server, token, "create_experiment", {"name": "slow"})
    started = time.monotonic()
    ran = await legacy_tool(
        http,
        oauth_server,
        token,
        "execute_experiment",
        {"experiment_id": created["experiment_id"], "command": "sleep 4; echo done"},
        progressToken="sync-1",
    )
    assert time.monotonic() - started >= 4, ran
    assert (ran["status"], ran["exit_code"], ran["stdout"]) == ("completed", 0, "done\n")
