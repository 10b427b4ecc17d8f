"""The service on a real ZFS (zfs-fuse, started by .ci/run): provision, refuse, lease, empty."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from e2e_server import free_port, start_server, stop_server
from mcp_http import probe, run_command, run_to_the_end, tool, write_file
from oauth_browser import new_user, new_users
from zfs_testkit import destroy_server_dataset, new_dataset_name

pytestmark = pytest.mark.integration


@pytest.fixture
def dataset(tmp_path: Path) -> Iterator[str]:
    name = new_dataset_name("svc")
    yield name
    destroy_server_dataset(name, tmp_path)


def slot_file(dataset: str, slot: str) -> Path:
    mountpoint = subprocess.run(
        ["zfs", "get", "-H", "-o", "value", "mountpoint", f"{dataset}/{slot}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(mountpoint) / "evidence.txt"


def wait_until_gone(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def cli(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDBOX_MCP_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_server_refuses_to_start_when_slots_are_missing(dataset: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = cli("provision", "--slots", "2", "--zfs-parent", dataset, "--quota", "100M", state=state)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["created"] == 2
    env = {
        **os.environ,
        "SANDBOX_MCP_STATE_DIR": str(state),
        "SANDBOX_MCP_SLOT_BACKEND": "zfs",
        "SANDBOX_MCP_ZFS_PARENT": dataset,
        "SANDBOX_MCP_POOL_SIZE": "3",
        "SANDBOX_MCP_PORT": str(free_port()),
    }
    refused = subprocess.run(
        [sys.executable, "-m", "app", "serve"], capture_output=True, text=True, env=env, timeout=60
    )
    assert refused.returncode == 1
    assert "slot-002" in refused.stderr
    assert f"sandbox-mcp provision --slots 3 --zfs-parent {dataset}" in refused.stderr
    assert "Traceback" not in refused.stderr


async def test_a_zfs_sandbox_is_leased_used_and_emptied_by_rollback(
    dataset: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    done = cli("provision", "--slots", "2", "--zfs-parent", dataset, "--quota", "200M", state=state)
    assert done.returncode == 0, done.stderr
    server = start_server(
        state,
        probe=True,
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_SLOT_BACKEND="zfs",
        SANDBOX_MCP_ZFS_PARENT=dataset,
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_IDLE_TIMEOUT_S="10",
    )
    try:
        async with httpx2.AsyncClient(timeout=30) as http:
            token = await new_user(http, server.base_url)
            first = await probe(http, server, token, write="evidence.txt")
            assert not first["is_error"], first
            assert first["files"] == ["evidence.txt"]
            evidence = await asyncio.to_thread(slot_file, dataset, first["slot_root"])
            assert evidence.read_bytes() == b"probe"
            # Idle past the timeout: the watchdog rolls the dataset back to @empty.
            assert await asyncio.to_thread(wait_until_gone, evidence, 30)
            again = await probe(http, server, token)
            assert not again["is_error"], again
            assert again["files"] == []
            assert any("emptied" in note for note in again["notes"])
    finally:
        stop_server(server)


async def test_a_tenant_filling_its_slot_stops_no_one_else(dataset: str, tmp_path: Path) -> None:
    """The quota of a ZFS slot bounds what one tenant can write: the database and the
    other tenants keep working while it is full, and it recovers by deleting."""
    state = tmp_path / "state"
    done = cli("provision", "--slots", "2", "--zfs-parent", dataset, "--quota", "40M", state=state)
    assert done.returncode == 0, done.stderr
    server = start_server(
        state,
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_SLOT_BACKEND="zfs",
        SANDBOX_MCP_ZFS_PARENT=dataset,
        SANDBOX_MCP_POOL_SIZE="2",
    )
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            hog, honest = await new_users(http, server.base_url, 2)
            hogs = (await tool(http, server, hog, "create_experiment", {}))["experiment_id"]
            # 100 MB into a 40 MB quota; on a busy machine zfs-fuse may take longer
            # than the synchronous wait, and the job's end is read from its record.
            filled = await run_to_the_end(
                http,
                server,
                hog,
                hogs,
                "dd if=/dev/urandom of=big bs=1M count=100; sync; ls -l big",
            )
            assert filled["status"] in ("completed", "failed"), filled
            assert filled["exit_code"] != 0 or "100" not in filled["stdout"], filled
            stderr = filled["stderr"].lower()
            assert "quota" in stderr or "space" in stderr, filled
            refused = await write_file(http, server, hog, hogs, "more.txt", "x" * 1_000_000)
            assert refused["is_error"], refused
            assert refused["error"]["code"] != "INTERNAL_ERROR", refused

            # The others and the database do not notice.
            health = (await http.get(f"{server.base_url}/health")).json()
            assert health["database"]["ok"], health
            mine = (await tool(http, server, honest, "create_experiment", {}))["experiment_id"]
            wrote = await write_file(http, server, honest, mine, "notes.txt", "fine\n")
            assert not wrote["is_error"], wrote
            ran = await run_command(http, server, honest, mine, "cat notes.txt")
            assert ran["stdout"] == "fine\n"
            assert await new_user(http, server.base_url)  # signing in still works

            # The full tenant recovers by deleting.
            freed = await run_command(
                http, server, hog, hogs, "rm -f big && echo ok > small && cat small"
            )
            assert freed["stdout"] == "ok\n", freed
    finally:
        stop_server(server)
