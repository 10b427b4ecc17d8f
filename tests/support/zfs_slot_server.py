"""A server on a one-slot ZFS dataset of the test's own, and the live experiment
whose workspace the remount tests take away and bring back (test_zfs_remount_over_http
on the shared pool; test_zfs_fuse_restart on a zfs-fuse and pool of its own)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, start_server
from mcp_http import run_command, tool
from zfs_testkit import destroy_server_dataset, new_dataset_name


def zfs(*args: str, busy_s: float = 120) -> str:
    """``zfs *args``; retried while zfs-fuse answers "busy" (for ``busy_s`` at most): on a
    loaded host it held a just-unmounted slot busy for seconds (the loaded CI run)."""
    deadline = time.monotonic() + busy_s
    while True:
        done = subprocess.run(["zfs", *args], capture_output=True, text=True, timeout=60)
        if done.returncode == 0 or "busy" not in done.stderr or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def dataset(tmp_path: Path) -> Iterator[str]:
    """A provisioned one-slot dataset (sealed nosuid,nodev by provision, as root)."""
    if os.geteuid() != 0:
        pytest.fail("mounting datasets needs root: run this test as root (CI does)")
    name = new_dataset_name("rm")
    env = {**os.environ, "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state")}
    subprocess.run(
        [sys.executable, "-m", "app", "provision", "--slots", "1", "--zfs-parent", name],
        check=True, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    yield name
    destroy_server_dataset(name, tmp_path)


def start_on(
    dataset: str, state: Path, *, enter: tuple[str, ...] = (), **env: str
) -> RunningServer:
    """A server on ``dataset``'s one slot, its recovery round every 0.5 s (``enter``,
    ``env``: as start_server takes them)."""
    return start_server(
        state,
        wrapper=enter,
        SANDBOX_MCP_SLOT_BACKEND="zfs",
        SANDBOX_MCP_ZFS_PARENT=dataset,
        SANDBOX_MCP_POOL_SIZE="1",
        SANDBOX_MCP_PROCESS_STALE_S="3",
        **env,
    )


def slot_root(dataset: str) -> Path:
    return Path(zfs("get", "-H", "-o", "value", "mountpoint", f"{dataset}/slot-000"))


async def live_experiment(
    http: httpx2.AsyncClient, server: RunningServer, *, write_b: bool = True
) -> tuple[str, dict[str, Any]]:
    """An experiment with a.txt ("kept") and, by a command, b.txt ("written")."""
    made = await tool(http, server, "", "create_experiment", {"files": {"a.txt": "kept\n"}})
    assert not made["is_error"], made
    experiment = made["experiment_id"]
    if write_b:
        ran = await run_command(http, server, "", experiment, "echo written > b.txt")
        assert ran["exit_code"] == 0, ran
    return experiment, made


async def read_a(http: httpx2.AsyncClient, server: RunningServer, experiment: str) -> Any:
    return await tool(
        http, server, "", "read_sandbox_file", {"experiment_id": experiment, "path": "a.txt"}
    )


async def assert_kept_while_away(
    http: httpx2.AsyncClient, server: RunningServer, experiment: str
) -> None:
    """While the workspace is away: a clear error, never the empty folder in its place."""
    read = await read_a(http, server, experiment)
    if read["is_error"]:
        assert read["error"]["code"] == "WORKSPACE_UNAVAILABLE", read
    else:
        assert read["content"] == "kept\n", read  # the recovery round was quicker


async def read_when_back(
    http: httpx2.AsyncClient, server: RunningServer, experiment: str, timeout_s: float = 60
) -> Any:
    """The first read that answers the kept file, each one before it a clear error
    (``assert_kept_while_away``), never an empty or wrong answer. Polled, not read once:
    ``slot.remounted`` is logged once the dataset is mounted and sealed, and the file
    tools' check that the workspace is there may answer a moment later on a busy machine
    (seen twice in about fifty runs, 0.2 s after the log line)."""
    deadline = time.monotonic() + timeout_s
    while True:
        read = await read_a(http, server, experiment)
        if not read["is_error"] or time.monotonic() > deadline:
            return read
        assert read["error"]["code"] == "WORKSPACE_UNAVAILABLE", read
        await asyncio.sleep(0.25)


async def assert_back_sealed(
    http: httpx2.AsyncClient, server: RunningServer, experiment: str, files: str
) -> None:
    """Its container runs on the workspace again: ``cat files`` gives what it held,
    and /workspace is mounted nosuid,nodev."""
    ran = await run_command(
        http, server, "", experiment, f"cat {files}; grep ' /workspace ' /proc/mounts"
    )
    assert ran["exit_code"] == 0, ran
    expected = "kept\nwritten\n" if "b.txt" in files else "kept\n"
    assert ran["stdout"].startswith(expected), ran
    assert "nosuid" in ran["stdout"], ran["stdout"]
    assert "nodev" in ran["stdout"], ran["stdout"]
