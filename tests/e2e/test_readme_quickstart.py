"""The README's quick start, as a newcomer follows it, against the real server.

Its tool-call block runs as it is (only the port changes: the test's server
listens on a free one); what the README shows for "ready" (the log lines and
/health's fields) is what the server prints; and stopping the server keeps the
experiment, with the command that was running recorded as lost, as "Stop" says.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import run_command, tool

pytestmark = pytest.mark.e2e

README = Path(__file__).parents[2] / "README.md"
MARKER = "<!-- tests/e2e/test_readme_quickstart.py runs this block as it is -->"
README_URL = "http://127.0.0.1:8000"


def block_after(text: str, marker: str) -> str:
    """The fenced code block that follows ``marker``."""
    match = re.search(re.escape(marker) + r"\n```\w*\n(.*?)\n```", text, re.S)
    assert match, f"no code block after {marker!r} in the README"
    return match.group(1)


def shown_health() -> dict[str, object]:
    """The /health answer the README shows."""
    match = re.search(
        r"^curl -s http://127\.0\.0\.1:8000/health\n(\{.*\})$", README.read_text(), re.M
    )
    assert match, "the README shows no /health answer"
    return dict(json.loads(match.group(1)))


def shape(value: object) -> object:
    """The keys of a JSON value, nested: what must match, whatever the counts."""
    if isinstance(value, dict):
        return {key: shape(inner) for key, inner in value.items()}
    return None


async def test_the_quick_start_as_the_readme_tells_it(
    tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    state = tmp_path / "state"
    server = start_server(state, SANDBOX_MCP_POOL_SIZE="2")
    try:
        job, experiment = await ready_and_calls(server, http)
    finally:
        stop_server(server)  # SIGTERM, as Ctrl-C or a supervisor stops it
    again = start_server(state, SANDBOX_MCP_POOL_SIZE="2")
    try:
        # "Stop": the experiment is found again; the command that was running is lost.
        status = await tool(http, again, "", "get_job_status", {"job_id": job})
        assert status["status"] == "lost", status
        still = await run_command(http, again, "", experiment, "echo still here")
        assert (still["exit_code"], still["stdout"]) == (0, "still here\n"), still
        await tool(http, again, "", "destroy_experiment", {"experiment_id": experiment})
    finally:
        stop_server(again)


async def ready_and_calls(server: RunningServer, http: httpx2.AsyncClient) -> tuple[str, str]:
    """ "Ready" and the tool-call block; returns a running job and its experiment."""
    health = (await http.get(f"{server.base_url}/health")).json()
    assert shape(health) == shape(shown_health())
    assert health["status"] == "ok", health
    events = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    [started] = [e for e in events if e["event"] == "service.started"]
    assert started["auth"] == "none", started
    assert any(e["event"] == "Application startup complete." for e in events)
    shown = README.read_text()
    assert '"event": "service.started"' in shown
    assert '"event": "Application startup complete."' in shown

    script = block_after(shown, MARKER)
    assert README_URL in script
    ran = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", script.replace(README_URL, server.base_url)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    answers = [
        json.loads(line.removeprefix("data: "))
        for line in ran.stdout.splitlines()
        if line.startswith("data: ")
    ]
    executed, destroyed = [a["result"]["structuredContent"] for a in answers]
    assert executed["exit_code"] == 0, executed
    assert re.fullmatch(r"Python 3\.\d+\.\d+\n", executed["stdout"]), executed
    assert destroyed["state"] == "DESTROYED", destroyed

    created = await tool(http, server, "", "create_experiment", {"goal": "survive a stop"})
    job = await run_command(
        http, server, "", created["experiment_id"], "sleep 600", background=True
    )
    return job["job_id"], created["experiment_id"]
