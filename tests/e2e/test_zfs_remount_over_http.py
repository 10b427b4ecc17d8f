"""A ZFS slot's dataset unmounted under a live experiment (as a zfs-fuse restart
leaves it) comes back: the server's recovery round stops the experiment's container
(its bind mount keeps the dataset busy), mounts the dataset again, seals it
nosuid,nodev again and starts the same container on it. Meanwhile the file tools
answer WORKSPACE_UNAVAILABLE, never an empty workspace. Real zfs-fuse (.ci/run
starts it), a dataset of this test's own (no other test's dataset is touched)."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import docker
import httpx2
import pytest
from e2e_server import stop_server
from mcp_http import tool
from zfs_slot_server import (
    assert_back_sealed,
    assert_kept_while_away,
    dataset,
    live_experiment,
    read_a,
    slot_root,
    start_on,
    wait_for,
    zfs,
)

from pool.mount_flags import missing_flags

pytestmark = pytest.mark.e2e
__all__ = ["dataset"]  # the fixture


async def test_an_unmounted_slot_dataset_is_mounted_again_under_its_live_experiment(
    http: httpx2.AsyncClient, tmp_path: Path, dataset: str
) -> None:
    slot, root = f"{dataset}/slot-000", slot_root(dataset)
    server = start_on(dataset, tmp_path / "state")
    try:
        experiment, _ = await live_experiment(http, server)
        assert missing_flags(root) == []
        zfs("unmount", slot)  # succeeds though the container's bind mount holds it
        assert zfs("get", "-H", "-o", "value", "mounted", slot) == "no"
        await assert_kept_while_away(http, server, experiment)
        wait_for(lambda: '"slot.remounted"' in server.log(), "the remount")
        assert zfs("get", "-H", "-o", "value", "mounted", slot) == "yes"
        assert missing_flags(root) == []  # sealed again
        read = await read_a(http, server, experiment)
        assert not read["is_error"], read
        assert read["content"] == "kept\n"
        # The same container, started again on the remounted workspace.
        await assert_back_sealed(http, server, experiment, "a.txt b.txt")
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
    slot, root = f"{dataset}/slot-000", slot_root(dataset)
    server = start_on(dataset, tmp_path / "state")
    try:
        experiment, made = await live_experiment(http, server, write_b=False)
        container = made["runtime"]["container_id"] if "runtime" in made else None
        # Held still while its storage changes under it, so no round sees half of it.
        server.process.send_signal(signal.SIGSTOP)
        try:
            with contextlib.closing(docker.from_env()) as engine:
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
        await assert_back_sealed(http, server, experiment, "a.txt")
    finally:
        stop_server(server)
