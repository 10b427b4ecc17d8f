"""Light tool calls: served in one exchange by the SDK's own handler, answered exactly as
the streaming path answers them; every other request keeps the streaming path."""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from mcp.server import _streamable_http_modern as modern
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from starlette.applications import Starlette

from app.mcp.light_calls import LightCalls
from app.mcp.tools import catalog
from app.mcp.tools.common import spec_of
from app.mcp.transport import StatelessTransport

MODERN = "2026-07-28"


def sdk_server() -> MCPServer:
    server = MCPServer("t")

    @server.tool()
    async def echo(text: str = "") -> str:
        return text

    @server.tool()
    async def shout(text: str = "") -> str:
        return text.upper()

    return server


Served = tuple[Starlette, list[bool]]


@contextlib.asynccontextmanager
async def running(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    """The SDK's app of a running server (``echo`` and ``shout``); the list records, for
    each request ``LightCalls`` hands to the SDK's 2026-07-28 handler, its json_response.
    (Not a fixture: the manager's task group must end in the task it began in.)"""
    server = sdk_server()
    taken: list[bool] = []
    handle = modern.handle_modern_request

    async def spy(*args: Any) -> None:
        taken.append(args[2])
        await handle(*args)

    monkeypatch.setattr(modern, "handle_modern_request", spy)
    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True)
    async with server.session_manager.run():
        yield app, taken


def endpoint_of(server: MCPServer) -> StreamableHTTPASGIApp:
    return StreamableHTTPASGIApp(server.session_manager)


def request(tool: str, *, header_name: str | None = None, version: str = MODERN) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"text": "hi"}, "_meta": meta},
    }
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": version,
        "mcp-method": "tools/call",
        "mcp-name": header_name or tool,
    }
    return {"content": json.dumps(body), "headers": headers}


async def post(app: StatelessTransport, call: dict[str, Any]) -> httpx2.Response:
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1:8000"
    ) as http:
        return await http.post("/mcp", **call)


async def test_a_light_call_is_answered_as_the_streaming_path_answers_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running(monkeypatch) as (app, taken):
        light = await post(StatelessTransport(app, light_tools=("echo",)), request("echo"))
        streamed = await post(StatelessTransport(app), request("echo"))
    assert taken == [True], "the light call went through the one-exchange form"
    assert light.status_code == streamed.status_code == 200
    assert light.headers["content-type"] == streamed.headers["content-type"]
    assert light.content == streamed.content
    assert light.json()["result"]["content"][0]["text"] == "hi"


async def test_other_tools_and_eras_keep_the_streaming_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running(monkeypatch) as (app, taken):
        other = await post(StatelessTransport(app, light_tools=("echo",)), request("shout"))
    assert other.status_code == 200
    assert other.json()["result"]["content"][0]["text"] == "HI"
    assert taken == []


async def test_a_request_that_claims_a_light_tool_and_calls_another_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK checks the Mcp-Name header against the body on this path too."""
    lying = request("shout", header_name="echo")
    async with running(monkeypatch) as (app, taken):
        answer = await post(StatelessTransport(app, light_tools=("echo",)), lying)
    assert taken == [True]
    assert answer.status_code == 400
    assert "HI" not in answer.text, "shout never ran"


def test_only_running_managers_and_2026_calls_of_light_tools_are_taken() -> None:
    server = sdk_server()
    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True)
    light = LightCalls(endpoint_of(server), ("echo",))
    scope = {"headers": [(k.encode(), v.encode()) for k, v in request("echo")["headers"].items()]}
    assert not light.takes(scope, 100), "the manager is not running"
    server.session_manager._task_group = object()  # as run() leaves it
    assert light.takes(scope, 100)
    assert not light.takes(scope, server.session_manager.max_request_body_size + 1)
    twice = {"headers": [*scope["headers"], (b"mcp-protocol-version", MODERN.encode())]}
    assert not light.takes(twice, 100)
    assert not light.takes(replaced(scope, b"mcp-protocol-version", b"2025-11-25"), 100)
    assert not light.takes(replaced(scope, b"mcp-method", b"tools/list"), 100)
    assert not light.takes(replaced(scope, b"mcp-name", b"shout"), 100)
    assert not LightCalls(app, ("echo",)).takes(scope, 100), "not the SDK's endpoint"
    assert not LightCalls(endpoint_of(server), ()).takes(scope, 100)


def replaced(scope: dict[str, Any], name: bytes, value: bytes) -> dict[str, Any]:
    return {"headers": [(k, value if k == name else v) for k, v in scope["headers"]]}


def test_the_sdk_handler_takes_what_light_calls_hands_it() -> None:
    """The coupling to the SDK's private handler: a changed signature fails here, not
    at the first light call of a deployment."""
    parameters = list(inspect.signature(modern.handle_modern_request).parameters)
    assert parameters == [
        "app",
        "security_settings",
        "json_response",
        "lifespan_state",
        "scope",
        "receive",
        "send",
    ]
    server = sdk_server()
    server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True)
    manager = server.session_manager
    for name in ("app", "security_settings", "_lifespan_state", "_task_group"):
        assert hasattr(manager, name), name
    assert "max_request_body_size" in vars(manager)


def test_light_tools_are_read_only() -> None:
    """Light is for calls that change nothing and wait for nothing: every one declared
    so is read-only (and sandbox_status, the lightest call, is one)."""
    light = catalog.light_tools()
    assert "sandbox_status" in light
    for function in catalog.TOOLS:
        spec = spec_of(function)
        if spec.light:
            annotations = spec.annotations
            assert not callable(annotations), spec.name
            assert annotations.read_only_hint, spec.name
