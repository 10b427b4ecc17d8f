"""A container's processes as host pids, read from its cgroup instead of ``docker top``.

The disk budget asks for them after every writing call and every interval for each
sandbox with a live container (app/experiments/disk_budget.py). ``docker top`` makes
the engine run ``ps`` over every process of the host, one at a time per call: in a
burst of a hundred first calls those calls queued at the engine beside the burst's own
work. The same list is the container's cgroup's ``cgroup.procs`` (with any folders
below it), a file read of microseconds, when this process sees the host's ``/proc``
and cgroup file system (the server run on the host, as the hosted deployment runs).

The cgroup of a container is learnt once from its first process (``/proc/<pid>/cgroup``
for the pid the engine reports) and only trusted when its path names the container's
id (the engine names every container's cgroup so, with either cgroup driver): a pid
this process cannot see as the host's (the server in a container of its own) names
another cgroup or none, and the caller falls back to ``docker top``. A sandbox cannot
hide a process from the read: its container's cgroup file system is read-only, so it
can neither leave its cgroup nor make one below it (any folder below is read all the
same, up to ``MAX_FOLDERS``).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

# Folders read below a container's cgroup (it has none of its own making: read-only).
MAX_FOLDERS = 64
# Containers whose cgroup is remembered; the oldest is forgotten past this (and learnt
# again, one ``inspect``, if asked for again).
MAX_REMEMBERED = 4096


class CgroupPids:
    """Learns a container's cgroup folder, then reads its processes from it.

    Args:
        proc: The proc file system (the host's when the server runs on the host).
        cgroup_root: Where the cgroup file systems are mounted.
    """

    def __init__(
        self, proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")
    ) -> None:
        self._proc = proc
        self._root = cgroup_root
        # Container id -> its cgroup folder, or None: tried and not readable this way.
        self._folders: OrderedDict[str, Path | None] = OrderedDict()

    def tried(self, container_id: str) -> bool:
        return container_id in self._folders

    def learn(self, container_id: str, init_pid: int) -> None:
        """Find the container's folder from its first process (``init_pid``, a host pid)."""
        self._folders[container_id] = self._folder_of(container_id, init_pid)
        self._folders.move_to_end(container_id)
        while len(self._folders) > MAX_REMEMBERED:
            self._folders.popitem(last=False)

    def forget(self, container_id: str) -> None:
        self._folders.pop(container_id, None)

    def pids(self, container_id: str) -> list[int] | None:
        """The container's processes, or None: not learnt, not readable this way, or its
        cgroup is gone (the container stopped or was removed: ask the engine)."""
        folder = self._folders.get(container_id)
        if folder is None:
            return None
        try:
            return _procs_below(folder)
        except OSError:
            self._folders.pop(container_id, None)  # gone: learnt again after a restart
            return None

    def _folder_of(self, container_id: str, init_pid: int) -> Path | None:
        try:
            lines = (self._proc / str(init_pid) / "cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            # "0::/path" (cgroup v2, or the unified half of a hybrid host), "N:pids:/path"
            # or "N:cpu,cpuacct:/path" (v1).
            number, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if container_id not in path:
                continue
            relative = path.lstrip("/")
            if number == "0" and controllers == "":
                candidates = [self._root / relative, self._root / "unified" / relative]
            elif "pids" in controllers.split(","):
                candidates = [self._root / "pids" / relative]
            else:
                continue
            for folder in candidates:
                try:
                    if init_pid in _procs_below(folder):
                        return folder
                except OSError:
                    continue
        return None


def _procs_below(folder: Path) -> list[int]:
    """Every pid in ``folder``'s ``cgroup.procs`` and in those of the folders below it."""
    found: list[int] = []
    pending, seen = [folder], 0
    while pending and seen < MAX_FOLDERS:
        current = pending.pop()
        seen += 1
        found.extend(int(p) for p in (current / "cgroup.procs").read_text().split())
        with os.scandir(current) as entries:
            pending.extend(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
    return found
