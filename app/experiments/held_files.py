"""Bytes a sandbox's processes hold in files that have no name any more.

A file deleted while a process keeps it open (or mapped) keeps its blocks on the
slot's filesystem until the last descriptor closes and the last mapping goes, but
no walk of the slot's tree can find it. So the dir budget also looks, from the
host, at every descriptor (``/proc/<pid>/fd``) and every file mapping
(``/proc/<pid>/map_files``) of every process of the sandbox's containers, and
counts the allocated blocks (``st_blocks``) of the regular files among them that
have no link left (``st_nlink == 0``: deleted, or made with ``O_TMPFILE``) and lie
on the slot's filesystem; each file once, however many hold it.

This needs the host's view of those processes: the server in the engine's pid
namespace with ``CAP_SYS_PTRACE`` (another user's descriptors) and ``CAP_SYS_ADMIN``
(its mappings), which root on the host has. Without them the held files are
unseen: ``missing_capabilities`` tells it at start, and the server logs it once.
A pid is only looked at while its ``/proc/<pid>/cgroup`` names the container, so a
pid reused by another process, or a pid of another namespace, is never counted.

Work is bounded: at most ``max_entries`` descriptors and mappings are looked at
(each one ``stat``); past that the slot counts as over, as past its tree's
``DIR_SLOT_MAX_ENTRIES`` (a process can hold a million descriptors).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_CAP_SYS_PTRACE = 19
_CAP_SYS_ADMIN = 21


@dataclass(frozen=True)
class Held:
    bytes: int
    entries: int  # descriptors and mappings looked at
    truncated: bool  # stopped at max_entries: counted as over the budget
    unreadable: int  # processes of the containers this server could not look into


def missing_capabilities(status: Path = PROC / "self" / "status") -> list[str]:
    """The capabilities this process lacks to see the held files (empty: none)."""
    effective = 0
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
    wanted = {"CAP_SYS_PTRACE": _CAP_SYS_PTRACE, "CAP_SYS_ADMIN": _CAP_SYS_ADMIN}
    return [name for name, bit in wanted.items() if not effective >> bit & 1]


def _of_container(pid: int, container_id: str) -> bool | None:
    """Whether the pid is a process of the container; None: no such process (exited)."""
    try:
        return container_id in (PROC / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return False


def held_bytes(pids_of: Mapping[str, Sequence[int]], device: int, max_entries: int) -> Held:
    """Blocks of the unlinked files the containers' processes hold on ``device``
    (blocking). ``pids_of``: each container's processes, as host pids."""
    total = entries = unreadable = 0
    seen: set[tuple[int, int]] = set()
    for container_id, pids in pids_of.items():
        for pid in pids:
            ours = _of_container(pid, container_id)
            if not ours:
                unreadable += ours is False  # another namespace's pid, or a reused one
                continue
            for table in ("fd", "map_files"):
                folder = PROC / str(pid) / table
                try:
                    names = os.listdir(folder)
                except FileNotFoundError:
                    continue  # exited meanwhile
                except OSError:
                    unreadable += 1
                    continue
                for name in names:
                    entries += 1
                    if entries > max_entries:
                        return Held(total, entries, True, unreadable)
                    try:
                        st = os.stat(folder / name)  # the file the descriptor or mapping holds
                    except OSError:
                        continue  # closed or unmapped meanwhile
                    if st.st_nlink or st.st_dev != device or not stat.S_ISREG(st.st_mode):
                        continue
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
    return Held(total, entries, False, unreadable)
