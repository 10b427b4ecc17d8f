"""``GET /metrics`` on the real server: token, pool gauges, tool calls and event counters."""

from __future__ import annotations

import re
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, Servers, start_server, stop_server
from mcp_http import tool
from oauth_browser import ManualClient

pytestmark = pytest.mark.e2e

TOKEN = "metrics-token-0123456789"


@pytest.fixture
def oauth_server(serve: Servers) -> RunningServer:
    return serve(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="3",
        SANDBOX_MCP_METRICS_TOKEN=TOKEN,
    )


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in the Prometheus text format (labels in any order)."""
    for line in text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    raise AssertionError(f"no sample {name}{labels} in:\n{text}")


async def scrape(http: httpx2.AsyncClient, server: RunningServer) -> str:
    answer = await http.get(
        f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return answer.text


async def test_metrics_need_the_token_and_count_what_happened(oauth_server: RunningServer) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-0123456789"},
            {"Authorization": TOKEN},
        ):
            refused = await http.get(f"{oauth_server.base_url}/metrics", headers=headers)
            assert refused.status_code == 401
            assert "sandbox_mcp" not in refused.text

        before = await scrape(http, oauth_server)
        assert sample(before, "sandbox_mcp_pool_size") == 3
        assert sample(before, "sandbox_mcp_pool_busy") == 0
        assert sample(before, "sandbox_mcp_database_up") == 1
        assert "process_resident_memory_bytes" in before

        client = await ManualClient.register(http, oauth_server.base_url)
        pair = await client.tokens(http)
        token = str(pair["access_token"])
        for _ in range(2):
            assert (await tool(http, oauth_server, token, "sandbox_status"))["is_error"] is False
        missing = await tool(
            http,
            oauth_server,
            token,
            "read_sandbox_file",
            {"experiment_id": "exp-none", "path": "a.txt"},
        )
        assert missing["is_error"] is True

        after = await scrape(http, oauth_server)
        health = (await http.get(f"{oauth_server.base_url}/health")).json()
    assert (
        sample(after, "sandbox_mcp_tool_call_seconds_count", tool="sandbox_status", outcome="ok")
        == 2
    )
    failed = [
        line
        for line in after.splitlines()
        if line.startswith("sandbox_mcp_tool_call_seconds_count")
        and 'tool="read_sandbox_file"' in line
    ]
    assert len(failed) == 1
    assert 'outcome="ok"' not in failed[0]
    assert sample(after, "sandbox_mcp_events_total", event="tool.call", level="info") == 3
    assert (
        sample(after, "sandbox_mcp_events_total", event="oauth.sandbox_created", level="info") == 1
    )
    assert (
        sample(after, "sandbox_mcp_events_total", event="oauth.client_registered", level="info")
        == 1
    )
    assert sample(after, "sandbox_mcp_pool_busy") == health["pool"]["busy"]


async def test_without_a_token_setting_metrics_are_open_like_health(server: RunningServer) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        answer = await http.get(f"{server.base_url}/metrics")
    assert answer.status_code == 200
    assert sample(answer.text, "sandbox_mcp_pool_free") >= 1


async def test_calls_are_counted_at_warning_where_no_call_line_is_written(tmp_path: Path) -> None:
    """The bench's setting: at WARNING a call builds no log record, yet /metrics counts it
    exactly as at INFO (the ``tool.call`` event included)."""
    quiet = start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_METRICS_TOKEN=TOKEN,
        SANDBOX_MCP_LOG_LEVEL="WARNING",
    )
    try:
        async with httpx2.AsyncClient(timeout=30) as http:
            client = await ManualClient.register(http, quiet.base_url)
            token = str((await client.tokens(http))["access_token"])
            for _ in range(3):
                assert (await tool(http, quiet, token, "sandbox_status"))["is_error"] is False
            after = await scrape(http, quiet)
    finally:
        stop_server(quiet)
    assert sample(after, "sandbox_mcp_events_total", event="tool.call", level="info") == 3
    assert (
        sample(after, "sandbox_mcp_tool_call_seconds_count", tool="sandbox_status", outcome="ok")
        == 3
    )
    # Events below the level are still counted (sign-in's, here), and none was written.
    assert (
        sample(after, "sandbox_mcp_events_total", event="oauth.client_registered", level="info")
        == 1
    )
    assert '"tool.call"' not in quiet.log()
