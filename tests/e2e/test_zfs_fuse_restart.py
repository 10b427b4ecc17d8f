"""Live experiments after a restart of the real zfs-fuse under a running server
(issue 14): their workspaces come back with their files, sealed nosuid,nodev, in
their containers started again; meanwhile the file tools answer
WORKSPACE_UNAVAILABLE, never an empty workspace, and the experiments are not failed
for the outage.

DISRUPTIVE: it restarts the machine's zfs-fuse (as .ci/lib/services.sh starts it),
so every ZFS mount is dead for a few seconds, whoever uses it; run it alone (CI
runs tests one after the other). The datasets mounted before are mounted and
sealed again afterwards.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server, stop_server
from mcp_http import run_command, tool
from test_zfs_remount_over_http import dataset, wait_for, zfs
from zfs_control import restore_others, zfs_fuse_restart

from pool.mount_flags import missing_flags

pytestmark = pytest.mark.e2e

__all__ = ["dataset"]  # the fixture, shared with the remount tests


async def test_live_experiments_come_back_after_a_zfs_fuse_restart(
    http: httpx2.AsyncClient, tmp_path: Path, dataset: str
) -> None:
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
        ran = await run_command(http, server, "", experiment, "echo written > b.txt")
        assert ran["exit_code"] == 0, ran
        before = zfs_fuse_restart()
        try:
            read = await tool(
                http,
                server,
                "",
                "read_sandbox_file",
                {"experiment_id": experiment, "path": "a.txt"},
            )
            if read["is_error"]:
                assert read["error"]["code"] == "WORKSPACE_UNAVAILABLE", read
            else:
                assert read["content"] == "kept\n", read
            wait_for(
                lambda: (
                    '"slot.remounted"' in server.log() or '"slot.mount_renewed"' in server.log()
                ),
                "the workspace mounted again",
                timeout_s=120,
            )
            assert missing_flags(root) == []
            read = await tool(
                http,
                server,
                "",
                "read_sandbox_file",
                {"experiment_id": experiment, "path": "a.txt"},
            )
            assert not read["is_error"], read
            assert read["content"] == "kept\n"
            # The outage passed: the experiment is as its last command left it, not failed.
            shown = await tool(http, server, "", "get_experiment", {"experiment_id": experiment})
            assert shown["state"] == "COMPLETED", shown
            ran = await run_command(
                http, server, "", experiment, "cat a.txt b.txt; grep ' /workspace ' /proc/mounts"
            )
            assert ran["exit_code"] == 0, ran
            assert ran["stdout"].startswith("kept\nwritten\n"), ran
            assert "nosuid" in ran["stdout"], ran["stdout"]
            assert "nodev" in ran["stdout"], ran["stdout"]
        finally:
            restore_others(before)
    finally:
        stop_server(server)
