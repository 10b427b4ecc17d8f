"""The ext4 placement hint on slot roots (pool/spread.py), on real folders."""

from __future__ import annotations

import array
import fcntl
import os
from pathlib import Path

import pytest
from pool_fakes import opened

from pool.provision import provision_dir
from pool.slots_dir import DirSlotStore
from pool.spread import FS_IOC_GETFLAGS, FS_TOPDIR_FL, spread_subfolders


def has_topdir_flag(folder: Path) -> bool:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        return bool(flags[0] & FS_TOPDIR_FL)
    finally:
        os.close(fd)


def supports_flag(parent: Path) -> bool:
    """Whether the file system under ``parent`` keeps the flag (ext2/3/4 do)."""
    probe = parent / "probe"
    probe.mkdir()
    try:
        return spread_subfolders(probe)
    finally:
        probe.rmdir()


def test_a_folder_gets_the_flag_and_a_second_call_keeps_it(tmp_path: Path) -> None:
    folder = tmp_path / "slot"
    folder.mkdir()
    if not supports_flag(tmp_path):
        pytest.fail("tmp_path should be on ext4 here (the CI disk); this test needs it")
    assert not has_topdir_flag(folder)
    assert spread_subfolders(folder) is True
    assert has_topdir_flag(folder)
    assert spread_subfolders(folder) is True  # idempotent
    (folder / "exp-1").mkdir()
    assert not has_topdir_flag(folder / "exp-1")  # not inherited: only slot roots carry it


def test_a_file_system_without_the_flag_is_left_alone(tmp_path: Path) -> None:
    shm = Path("/dev/shm")  # tmpfs: it has flags, but not this one
    folder = shm / f"spread-test-{os.getpid()}"
    folder.mkdir()
    try:
        assert spread_subfolders(folder) is False
    finally:
        folder.rmdir()


def test_a_missing_folder_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        spread_subfolders(tmp_path / "missing")


async def test_provisioned_and_reset_slot_roots_carry_the_flag(tmp_path: Path) -> None:
    expected = supports_flag(tmp_path)
    await provision_dir(tmp_path, 2, owner=None)
    roots = [tmp_path / "slots" / f"slot-00{i}" for i in range(2)]
    assert [has_topdir_flag(root) for root in roots] == [expected, expected]
    store = await opened(DirSlotStore(tmp_path))
    try:
        (roots[0] / "exp-x").mkdir()
        await store.reset(store.slot(0))
        assert not (roots[0] / "exp-x").exists()  # a fresh folder in its place
        assert has_topdir_flag(roots[0]) == expected
    finally:
        await store.close()
