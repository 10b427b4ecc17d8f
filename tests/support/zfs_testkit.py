"""Datasets of the tests' own on the zfs-fuse pool that .ci/run starts."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest


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


def destroy_dataset(dataset: str) -> None:
    """Teardown: zfs-fuse refuses to destroy a just-used dataset once ("busy"); retry."""
    for _ in range(8):
        done = subprocess.run(
            ["zfs", "destroy", "-r", dataset], capture_output=True, text=True, timeout=120
        )
        if done.returncode == 0 or "does not exist" in done.stderr:
            return
        time.sleep(0.5)
    pytest.fail(f"could not destroy {dataset}: {done.stderr}")
