"""Workspaces are nosuid,nodev inside their containers (issue 12).

Docker 20.10 takes no flags on a bind mount, so ``sandbox-mcp provision`` (root)
makes the slots folder a mount of its own carrying them; a workspace bind-mounted
from it inherits them. Before, a workspace showed ``rw,relatime`` and a setuid-root
binary put there ran as root in a container without no-new-privileges.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx2
import pytest
from e2e_server import start_server, stop_server
from mcp_http import run_command, tool

from pool.mount_flags import missing_flags

BASE_IMAGE = "sandbox-mcp/base:bookworm"


@pytest.fixture
def provisioned(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("provisioning mounts the slots folder: run this test as root (CI does)")
    state = tmp_path / "state"
    env = {**os.environ, "SANDBOX_MCP_STATE_DIR": str(state), "SANDBOX_MCP_AUTH": "none"}
    done = subprocess.run(
        [sys.executable, "-m", "app", "provision", "--slots", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "remounted nosuid,nodev" in done.stdout, done.stdout
    try:
        yield state
    finally:
        subprocess.run(["umount", str(state / "slots")], check=False, timeout=60)


def test_provision_seals_the_slots_and_is_idempotent(provisioned: Path) -> None:
    slots = provisioned / "slots"
    assert missing_flags(slots) == []
    assert missing_flags(provisioned) != [], "only the slots folder is remounted, not its parent"
    again = subprocess.run(
        [sys.executable, "-m", "app", "provision", "--slots", "2"],
        env={**os.environ, "SANDBOX_MCP_STATE_DIR": str(provisioned), "SANDBOX_MCP_AUTH": "none"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "remounted" not in again.stdout  # already sealed: no second mount stacked
    mounts = Path("/proc/self/mountinfo").read_text().count(f" {os.path.realpath(slots)} ")
    assert mounts == 1


def test_a_setuid_binary_in_a_workspace_does_not_elevate(provisioned: Path) -> None:
    # Even without no-new-privileges (the server always sets it), nosuid alone stops it.
    slot = provisioned / "slots" / "slot-000"
    os.chmod(slot, 0o755)  # the slot is 0700 root; a workspace would be the user's
    binary = slot / "id"
    shutil.copy("/usr/bin/id", binary)
    os.chown(binary, 0, 0)
    os.chmod(binary, 0o4755)
    client = docker.from_env()
    try:
        out = client.containers.run(
            BASE_IMAGE,
            ["sh", "-c", "stat -c %a /workspace/id; /workspace/id -u"],
            user="1000:1000",
            network_mode="none",
            volumes={str(slot): {"bind": "/workspace", "mode": "rw"}},
            remove=True,
        ).decode()
    finally:
        client.close()
    assert out.split() == ["4755", "1000"], out


async def test_workspaces_of_the_real_server_show_nosuid_nodev(provisioned: Path) -> None:
    server = start_server(provisioned, SANDBOX_MCP_POOL_SIZE="2")
    try:
        assert "runtime.workspace_mount_flags" not in server.log()
        async with httpx2.AsyncClient(timeout=120) as http:
            created = await tool(http, server, "", "create_experiment", {"name": "flags"})
            assert not created["is_error"], created
            ran = await run_command(
                http,
                server,
                "",
                created["experiment_id"],
                "awk '$5 == \"/workspace\" {print $6}' /proc/self/mountinfo",
            )
        options = ran["stdout"].strip().split(",")
        assert {"nosuid", "nodev"} <= set(options), ran
    finally:
        stop_server(server)
