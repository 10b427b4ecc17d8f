"""Live experiments after a restart of a real zfs-fuse under a running server
(issue 14): their workspaces come back with their files, sealed nosuid,nodev, in
their containers started again; meanwhile the file tools answer
WORKSPACE_UNAVAILABLE, never an empty workspace, and the experiments are not failed
for the outage.

The zfs-fuse that restarts is the test's own, never the machine's shared one: it
runs in a mount namespace of the test's own, where the folders of its socket, lock
and pool cache (paths compiled into zfs-fuse) are private, with a pool of the test's
own on a small file (tests/support/zfs_control.py). Its mounts are seen in that
namespace only, so the server under test, its `provision` and the dockerd that runs
its containers (a dockerd of the test's own, tests/support/dockerd_control.py) run
there too. The test checks that the machine's zfs-fuse is the process it found, and
that none of its own mounts showed outside the namespace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from dockerd_control import PrivateDockerd, private_dockerd
from e2e_server import stop_server
from mcp_http import tool
from zfs_control import PrivateZfs, fuse_zfs_mounts, private_zfs, shared_zfs_fuse
from zfs_slot_server import (
    assert_back_sealed,
    assert_kept_while_away,
    live_experiment,
    read_when_back,
    start_on,
    wait_for,
)

from pool.mount_flags import missing_flags

pytestmark = pytest.mark.e2e

IMAGE = "sandbox-mcp/python:3"


@pytest.fixture
def zfs(tmp_path: Path) -> Iterator[PrivateZfs]:
    work = tmp_path / "zfs"
    work.mkdir()
    shared = shared_zfs_fuse()
    with private_zfs(work) as private:
        yield private
        # Its mounts were the namespace's only (the shared pool's mounts come and go
        # with other work, so they are not compared).
        assert not [p for p in fuse_zfs_mounts() if p.startswith(f"{work}/")]
    assert shared_zfs_fuse() == shared, "the machine's zfs-fuse was restarted"


@pytest.fixture
def dockerd(tmp_path: Path, zfs: PrivateZfs) -> Iterator[PrivateDockerd]:
    work = tmp_path / "dockerd"
    work.mkdir()
    with private_dockerd(work, images=(IMAGE,), namespace_pid=zfs.holder.pid) as daemon:
        yield daemon


@pytest.fixture
def dataset(tmp_path: Path, zfs: PrivateZfs) -> str:
    """A provisioned one-slot dataset (sealed nosuid,nodev by provision, as root), on
    the test's own pool: it goes with the pool."""
    name = f"{zfs.pool}/slots"
    provision = [sys.executable, "-m", "app", "provision", "--slots", "1", "--zfs-parent", name]
    provisioned = subprocess.run(
        [*zfs.enter, *provision],
        env={**os.environ, "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state")},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert provisioned.returncode == 0, provisioned.stderr
    return name


async def test_live_experiments_come_back_after_a_zfs_fuse_restart(
    http: httpx2.AsyncClient, tmp_path: Path, zfs: PrivateZfs, dockerd: PrivateDockerd, dataset: str
) -> None:
    root = zfs.path(Path(zfs.zfs("get", "-H", "-o", "value", "mountpoint", f"{dataset}/slot-000")))
    server = start_on(
        dataset,
        tmp_path / "state",
        enter=tuple(zfs.enter),
        DOCKER_HOST=dockerd.host,
        SANDBOX_MCP_DEFAULT_IMAGE=IMAGE,
        SANDBOX_MCP_IMAGES=IMAGE,
    )
    try:
        experiment, _ = await live_experiment(http, server)
        assert missing_flags(root) == []
        zfs.restart()
        await assert_kept_while_away(http, server, experiment)
        wait_for(
            lambda: '"slot.remounted"' in server.log() or '"slot.mount_renewed"' in server.log(),
            "the workspace mounted again",
            timeout_s=120,
        )
        assert missing_flags(root) == []
        read = await read_when_back(http, server, experiment)
        # What the remounted slot holds, to tell lost files from a path not seen yet.
        held = sorted(str(f.relative_to(root)) for f in root.rglob("*"))
        assert not read["is_error"], (read, held)
        assert read["content"] == "kept\n"
        # The outage passed: the experiment is as its last command left it, not failed.
        shown = await tool(http, server, "", "get_experiment", {"experiment_id": experiment})
        assert shown["state"] == "COMPLETED", shown
        await assert_back_sealed(http, server, experiment, "a.txt b.txt")
    finally:
        stop_server(server)
