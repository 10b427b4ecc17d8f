"""A ZFS slot's dataset unmounted under a live experiment (as a zfs-fuse restart
leaves it) comes back: the server's recovery round stops the experiment's container
(its bind mount keeps the dataset busy), mounts the dataset again, seals it
nosuid,nodev again and starts the same container on it. Meanwhile the file tools
answer WORKSPACE_UNAVAILABLE, never an empty workspace. Real zfs-fuse (.ci/run
starts it), a dataset of this test's own (no other test's dataset is touched)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import httpx2
import pytest
from e2e_server import start_server, stop_server
from mcp_http import run_command, tool

from pool.mount_flags import missing_flags

pytestmark = pytest.mark.e2e


@pytest.fixture
def dataset(tmp_path: Path) -> Iterator[str]:
    parent = os.environ.get("SANDBOX_MCP_TEST_ZFS_PARENT")
    if not parent:
        pytest.fail("SANDBOX_MCP_TEST_ZFS_PARENT is not set: source /tmp/dev/env.sh (.ci/run)")
    if os.geteuid() != 0:
        pytest.fail("mounting datasets needs root: run this test as root (CI does)")
    name = f"{parent}/rm{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state")}
    subprocess.run(
        [sys.executable, "-m", "app", "provision", "--slots", "1", "--zfs-parent", name],
        check=True, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    mountpoint = zfs("get", "-H", "-o", "value", "mountpoint", name)
    yield name
    # The stopped server leaves its containers to its next start's sweep: removed here,
    # since their bind mounts keep the dataset busy.
    engine = docker.from_env()
    for found in engine.api.containers(all=True):
        if any(m["Source"].startswith(f"{mountpoint}/") for m in found["Mounts"]):
            engine.api.remove_container(found["Id"], force=True)
    for _ in range(10):
        if subprocess.run(["zfs", "destroy", "-r", name], capture_output=True).returncode == 0:
            break
        time.sleep(0.5)


def zfs(*args: str) -> str:
    done = subprocess.run(["zfs", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


async def test_an_unmounted_slot_dataset_is_mounted_again_under_its_live_experiment(
    http: httpx2.AsyncClient, tmp_path: Path, dataset: str
) -> None:
    slot = f"{dataset}/slot-000"
    root = Path(zfs("get", "-H", "-o", "value", "mountpoint", slot))
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_SLOT_BACKEND="zfs",
        SANDBOX_MCP_ZFS_PARENT=dataset,
        SANDBOX_MCP_POOL_SIZE="1",
        SANDBOX_MCP_PROCESS_STALE_S="3",  # a recovery round every 0.5 s
    )
    try:
        made = await tool(http, server, "", "create_experiment", {"files": {"a.txt": "kept\n"}})
        assert not made["is_error"], made
        experiment = made["experiment_id"]
        ran = await run_command(http, server, "", experiment, "echo written > b.txt")
        assert ran["exit_code"] == 0, ran
        assert missing_flags(root) == []
        zfs("unmount", slot)  # succeeds though the container's bind mount holds it
        assert zfs("get", "-H", "-o", "value", "mounted", slot) == "no"
        # Until it is back: a clear error, never the empty folder left in its place.
        read = await tool(
            http, server, "", "read_sandbox_file", {"experiment_id": experiment, "path": "a.txt"}
        )
        if read["is_error"]:
            assert read["error"]["code"] == "WORKSPACE_UNAVAILABLE", read
        else:
            assert read["content"] == "kept\n", read  # the round was quicker
        wait_for(lambda: '"slot.remounted"' in server.log(), "the remount")
        assert zfs("get", "-H", "-o", "value", "mounted", slot) == "yes"
        assert missing_flags(root) == []  # sealed again
        read = await tool(
            http, server, "", "read_sandbox_file", {"experiment_id": experiment, "path": "a.txt"}
        )
        assert not read["is_error"], read
        assert read["content"] == "kept\n"
        # The same container, started again on the remounted workspace.
        ran = await run_command(
            http, server, "", experiment, "cat a.txt b.txt; grep ' /workspace ' /proc/mounts"
        )
        assert ran["exit_code"] == 0, ran
        assert ran["stdout"].startswith("kept\nwritten\n"), ran
        assert "nosuid" in ran["stdout"], ran["stdout"]
        assert "nodev" in ran["stdout"], ran["stdout"]
        shown = await tool(http, server, "", "get_experiment", {"experiment_id": experiment})
        assert shown["state"] != "FAILED", shown
    finally:
        stop_server(server)
    assert '"slot.mount_lost"' in server.log()


async def test_a_slot_mounted_again_outside_the_server_is_sealed_before_its_container_runs(
    http: httpx2.AsyncClient, tmp_path: Path, dataset: str
) -> None:
    """As after a zfs-fuse restart whose pool the operator imported again: the dataset
    is mounted, but by a new mount without nosuid,nodev, and the experiment's
    container is not running on it. The server seals it before starting the container."""
    slot = f"{dataset}/slot-000"
    root = Path(zfs("get", "-H", "-o", "value", "mountpoint", slot))
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_SLOT_BACKEND="zfs",
        SANDBOX_MCP_ZFS_PARENT=dataset,
        SANDBOX_MCP_POOL_SIZE="1",
        SANDBOX_MCP_PROCESS_STALE_S="3",
    )
    try:
        made = await tool(http, server, "", "create_experiment", {"files": {"a.txt": "kept\n"}})
        assert not made["is_error"], made
        experiment = made["experiment_id"]
        container = made["runtime"]["container_id"] if "runtime" in made else None
        # Held still while its storage changes under it, so no round sees half of it.
        server.process.send_signal(signal.SIGSTOP)
        try:
            engine = docker.from_env()
            [found] = [
                c
                for c in engine.api.containers()
                if any(str(root) in m["Source"] for m in c["Mounts"])
            ]
            assert container is None or found["Id"].startswith(container)
            engine.api.stop(found["Id"], timeout=2)
            zfs("unmount", slot)
            zfs("mount", slot)
            assert missing_flags(root) == ["nosuid", "nodev"]
        finally:
            server.process.send_signal(signal.SIGCONT)
        wait_for(lambda: '"slot.mount_renewed"' in server.log(), "the renewed mount noticed")
        assert missing_flags(root) == []
        ran = await run_command(
            http, server, "", experiment, "cat a.txt; grep ' /workspace ' /proc/mounts"
        )
        assert ran["exit_code"] == 0, ran
        assert ran["stdout"].startswith("kept\n"), ran
        assert "nosuid" in ran["stdout"], ran["stdout"]
        assert "nodev" in ran["stdout"], ran["stdout"]
    finally:
        stop_server(server)
