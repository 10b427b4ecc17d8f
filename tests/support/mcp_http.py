"""An MCP client over plain HTTP, for tests that need to see (or shape) the wire.

Every request is one sessionless JSON-RPC POST to ``/mcp``, built in one place per
era: ``rpc_request`` (2026-07-28) and ``legacy_request`` (2025-11-25, the handshake
era). Tests that need a deliberately odd wire (a header that contradicts the body,
a half-sent request) write it out themselves.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx2
from e2e_server import RunningServer

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
SESSIONLESS_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def rpc_request(
    method: str,
    params: dict[str, Any],
    *,
    token: str = "",
    name: str | None = None,
    capabilities: dict[str, Any] | None = None,
    request_id: int = 1,
) -> dict[str, Any]:
    """The body and headers of one sessionless (2026-07-28) JSON-RPC request, as keyword
    arguments of ``http.post`` or ``http.stream``; ``name`` fills the Mcp-Name header.

    ``params`` goes out as given (plus the protocol ``_meta``, declaring
    ``capabilities``, none by default), so tests can send arguments of any shape,
    hostile ones included. An empty ``token`` means local mode
    (``SANDBOX_MCP_AUTH=none``): no Authorization header at all."""
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
        **({"mcp-name": name} if name is not None else {}),
        **({"authorization": f"Bearer {token}"} if token else {}),
    }
    meta = {
        **SESSIONLESS_META,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
        **params.get("_meta", {}),
    }
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**params, "_meta": meta},
    }
    return {"content": json.dumps(body), "headers": headers}


async def post_rpc(
    http: httpx2.AsyncClient,
    mcp_url: str,
    method: str,
    params: dict[str, Any],
    **options: Any,
) -> httpx2.Response:
    """One sessionless JSON-RPC request (``rpc_request``'s ``options``); the response."""
    return await http.post(mcp_url, **rpc_request(method, params, **options))


def legacy_request(
    token: str,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    session_id: str | None = None,
    request_id: int | None = 1,
) -> dict[str, Any]:
    """The body and headers of one legacy-era (2025-11-25) JSON-RPC POST, as keyword
    arguments of ``http.post``; ``request_id=None`` makes it a notification.

    The version header goes on every request after ``initialize``, as the spec asks;
    ``session_id`` is sent only when given: the quirky clients decide that."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if request_id is not None:
        message["id"] = request_id
    headers = {
        "authorization": f"Bearer {token}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        **({} if method == "initialize" else {"mcp-protocol-version": LEGACY}),
        **({"mcp-session-id": session_id} if session_id is not None else {}),
    }
    return {"content": json.dumps(message), "headers": headers}


async def legacy_rpc(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    method: str,
    params: dict[str, Any] | None = None,
    **options: Any,
) -> httpx2.Response:
    """One legacy-era JSON-RPC POST (``legacy_request``'s ``options``); the response."""
    return await http.post(server.mcp_url, **legacy_request(token, method, params, **options))


def read_jsonrpc(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer, whether sent as JSON or as an SSE stream (after progress)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if "result" in message or "error" in message:
                    return dict(message)
        raise AssertionError(f"no JSON-RPC answer in the stream: {response.text[:500]}")
    return dict(response.json())


async def call_tool(
    http: httpx2.AsyncClient, base_url: str, token: str, name: str = "sandbox_status"
) -> httpx2.Response:
    """One tools/call with no arguments; the raw response."""
    return await post_rpc(
        http,
        f"{base_url}/mcp",
        "tools/call",
        {"name": name, "arguments": {}},
        token=token,
        name=name,
    )


async def tool(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    name: str,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One tools/call; returns the structured content plus ``is_error``."""
    response = await post_rpc(
        http,
        server.mcp_url,
        "tools/call",
        {"name": name, "arguments": arguments or {}},
        token=token,
        name=name,
    )
    assert response.status_code == 200, response.text
    body = read_jsonrpc(response)
    assert "result" in body, body
    result = body["result"]
    structured = result.get("structuredContent") or {}
    return {"is_error": result.get("isError", False), **structured}


async def probe(
    http: httpx2.AsyncClient, server: RunningServer, token: str, write: str = ""
) -> dict[str, Any]:
    """Call the test suite's slot-taking probe tool (tests/support/probe_app.py)."""
    return await tool(http, server, token, "probe_sandbox", {"write": write})


async def run_command(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    experiment: str,
    command: str,
    **extra: Any,
) -> dict[str, Any]:
    """``execute_experiment`` in ``experiment``; returns the structured content."""
    return await tool(
        http,
        server,
        token,
        "execute_experiment",
        {"experiment_id": experiment, "command": command, **extra},
    )


async def run_to_the_end(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    experiment: str,
    command: str,
    *,
    within_s: float = 600,
    **extra: Any,
) -> dict[str, Any]:
    """``run_command`` (``extra`` as it takes them), and if the server's synchronous
    wait ended first (the command went on as a background job, as on a busy machine),
    the job's result once it ended: a test that reads a command's outcome gets it
    however slow the machine."""
    ran = await run_command(http, server, token, experiment, command, **extra)
    if ran.get("status") != "running":
        return ran
    return await job_end(http, server, token, ran["job_id"], within_s=within_s)


async def job_end(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    job_id: str,
    *,
    within_s: float = 600,
) -> dict[str, Any]:
    """The job's result with its output once it left "running" (or as it is after
    ``within_s``): one ``get_job_result`` waits at most 45 s, which a busy machine can
    outlast; this asks again until the end. (Not get_job_status: it has no output.)"""
    deadline = time.monotonic() + within_s
    while True:
        wait_s = max(0.0, min(30.0, deadline - time.monotonic()))
        seen = await tool(
            http, server, token, "get_job_result", {"job_id": job_id, "wait_s": wait_s}
        )
        if seen.get("status") != "running" or time.monotonic() >= deadline:
            return seen


async def write_file(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    experiment: str,
    path: str,
    content: str,
) -> dict[str, Any]:
    """``write_sandbox_file`` in ``experiment``; returns the structured content."""
    return await tool(
        http,
        server,
        token,
        "write_sandbox_file",
        {"experiment_id": experiment, "path": path, "content": content},
    )


async def read_when_written(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    experiment: str,
    path: str,
    *,
    within_s: float = 60.0,
) -> dict[str, Any]:
    """``read_sandbox_file`` of ``path`` once a background command wrote it (bounded:
    polled every half second for ``within_s``); the last answer, an error if never."""
    read = {"experiment_id": experiment, "path": path}
    for _ in range(int(within_s * 2)):
        answer = await tool(http, server, token, "read_sandbox_file", read)
        if not answer["is_error"]:
            return answer
        await asyncio.sleep(0.5)
    return answer
