"""Live experiments after a restart of the real zfs-fuse under a running server
(issue 14): their workspaces come back with their files, sealed nosuid,nodev, in
their containers started again; meanwhile the file tools answer
WORKSPACE_UNAVAILABLE, never an empty workspace, and the experiments are not failed
for the outage.

DISRUPTIVE: it restarts the machine's zfs-fuse (as .ci/lib/services.sh starts it),
so every ZFS mount is dead for a few seconds, whoever uses it. A zfs-fuse of the
test's own cannot be had beside it: the daemon and every `zfs`/`zpool` command meet
at one socket compiled in (/var/run/zfs/zfs_socket), and a second one in a mount
namespace of its own would hide its mounts from the shared dockerd that runs the
containers. So the test runs last in the session (the ``restarts_shared_daemon``
mark, tests/conftest.py), and leaves the daemon as it found it: the datasets mounted
before are mounted and sealed again afterwards, which the test checks.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from e2e_server import stop_server
from mcp_http import tool
from zfs_control import restore_others, zfs_fuse_restart, zfs_mounts
from zfs_slot_server import (
    assert_back_sealed,
    assert_kept_while_away,
    dataset,
    live_experiment,
    read_a,
    slot_root,
    start_on,
    wait_for,
)

from pool.mount_flags import missing_flags

pytestmark = [pytest.mark.e2e, pytest.mark.restarts_shared_daemon]

__all__ = ["dataset"]  # the fixture, shared with the remount tests


async def test_live_experiments_come_back_after_a_zfs_fuse_restart(
    http: httpx2.AsyncClient, tmp_path: Path, dataset: str
) -> None:
    root = slot_root(dataset)
    server = start_on(dataset, tmp_path / "state")
    try:
        experiment, _ = await live_experiment(http, server)
        before = zfs_fuse_restart()
        try:
            await assert_kept_while_away(http, server, experiment)
            wait_for(
                lambda: (
                    '"slot.remounted"' in server.log() or '"slot.mount_renewed"' in server.log()
                ),
                "the workspace mounted again",
                timeout_s=120,
            )
            assert missing_flags(root) == []
            read = await read_a(http, server, experiment)
            assert not read["is_error"], read
            assert read["content"] == "kept\n"
            # The outage passed: the experiment is as its last command left it, not failed.
            shown = await tool(http, server, "", "get_experiment", {"experiment_id": experiment})
            assert shown["state"] == "COMPLETED", shown
            await assert_back_sealed(http, server, experiment, "a.txt b.txt")
        finally:
            restore_others(before)
        assert zfs_mounts() == before, "zfs-fuse's mounts are not as the test found them"
    finally:
        stop_server(server)
