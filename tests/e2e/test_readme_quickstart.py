"""The README's quick start, as a newcomer follows it, against the real server.

Its two blocks run as they are: the first starts the server (only the port differs:
the test's server listens on a free one, set where the README sets it; the state dir
comes from the environment, and no warm containers), the second makes the tool calls. What
the README shows for "ready" (/health's answer, the log lines, the mount-flags
warning) is what the server prints; the port is written once; and stopping the
server keeps the experiment, with the command that was running recorded as lost, as
"Stop" says.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, free_port, start_server, stop_server
from mcp_http import run_command, tool

from app.runtime.docker.hardening import missing_mount_flags

pytestmark = pytest.mark.e2e

REPO = Path(__file__).parents[2]
README = REPO / "README.md"
START = "<!-- tests/e2e/test_readme_quickstart.py runs this block as it is -->"
CALLS = "<!-- tests/e2e/test_readme_quickstart.py runs this block as it is, too -->"
PORT_LINE = re.compile(r"^export SANDBOX_MCP_PORT=(\d+)\b", re.M)


def block_after(text: str, marker: str) -> str:
    """The fenced code block that follows ``marker``."""
    match = re.search(re.escape(marker) + r"\n```\w*\n(.*?)\n```", text, re.S)
    assert match, f"no code block after {marker!r} in the README"
    return match.group(1)


def section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"no section {heading!r} in the README"
    return match.group(1)


def shown_health(text: str) -> dict[str, object]:
    """The /health answer the quick start shows, the first JSON block after the start."""
    after = text[text.index(START) :]
    match = re.search(r"^```json\n(\{.*\})\n```$", after, re.M)
    assert match, "the README shows no /health answer"
    return dict(json.loads(match.group(1)))


def shown_event(text: str, event: str) -> dict[str, object]:
    """The log line the quick start shows for ``event`` (its '...' elisions dropped)."""
    match = re.search(rf'^(\{{.*"event": "{re.escape(event)}".*\}})$', text, re.M)
    assert match, f"the README shows no {event} line"
    return dict(json.loads(match.group(1).replace(", ...}", "}")))


def shape(value: object) -> object:
    """The keys of a JSON value, nested: what must match, whatever the counts."""
    if isinstance(value, dict):
        return {key: shape(inner) for key, inner in value.items()}
    return None


def test_the_port_is_written_once() -> None:
    """Changing the port is one edit: the quick start and the client lines read it."""
    text = README.read_text()
    start = block_after(text, START)
    [port] = PORT_LINE.findall(start)
    quick = section(text, "Quick start") + section(text, "Connect a client")
    assert re.findall(rf"(?<![\d.]){port}(?!\d)", quick) == [port], "the port is written again"
    for shown in (block_after(text, CALLS), section(text, "Connect a client")):
        assert "127.0.0.1:$SANDBOX_MCP_PORT" in shown


@dataclass
class ReadmeServer:
    """The start block's shell, kept waiting on its background job (the server)."""

    shell: subprocess.Popen[str]
    pid: int  # $!: `uv run sandbox-mcp serve`
    server: RunningServer
    printed: str  # what the block printed: /health's answer

    def stop(self) -> None:
        """As `kill %1` stops it: SIGTERM; the shell's `wait` then returns."""
        os.kill(self.pid, signal.SIGTERM)
        self.shell.wait(timeout=60)
        if self.shell.stdout is not None:
            self.shell.stdout.close()


def start_as_the_readme_says(tmp_path: Path, state: Path, port: int) -> ReadmeServer:
    """The README's start block in a shell, as it is but for the port."""
    block = block_after(README.read_text(), START)
    script = PORT_LINE.sub(f"export SANDBOX_MCP_PORT={port}", block)
    assert script != block, "the start block sets no port"
    env = {
        **os.environ,
        "SANDBOX_MCP_STATE_DIR": str(state),
        "SANDBOX_MCP_WARM_CONTAINERS": "0",
        "UV_WORKING_DIR": str(REPO),  # "cd sandbox-mcp": uv runs the clone's project
    }
    shell = subprocess.Popen(
        ["bash", "-c", script + '\necho "PID=$!"\nwait'],
        cwd=tmp_path,  # where server.log lands
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a stuck start is ended whole
    )
    assert shell.stdout is not None
    ready, _, _ = select.select([shell.stdout], [], [], 300)
    if not ready:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
        raise AssertionError("the start block printed nothing in 300 s")
    printed, _, pid = shell.stdout.readline().rpartition("PID=")
    log = tmp_path / "server.log"
    server = RunningServer(f"http://127.0.0.1:{port}", shell, log)  # type: ignore[arg-type]
    return ReadmeServer(shell, int(pid), server, printed.strip())


async def test_the_quick_start_as_the_readme_tells_it(
    tmp_path: Path, http: httpx2.AsyncClient
) -> None:
    state = tmp_path / "state"
    first = start_as_the_readme_says(tmp_path, state, free_port())
    try:
        job, experiment = await ready_and_calls(first, http, state)
    finally:
        first.stop()
    assert first.shell.returncode == 0
    again = start_server(state)
    try:
        # "Stop": the experiment is found again; the command that was running is lost.
        status = await tool(http, again, "", "get_job_status", {"job_id": job})
        assert status["status"] == "lost", status
        still = await run_command(http, again, "", experiment, "echo still here")
        assert (still["exit_code"], still["stdout"]) == (0, "still here\n"), still
        await tool(http, again, "", "destroy_experiment", {"experiment_id": experiment})
    finally:
        stop_server(again)


async def ready_and_calls(
    started: ReadmeServer, http: httpx2.AsyncClient, state: Path
) -> tuple[str, str]:
    """ "Ready" and the tool-call block; returns a running job and its experiment."""
    server = started.server
    shown = README.read_text()
    assert started.printed, f"the start block printed no /health:\n{server.log()}"
    printed = json.loads(started.printed)
    assert shape(printed) == shape(shown_health(shown))
    assert printed["status"] == "ok", printed
    events = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    for name in ("service.started", "Application startup complete."):
        [logged] = [e for e in events if e["event"] == name]
        expected = shown_event(shown, name)
        assert {k: logged[k] for k in expected} == expected, (name, logged)
    # The warning the README says to expect, where the state dir's filesystem lacks the
    # flags (any dir a plain user makes: the README's ~/.sandbox-mcp), and none otherwise.
    warned = [e for e in events if e["event"] == "runtime.workspace_mount_flags"]
    missing = missing_mount_flags(state / "slots")
    if missing:
        expected = shown_event(shown, "runtime.workspace_mount_flags")
        del expected["path"]  # the README's state dir, not the test's
        [logged] = warned
        assert {k: logged[k] for k in expected} == expected, logged
        assert logged["path"] == str(state / "slots"), logged
    else:
        assert warned == [], warned

    script = block_after(shown, CALLS)
    ran = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", script],
        env={**os.environ, "SANDBOX_MCP_PORT": server.base_url.rpartition(":")[2]},
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
