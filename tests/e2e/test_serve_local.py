"""The real server, driven by the official MCP SDK client over Streamable HTTP."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from app.settings import RuntimeSettings

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_sandbox_status_over_http_in_both_protocol_eras(
    server: RunningServer, mode: str, tmp_path: Path
) -> None:
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(streamable_http_client(server.mcp_url, http_client=http), mode=mode) as client,  # type: ignore[arg-type]
    ):
        tools = await client.list_tools()
        assert "sandbox_status" in [tool.name for tool in tools.tools]
        assert not any(tool.name.startswith("docker_") for tool in tools.tools)
        result = await client.call_tool("sandbox_status", {})
    assert not result.is_error
    status = result.structured_content
    assert status is not None
    assert status["holds_slot"] is False
    assert status["sandbox"].startswith("sbx-")
    assert status["idle_timeout_s"] == 600
    # Every call lands in the audit trail.
    with sqlite3.connect(tmp_path / "state" / "sandbox-mcp.db") as db:
        rows = db.execute("SELECT tool, outcome FROM tool_calls").fetchall()
    assert ("sandbox_status", "ok") in rows


def test_health_needs_no_token_and_reports_everything(server: RunningServer) -> None:
    body = httpx2.get(f"{server.base_url}/health").json()
    assert body["status"] == "ok"  # .ci/run starts Docker and builds the images
    assert body["database"] == {"ok": True}
    assert set(body["pool"]) == {"size", "busy", "free", "reserved", "queued", "oldest_wait_s"}
    assert set(body["runtime"]) == {"reachable", "version", "reason", "images"}
    # Which images are ready, the default one first in the README's promise.
    images = RuntimeSettings.model_fields["images"].default.split(",")
    assert body["runtime"]["images"] == {
        "ready": images,
        "missing": [],
        "default": "sandbox-mcp/python:3",
        "default_ready": True,
    }


def test_the_log_says_where_to_connect_and_what_the_mode_means(server: RunningServer) -> None:
    [line] = [json.loads(line) for line in server.log().splitlines() if "service.listening" in line]
    assert line["url"] == server.base_url
    assert line["mcp_url"] == server.mcp_url
    assert line["mode"] == "local"
    assert "no sign-in" in line["meaning"]


def test_malformed_json_rpc_gets_a_json_rpc_error_not_a_500(server: RunningServer) -> None:
    response = httpx2.post(
        server.mcp_url,
        content=b"{not json",
        headers={
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        },
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700  # JSON-RPC parse error


def test_a_foreign_host_header_is_refused(server: RunningServer) -> None:
    response = httpx2.post(
        server.mcp_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"host": "evil.test", "accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 421


def test_logs_are_json_on_stderr_and_stdout_stays_empty(server: RunningServer) -> None:
    httpx2.get(f"{server.base_url}/health")
    lines = [line for line in server.log().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # every line is a JSON event
    assert any(event["event"] == "service.started" for event in events)
    assert server.stdout() == ""
