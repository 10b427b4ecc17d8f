"""Open, unlinked files are bytes on the host's disk the dir slot's budget never sees.

A command writes files in its workspace, deletes each while it keeps it open, and goes
on holding them: the blocks stay allocated on the slot's filesystem until the last
descriptor closes, but the walk (``measure_tree``) finds no name for them, so the
sandbox is never over its budget, never stopped, and its files never count. Each file
stays under RLIMIT_FSIZE; the number of them is bounded only by the container's open
files (1,048,576 by default) and its lifetime. Measured from the host: the blocks of
the deleted files the container's processes hold (``/proc/<pid>/fd``, as root).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from disk_budget_testkit import BUDGET_MB, INTERVAL_S, SLACK_MB, new_experiment, start_budget_server
from e2e_server import RunningServer, stop_server
from mcp_http import run_command, tool
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

HELD_MB = 4 * BUDGET_MB + SLACK_MB  # far past the budget and its slack
HOLD = f"""python3 - <<'EOF'
import os, time
held = []
for n in range({HELD_MB // 4}):
    fd = os.open(f"held{{n}}", os.O_RDWR | os.O_CREAT, 0o600)
    for _ in range(4):
        os.write(fd, b"h" * 1048576)
    os.unlink(f"held{{n}}")
    held.append(fd)
    time.sleep(0.02)
open("held", "w").write(str(len(held)))
time.sleep(120)
EOF"""

# The same files held by a mapping only: each descriptor closed once the file is mapped
# (through libc: Python's mmap object keeps a descriptor of its own).
MAP_ONLY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
c = ctypes
libc.mmap.argtypes = [c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_long]
def map_only(fd):
    address = libc.mmap(None, 4 * 1048576, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
    assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    os.close(fd)
    return address
"""
HOLD_MAPPED = HOLD.replace("held.append(fd)", "held.append(map_only(fd))").replace(
    "held = []", MAP_ONLY + "held = []"
)


def container_of(experiment: str) -> list[str]:
    found = subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", "--filter", f"name={experiment}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.split()


def held_deleted_mb(container: str) -> float:
    """The blocks of deleted files the container's processes hold open or mapped, in MB."""
    pids = subprocess.run(
        ["docker", "top", container, "-eo", "pid"], capture_output=True, text=True, check=True
    ).stdout.split()[1:]
    seen, total = set(), 0
    for pid in pids:
        held = [*Path(f"/proc/{pid}/fd").iterdir(), *Path(f"/proc/{pid}/map_files").iterdir()]
        for fd in held:
            try:
                if not os.readlink(fd).endswith(" (deleted)"):
                    continue
                st = os.stat(fd)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total / 1_048_576


async def held_or_stopped(
    http: httpx2.AsyncClient, server: RunningServer, token: str, experiment: str
) -> dict[str, Any]:
    """The holder's count once it wrote it, or the last answer once the budget stopped it
    (logged after its kill): whichever comes first, bounded at 60 s. Waiting for the count
    alone spent the whole 60 s whenever the budget worked, since a stopped holder never
    writes it."""
    answer: dict[str, Any] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = await tool(
            http, server, token, "read_sandbox_file", {"experiment_id": experiment, "path": "held"}
        )
        if not answer["is_error"] or "disk.budget_exceeded" in server.log():
            break
        await asyncio.sleep(INTERVAL_S)
    return answer


async def test_open_unlinked_files_count_in_the_budget(tmp_path: Path) -> None:
    await holding_is_stopped(tmp_path, HOLD)


async def test_mapped_unlinked_files_count_in_the_budget(tmp_path: Path) -> None:
    await holding_is_stopped(tmp_path, HOLD_MAPPED)


async def holding_is_stopped(tmp_path: Path, hold: str) -> None:
    server = start_budget_server(tmp_path / "state", pool_size=1)
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            mallory = await new_user(http, server.base_url)
            exp = await new_experiment(http, server, mallory)
            job = await run_command(http, server, mallory, exp, hold, background=True)
            assert not job["is_error"], job
            container = await asyncio.to_thread(container_of, exp)
            assert container, f"no container named after {exp}"
            held = await held_or_stopped(http, server, mallory, exp)
            # Until the budget has seen them and stopped the holder (which holds them for
            # 120 s otherwise), bounded at 60 s: a fixed ten check intervals could end
            # before a busy machine's checks had.
            deadline = time.monotonic() + 60
            while True:
                on_disk = await asyncio.to_thread(held_deleted_mb, container[0])
                if on_disk < BUDGET_MB + SLACK_MB or time.monotonic() > deadline:
                    break
                await asyncio.sleep(INTERVAL_S)
            status = await run_command(http, server, mallory, exp, "echo still here")
            stops = server.log().count("disk.budget_exceeded")
            print(
                f"\nstops: {stops}; files the holder held: {held.get('content')} (None: it was "
                f"stopped before it held them all); {on_disk:.0f} MB of deleted files "
                f"held open on the host's disk (budget {BUDGET_MB} MB, slack {SLACK_MB} MB); "
                f"a write call afterwards: {status.get('status') or status.get('error')}"
            )
            assert on_disk < BUDGET_MB + SLACK_MB, (
                f"{on_disk:.0f} MB on disk past a {BUDGET_MB} MB budget, unseen"
            )
            assert stops >= 1, "the held files were freed, but not by the budget"
            assert "disk.held_files_un" not in server.log()  # seen, every process of it
    finally:
        stop_server(server)
