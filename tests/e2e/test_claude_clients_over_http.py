"""Claude's clients as they are today, against the real server over HTTP (issue 25).

- Claude Code sends ``MCP-Protocol-Version: 2025-11-25, 2025-11-25``: the header
  joined with itself. It is answered as if sent once, in both protocol eras.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import LEGACY, MODERN, read_jsonrpc, rpc_request

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("claude-clients") / "state")
    yield running
    stop_server(running)


def legacy(method: str, params: dict[str, Any], version_header: str | None = LEGACY) -> Any:
    """A legacy-era (2025-11-25) POST in local mode: no token, the header as given."""
    return {
        "content": json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}),
        "headers": {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **({"mcp-protocol-version": version_header} if version_header else {}),
        },
    }


def modern(method: str, params: dict[str, Any], version_header: str = MODERN) -> Any:
    request = rpc_request(method, params)
    request["headers"]["mcp-protocol-version"] = version_header
    return request


INITIALIZE = {
    "protocolVersion": LEGACY,
    "capabilities": {},
    "clientInfo": {"name": "claude-code", "version": "2.1"},
}


async def test_a_doubled_version_header_is_answered_as_if_sent_once(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    answers: dict[str, Any] = {}
    for era, request in (
        ("legacy once", legacy("tools/list", {})),
        ("legacy twice", legacy("tools/list", {}, f"{LEGACY}, {LEGACY}")),
        ("modern once", modern("tools/list", {})),
        ("modern twice", modern("tools/list", {}, f"{MODERN}, {MODERN}")),
    ):
        if era.startswith("legacy"):
            init = await http.post(server.mcp_url, **legacy("initialize", INITIALIZE, None))
            assert init.status_code == 200, init.text
        response = await http.post(server.mcp_url, **request)
        assert response.status_code == 200, (era, response.text[:500])
        answers[era] = read_jsonrpc(response)["result"]["tools"]
    assert answers["legacy twice"] == answers["legacy once"]
    assert answers["modern twice"] == answers["modern once"]
    # A call, too, in the legacy era, as Claude Code makes it.
    called = await http.post(
        server.mcp_url,
        **legacy("tools/call", {"name": "sandbox_status", "arguments": {}}, f"{LEGACY}, {LEGACY}"),
    )
    assert called.status_code == 200, called.text[:500]
    assert not read_jsonrpc(called)["result"].get("isError"), called.text[:500]


async def test_a_version_header_with_two_different_versions_is_refused_with_a_sentence(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    for request in (
        legacy("tools/list", {}, f"{LEGACY}, {MODERN}"),
        modern("tools/list", {}, f"{MODERN}, {LEGACY}"),
    ):
        response = await http.post(server.mcp_url, **request)
        assert response.status_code == 400, response.text[:500]
        message = response.json()["error"]["message"]
        assert message.startswith("The MCP-Protocol-Version header carries 2 different versions")
