"""Counting the files a real process holds after deleting them: by descriptor or by
mapping, once each, only on the slot's filesystem, only for the container's processes,
and within a bound on the descriptors looked at."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_fakes import FakeBackend

from app.experiments import held_files
from app.experiments.core.jobs import JobRegistry
from app.experiments.core.records import DiskHoldings
from app.experiments.disk_budget import DiskBudget, DiskUsage, measure_slot
from app.experiments.held_files import held_bytes, missing_capabilities

MB = 1_048_576

# Writes FILES files of MB_EACH MB in the folder, holds each by descriptor (twice, one
# dup) or by a mapping only (its descriptor closed), deletes them, says "held", waits.
HOLDER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
c = ctypes
libc.mmap.argtypes = [c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_long]
folder, files, mb_each, mapped = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keep = []
for n in range(files):
    path = os.path.join(folder, f"held{n}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    for _ in range(mb_each):
        os.write(fd, b"h" * 1048576)
    os.unlink(path)
    if mapped == "mapped":  # through libc: Python's mmap object keeps a descriptor
        keep.append(libc.mmap(None, mb_each * 1048576, 1, 1, fd, 0))  # PROT_READ, MAP_SHARED
        assert keep[-1] not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        os.close(fd)
    else:
        keep.append((fd, os.dup(fd)))
print("held", flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def holding(folder: Path, files: int, mb_each: int, how: str = "open") -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), str(files), str(mb_each), how],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def slot(tmp_path: Path) -> Path:
    root = tmp_path / "slot"
    root.mkdir()
    return root


def own_cgroup(pid: int) -> str:
    """What names this process's "container" here: its own cgroup path."""
    return Path(f"/proc/{pid}/cgroup").read_text().splitlines()[0].split(":", 2)[2]


def test_the_server_can_see_held_files_here() -> None:
    assert missing_capabilities() == [], "the tests run as root, like the server"


@pytest.mark.parametrize("how", ["open", "mapped"])
def test_deleted_files_held_open_or_mapped_count_once_each(slot: Path, how: str) -> None:
    device = os.stat(slot).st_dev
    with holding(slot, files=6, mb_each=2, how=how) as pid:
        held = held_bytes({own_cgroup(pid): [pid, pid]}, device, 100_000)
        print(f"\n{how}: {held.bytes / MB:.1f} MB held by pid {pid} (written: 12 MB)")
        assert 12 * MB <= held.bytes < 13 * MB  # each file once (dup, and the pid twice)
        assert not held.truncated
        assert held.unreadable == 0
        usage, unreadable = measure_slot(slot, {own_cgroup(pid): [pid]}, 100_000)
        assert 12 * MB <= usage.bytes < 13 * MB
        assert not usage.truncated
        assert unreadable == 0
        assert list(slot.iterdir()) == []  # no name the walk could find


def test_files_on_another_filesystem_or_of_another_container_do_not_count(slot: Path) -> None:
    device = os.stat(slot).st_dev
    with holding(slot, files=2, mb_each=2) as pid:
        assert held_bytes({own_cgroup(pid): [pid]}, device + 1, 100_000).bytes == 0
        other = held_bytes({"0123456789abcdef-not-this-container": [pid]}, device, 100_000)
        assert (other.bytes, other.entries, other.unreadable) == (0, 0, 1)


def test_a_process_that_is_gone_holds_nothing(slot: Path) -> None:
    device = os.stat(slot).st_dev
    with holding(slot, files=1, mb_each=1) as pid:
        container = own_cgroup(pid)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = held_bytes({container: [pid]}, device, 100_000)
    assert (gone.bytes, gone.unreadable) == (0, 0)


def test_the_descriptors_looked_at_are_bounded_and_past_it_the_slot_is_over(slot: Path) -> None:
    device = os.stat(slot).st_dev
    with holding(slot, files=40, mb_each=1) as pid:
        looked = len(os.listdir(f"/proc/{pid}/fd"))
        assert looked > 80  # two descriptors a file
        held = held_bytes({own_cgroup(pid): [pid]}, device, 50)
        assert held.truncated
        assert held.entries == 51
        (slot / "named").write_bytes(b"x")
        usage, _ = measure_slot(slot, {own_cgroup(pid): [pid]}, 50)
        assert usage.truncated
        assert usage.over(10**12)


async def test_the_budget_counts_what_its_containers_processes_hold(slot: Path) -> None:
    backend = FakeBackend()
    budget = DiskBudget(
        slot_root_of=lambda key: slot,
        holdings_of=lambda key: asyncio.sleep(0, DiskHoldings(("c-1",), 0)),
        jobs=JobRegistry(),
        backend=backend,
        limit_bytes=8 * MB,
        max_entries=100_000,
        interval_s=60,
    )
    with holding(slot, files=6, mb_each=2) as pid:
        # no pids known
        assert (await budget.measure("sandbox")) == DiskUsage(0, 0, truncated=False)
        backend.host_processes["c-1"] = [pid]
        with pytest.MonkeyPatch.context() as patch:  # the holder stands for c-1's process
            patch.setattr(held_files, "_of_container", lambda p, c: p == pid and c == "c-1")
            usage = await budget.measure("sandbox")
    assert usage is not None
    assert 12 * MB <= usage.bytes < 13 * MB
    assert usage.over(budget.limit_bytes)
