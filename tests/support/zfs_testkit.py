"""Datasets of the tests' own on the zfs-fuse pool that .ci/run starts."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from docker_testkit import remove_containers_mounting
from mounts_testkit import unmount_below


def new_dataset_name(prefix: str) -> str:
    """A dataset name (not created) below ``SANDBOX_MCP_TEST_ZFS_PARENT``; a test
    needing it fails, never skips, without that pool."""
    parent = os.environ.get("SANDBOX_MCP_TEST_ZFS_PARENT")
    if not parent:
        pytest.fail(
            "SANDBOX_MCP_TEST_ZFS_PARENT is not set: this test needs the zfs-fuse pool that "
            ".ci/run starts (source .ci/lib/services.sh; start_zfs, or /tmp/dev/env.sh)."
        )
    return f"{parent}/{prefix}{uuid.uuid4().hex[:8]}"


def destroy_server_dataset(dataset: str, test_folder: Path) -> None:
    """Teardown of a dataset a server ran its slots on: its experiments' containers
    (a stopped server leaves them for the next start to adopt) and the slots' seal
    mounts below ``test_folder`` keep it busy until they are gone."""
    done = subprocess.run(
        ["zfs", "get", "-H", "-o", "value", "mountpoint", dataset],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode == 0:
        remove_containers_mounting(Path(done.stdout.strip()))
    unmount_below(test_folder)
    destroy_dataset(dataset, force=True)


def destroy_dataset(dataset: str, *, force: bool = False) -> None:
    """Teardown: zfs-fuse refuses to destroy a just-used dataset for a while ("busy",
    seconds on a loaded machine, over 30 s beside four busy processes); retry for up to
    180 s, with ``-f`` after the first 30. ``force`` unmounts it first from the start,
    even if zfs-fuse still counts it as in use."""
    started = time.monotonic()
    while True:
        forced = force or time.monotonic() - started > 30
        command = ["zfs", "destroy", "-r", *(["-f"] if forced else []), dataset]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode == 0 or "does not exist" in done.stderr:
            return
        if time.monotonic() - started > 180:
            pytest.fail(f"could not destroy {dataset}: {done.stderr}")
        time.sleep(0.5)
