"""`sandbox-mcp serve --workers N` on PostgreSQL: N processes on one port, a dead one replaced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from db_testkit import fresh_postgres
from e2e_server import free_port

pytestmark = pytest.mark.e2e


def worker_pids(log: Path) -> list[int]:
    pids = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"workers.started"' in line:
            pids.append(int(json.loads(line)["pid"]))
    return pids


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def start_workers(
    workers: int, port: int, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--workers", str(workers), "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=2).status_code == 200
    except httpx2.TransportError:
        return False


async def test_two_workers_share_the_port_and_a_killed_one_is_replaced(tmp_path: Path) -> None:
    async with fresh_postgres() as url:
        port = free_port()
        log = tmp_path / "serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_MCP_")}
        env |= {
            "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state"),
            "SANDBOX_MCP_DATABASE_URL": url,
            "SANDBOX_MCP_AUTH": "none",
            "SANDBOX_MCP_POOL_SIZE": "2",
        }
        parent = start_workers(2, port, env, log)
        health = f"http://127.0.0.1:{port}/health"
        try:
            wait_for(lambda: answers(health) and len(worker_pids(log)) == 2, "two workers")
            first, second = worker_pids(log)
            os.kill(first, signal.SIGKILL)
            # The parent starts a replacement; the other worker answers meanwhile.
            wait_for(lambda: len(worker_pids(log)) == 3, "a replacement worker")
            wait_for(lambda: answers(health), "an answer after the kill")
            replacement = worker_pids(log)[2]
            assert replacement not in (first, second)
            # The two processes serve one pool (its figures come from the database).
            for _ in range(6):
                assert httpx2.get(health, timeout=5).json()["pool"]["size"] == 2
        finally:
            parent.send_signal(signal.SIGTERM)
            code = parent.wait(timeout=30)
        assert code == 0
        for pid in (second, replacement):
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # every worker stopped with the parent
