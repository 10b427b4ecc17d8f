"""A second server process on a SQLite state dir is refused; on PostgreSQL it is not.

Seen: a second process on the same state dir started silently, and its start-up
recovery marked the first one's running job `lost` (the job then completed anyway).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from db_testkit import fresh_postgres
from e2e_server import RunningServer, free_port, start_server, stop_server
from mcp_http import run_command, tool

pytestmark = pytest.mark.e2e


def serve_again(state_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A second `sandbox-mcp serve` on ``state_dir``; it must exit by itself."""
    return subprocess.run(
        [sys.executable, "-m", "app", "serve"],
        env={
            **os.environ,
            "SANDBOX_MCP_STATE_DIR": str(state_dir),
            "SANDBOX_MCP_AUTH": "none",
            "SANDBOX_MCP_POOL_SIZE": "1",
            "SANDBOX_MCP_PORT": str(free_port()),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_a_second_process_on_a_sqlite_state_dir_is_refused_and_harms_nothing(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = start_server(state, SANDBOX_MCP_POOL_SIZE="1")
    try:
        exp = (await tool(http, first, "", "create_experiment", {}))["experiment_id"]
        job = await run_command(http, first, "", exp, "sleep 60", background=True)
        second = serve_again(state)
        assert second.returncode == 1, second.stderr
        assert second.stderr.strip().splitlines() == [
            f"sandbox-mcp: Another sandbox-mcp process (pid {first.process.pid}) already "
            f"serves the state dir {state} (its database is SQLite, which one process "
            "serves); stop that one first, or give this one its own SANDBOX_MCP_STATE_DIR "
            "(several processes need PostgreSQL: SANDBOX_MCP_DATABASE_URL)."
        ]
        # The first one's job was left alone.
        status = await tool(http, first, "", "get_job_status", {"job_id": job["job_id"]})
        assert status["status"] == "running", status
        await tool(http, first, "", "cancel_job", {"job_id": job["job_id"]})
    finally:
        # However the first one ends, the kernel drops its lock: a restart is not blocked.
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
    again = start_server(state, SANDBOX_MCP_POOL_SIZE="1")
    stop_server(again)


async def test_processes_on_postgresql_take_no_lock(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    async with fresh_postgres() as url:
        servers: list[RunningServer] = []
        try:
            for _ in range(2):
                servers.append(
                    await asyncio.to_thread(
                        start_server, state, SANDBOX_MCP_POOL_SIZE="1", SANDBOX_MCP_DATABASE_URL=url
                    )
                )
            for server in servers:
                assert (await http.get(f"{server.base_url}/health")).status_code == 200
                assert server.process.poll() is None
        finally:
            for server in servers:
                stop_server(server)
