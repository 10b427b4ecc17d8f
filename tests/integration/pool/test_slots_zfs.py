"""ZfsSlotStore and provision_zfs on a real ZFS (zfs-fuse in CI and development).

The parent dataset comes from SANDBOX_MCP_TEST_ZFS_PARENT (CI: ``sandboxci/slots``).
Each session works under its own ``<parent>/t<random>`` child and each test under
a grandchild of it, all destroyed afterwards, so runs never see each other.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pool_fakes import opened
from zfs_testkit import destroy_dataset, new_dataset_name

from pool import _zfs
from pool.errors import PoolError
from pool.mount_flags import missing_flags
from pool.provision import provision_zfs
from pool.slots_zfs import ZfsSlotStore

pytestmark = pytest.mark.integration

QUOTA = "64M"
OWNER = "nobody" if os.geteuid() == 0 else None


def zfs(*args: str) -> str:
    done = subprocess.run(["zfs", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="session")
def session_parent() -> Iterator[str]:
    child = new_dataset_name("t")
    yield child
    destroy_dataset(child)


@pytest.fixture
def parent(session_parent: str) -> Iterator[str]:
    dataset = f"{session_parent}/p{uuid.uuid4().hex[:6]}"
    yield dataset
    destroy_dataset(dataset)


def props(dataset: str, *names: str) -> dict[str, str]:
    out = zfs("get", "-H", "-p", "-o", "property,value", ",".join(names), dataset)
    return dict(line.split("\t") for line in out.splitlines())


def snapshots(parent: str) -> set[str]:
    out = zfs("list", "-H", "-r", "-t", "snapshot", "-o", "name", parent)
    return set(out.split())


def fill(root: Path, count: int) -> None:
    per_folder = count // 10
    for folder in range(10):
        sub = root / f"d{folder}"
        sub.mkdir()
        for i in range(per_folder):
            (sub / f"f{i}.txt").write_text("small file\n")


async def test_provision_creates_locked_down_slots_with_empty_snapshots(parent: str) -> None:
    report = await provision_zfs(parent, 5, quota=QUOTA, owner=OWNER)

    assert (report.created, report.repaired, report.untouched) == (5, 0, 0)
    store = await opened(ZfsSlotStore(parent))
    for index in range(5):
        slot = store.slot(index)
        dataset = f"{parent}/{slot.name}"
        assert props(dataset, "setuid", "devices", "exec", "quota") == {
            "setuid": "off",
            "devices": "off",
            "exec": "on",
            "quota": str(64 * 1024**2),
        }
        st = slot.root.lstat()
        assert stat.S_IMODE(st.st_mode) == 0o700
        if OWNER is not None:
            assert st.st_uid != 0
        assert list(slot.root.iterdir()) == []
    assert snapshots(parent) == {f"{parent}/slot-00{i}@empty" for i in range(5)}
    assert await store.missing(5) == []


async def test_slot_mounts_are_nosuid_nodev_and_stay_so_across_a_reset(parent: str) -> None:
    # zfs-fuse ignores setuid=off devices=off (its mounts show rw,relatime only), so
    # provisioning remounts each slot's mount with the flags a workspace inherits.
    if os.geteuid() != 0:
        pytest.fail("remounting needs root: run this test as root (CI does)")
    await provision_zfs(parent, 2, quota=QUOTA, owner=OWNER)
    store = await opened(ZfsSlotStore(parent))
    slot = store.slot(0)
    assert missing_flags(slot.root) == []
    (slot.root / "left.txt").write_text("x")
    await store.reset(slot)
    assert missing_flags(slot.root) == []
    # A slot that lost them (a remount by hand) is repaired by the next run.
    remount = ["mount", "-o", "remount,bind,suid,dev", str(slot.root)]
    await asyncio.to_thread(subprocess.run, remount, check=True)
    assert missing_flags(slot.root) == ["nosuid", "nodev"]
    again = await provision_zfs(parent, 2, quota=QUOTA, owner=OWNER)
    assert again.repaired == 1, again
    assert missing_flags(slot.root) == []


async def test_reprovision_is_idempotent(parent: str) -> None:
    await provision_zfs(parent, 5, quota=QUOTA, owner=OWNER)
    again = await provision_zfs(parent, 5, quota=QUOTA, owner=OWNER)
    assert (again.created, again.repaired, again.untouched, again.skipped_leased) == (0, 0, 5, ())


async def test_missing_names_the_slot_beyond_the_provisioned_ones(parent: str) -> None:
    await provision_zfs(parent, 5, quota=QUOTA, owner=OWNER)
    store = await opened(ZfsSlotStore(parent))
    assert await store.missing(6) == ["slot-005"]


async def test_a_leased_slot_is_never_repaired_or_rolled_back(parent: str) -> None:
    await provision_zfs(parent, 5, quota=QUOTA, owner=OWNER)
    store = await opened(ZfsSlotStore(parent))
    slot = store.slot(2)
    (slot.root / "work.txt").write_text("agent's work")
    slot.root.chmod(0o755)
    zfs("set", "setuid=on", f"{parent}/{slot.name}")

    report = await provision_zfs(parent, 5, quota=QUOTA, owner=OWNER, leased={2})

    assert report.skipped_leased == ("slot-002",)
    assert (report.repaired, report.untouched) == (0, 4)
    assert (slot.root / "work.txt").read_text() == "agent's work"
    assert props(f"{parent}/{slot.name}", "setuid") == {"setuid": "on"}

    freed = await provision_zfs(parent, 5, quota=QUOTA, owner=OWNER)
    assert freed.repaired == 1
    assert props(f"{parent}/{slot.name}", "setuid") == {"setuid": "off"}
    assert stat.S_IMODE(slot.root.lstat().st_mode) == 0o700
    assert await store.missing(5) == []


async def test_a_free_slot_without_its_snapshot_is_rebuilt_empty(parent: str) -> None:
    await provision_zfs(parent, 2, quota=QUOTA, owner=OWNER)
    store = await opened(ZfsSlotStore(parent))
    slot = store.slot(1)
    (slot.root / "junk").write_text("x")
    zfs("destroy", f"{parent}/{slot.name}@empty")
    assert await store.missing(2) == ["slot-001"]

    report = await provision_zfs(parent, 2, quota=QUOTA, owner=OWNER)

    assert report.repaired == 1
    assert f"{parent}/slot-001@empty" in snapshots(parent)
    assert list(slot.root.iterdir()) == []
    assert await store.missing(2) == []


async def test_reset_empties_5000_files(parent: str) -> None:
    await provision_zfs(parent, 2, quota=QUOTA, owner=OWNER)
    store = await opened(ZfsSlotStore(parent))
    slot = store.slot(0)
    fill(slot.root, 5_000)
    assert sum(1 for _ in slot.root.rglob("*")) == 5_010

    started = time.perf_counter()
    await store.reset(slot)
    elapsed = time.perf_counter() - started

    assert list(slot.root.iterdir()) == []  # visible-empty as soon as reset returns
    assert stat.S_IMODE(slot.root.lstat().st_mode) == 0o700
    # Generous: it guards a reset that hangs, not its speed. A rollback first syncs what
    # was written; on zfs-fuse that took 0.7 to 5.8 s for these 5,000 files on a busy
    # machine, about as long as deleting them one by one, so no floor can tell the two
    # apart by the clock (the snapshot itself is what makes it a rollback).
    assert elapsed < 60, f"rollback took {elapsed:.2f} s"
    (slot.root / "again").write_text("usable after reset")
    await store.reset(slot)
    assert list(slot.root.iterdir()) == []
    await store.close()


def write_until_refused(path: Path, limit: int) -> tuple[int, OSError | None]:
    chunk = os.urandom(1024 * 1024)  # random: compression cannot dodge the quota
    written = 0
    try:
        with path.open("wb") as handle:
            while written < limit:
                handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
                written += len(chunk)
    except OSError as exc:
        return written, exc
    return written, None


async def test_quota_stops_writes(parent: str) -> None:
    await provision_zfs(parent, 1, quota=QUOTA, owner=OWNER)
    store = await opened(ZfsSlotStore(parent))
    root = store.slot(0).root

    written, refused = write_until_refused(root / "big", 256 * 1024**2)

    assert refused is not None, f"wrote {written} bytes past a {QUOTA} quota"
    assert refused.errno in (errno.EDQUOT, errno.ENOSPC)
    assert written <= 80 * 1024**2
    await store.reset(store.slot(0))
    assert list(root.iterdir()) == []


async def test_reset_of_an_unprovisioned_slot_says_so(parent: str) -> None:
    await provision_zfs(parent, 1, quota=QUOTA, owner=OWNER)
    store = await opened(ZfsSlotStore(parent))
    with pytest.raises(PoolError) as caught:
        await store.reset(store.slot(3))
    assert caught.value.code == "SLOT_MISSING"
    assert "provision" in caught.value.message


async def test_open_refuses_a_parent_that_does_not_exist(parent: str) -> None:
    with pytest.raises(PoolError) as caught:
        await opened(ZfsSlotStore(f"{parent}/never-made"))
    assert caught.value.code == "ZFS_DATASET_NOT_FOUND"


async def test_provision_refuses_a_pool_that_does_not_exist() -> None:
    with pytest.raises(PoolError) as caught:
        await provision_zfs(f"nopool{uuid.uuid4().hex[:6]}/slots", 1, quota=None, owner=None)
    assert caught.value.code == "ZFS_POOL_NOT_FOUND"
    assert "never creates pools" in caught.value.message


async def test_destroy_retries_until_a_busy_dataset_is_released(parent: str) -> None:
    await provision_zfs(parent, 1, quota=None, owner=None)
    store = await opened(ZfsSlotStore(parent))
    holder = await asyncio.create_subprocess_exec("sleep", "30", cwd=store.slot(0).root)

    async def release() -> None:
        await asyncio.sleep(0.5)
        holder.kill()
        await holder.wait()

    releasing = asyncio.create_task(release())
    await _zfs.destroy(f"{parent}/slot-000", attempts=8, first_delay=0.25)
    await releasing

    assert await store.missing(1) == ["slot-000"]
