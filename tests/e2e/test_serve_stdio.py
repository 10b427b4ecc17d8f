"""``sandbox-mcp serve --transport stdio``: what the README's
``claude mcp add sandbox -- uv run ... serve --transport stdio`` starts. Local mode
by definition (no sign-in), and stdout carries nothing but JSON-RPC, so a log line
there would break the client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import pytest
from docker_testkit import remove_labelled_containers
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


async def test_stdio_serves_one_local_user_through_an_experiment(tmp_path: Path) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "app", "serve", "--transport", "stdio"],
        cwd=ROOT,
        env={
            **os.environ,
            "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state"),
            "SANDBOX_MCP_POOL_SIZE": "2",
            "SANDBOX_MCP_WARM_CONTAINERS": "0",
        },
    )
    with (tmp_path / "stderr.log").open("w") as stderr:
        async with Client(stdio_client(server, errlog=stderr)) as client:  # type: ignore[arg-type]
            names = [tool.name for tool in (await client.list_tools()).tools]
            status = await client.call_tool("sandbox_status", {})
            created = await client.call_tool("create_experiment", {"name": "over stdio"})
            assert not created.is_error, created
            assert created.structured_content is not None
            experiment_id = created.structured_content["experiment_id"]
            ran = await client.call_tool(
                "execute_experiment", {"experiment_id": experiment_id, "command": "echo via-stdio"}
            )
            gone = await client.call_tool("destroy_experiment", {"experiment_id": experiment_id})
    assert "execute_experiment" in names
    assert not status.is_error
    assert status.structured_content is not None
    assert status.structured_content["holds_slot"] is False  # nothing taken by connecting
    assert ran.structured_content is not None, ran
    assert (ran.structured_content["exit_code"], ran.structured_content["stdout"]) == (
        0,
        "via-stdio\n",
    )
    assert not gone.is_error, gone
    # The logs went to stderr (JSON events), never into the protocol's stream.
    assert '"event": "service.started"' in (tmp_path / "stderr.log").read_text()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_stdio_as_end_of_input_does(
    tmp_path: Path, engine: docker.DockerClient, stop_signal: signal.Signals
) -> None:
    """SIGTERM (a supervisor, a client stopping its server) or SIGINT (Ctrl-C) shuts the
    stdio server down as EOF on stdin does: its warm containers are removed, not left
    running for the next start to sweep (issue 27: it died at once and left two)."""
    prefix = f"io.sandbox-mcp-stdio-{uuid.uuid4().hex[:8]}"
    label = {"label": f"{prefix}.managed"}
    with (tmp_path / "stderr.log").open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--transport", "stdio"],
            cwd=ROOT,
            env={
                **os.environ,
                "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state"),
                "SANDBOX_MCP_POOL_SIZE": "2",
                "SANDBOX_MCP_WARM_CONTAINERS": "2",
                "SANDBOX_MCP_LABEL_PREFIX": prefix,
            },
            stdin=subprocess.PIPE,  # held open: only the signal ends the server
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 90
        while len(engine.api.containers(filters=label)) < 2:
            assert process.poll() is None, (tmp_path / "stderr.log").read_text()
            assert time.monotonic() < deadline, "no two warm containers within 90 s"
            time.sleep(0.5)
        process.send_signal(stop_signal)
        process.wait(timeout=60)
        log = (tmp_path / "stderr.log").read_text()
        left = engine.api.containers(all=True, filters=label)
        assert left == [], f"containers left running after {stop_signal.name}:\n{log[-2000:]}"
        assert process.returncode == 0, log[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdin is not None
        process.stdin.close()
        remove_labelled_containers(engine, f"{prefix}.managed")
