"""One server process per SQLite state dir: an exclusive lock held while it serves.

Two processes on one SQLite state dir each believe they are the only one: the second
one's start-up recovery marks the first one's running jobs ``lost`` and sweeps its
containers. So a process that serves a state dir whose database is SQLite holds an
exclusive ``flock`` on ``server.lock`` there; a second one is refused with what to
do. On PostgreSQL nothing is locked here: several processes share that database.

The lock belongs to an open file, which the kernel releases when the process ends,
however it ends (kill -9 included): a stale lock file never blocks a restart. The
descriptor is not inherited by child processes (PEP 446), so a child that outlives
the server cannot keep the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from app.errors import ServiceError
from app.settings import StorageSettings

LOCK_FILE = "server.lock"

# Per lock file: its descriptor and how many holders in this process share it (the
# CLI holds it for the process's life; the service's start and stop take and drop it).
_held: dict[Path, tuple[int, int]] = {}


class StateDirInUse(ServiceError):
    code = "STATE_DIR_IN_USE"


def needs_lock(storage: StorageSettings) -> bool:
    return storage.effective_database_url.startswith("sqlite")


def hold_state_dir(storage: StorageSettings) -> None:
    """Take the state dir's lock (a no-op on PostgreSQL, or if this process holds it).

    Raises:
        StateDirInUse: another process serves this state dir.
    """
    if not needs_lock(storage):
        return
    path = (storage.state_dir / LOCK_FILE).resolve()
    if path in _held:
        fd, count = _held[path]
        _held[path] = (fd, count + 1)
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise StateDirInUse(
            f"Another sandbox-mcp process{holder} already serves the state dir "
            f"{storage.state_dir} (its database is SQLite, which one process serves); "
            "stop that one first, or give this one its own SANDBOX_MCP_STATE_DIR "
            "(several processes need PostgreSQL: SANDBOX_MCP_DATABASE_URL)."
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[path] = (fd, 1)


def release_state_dir(storage: StorageSettings) -> None:
    """Drop one hold taken by ``hold_state_dir``; the last one unlocks."""
    if not needs_lock(storage):
        return
    path = (storage.state_dir / LOCK_FILE).resolve()
    if path not in _held:
        return
    fd, count = _held.pop(path)
    if count > 1:
        _held[path] = (fd, count - 1)
        return
    os.close(fd)  # closing the only descriptor releases the flock


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip())
        return f" (pid {pid})"
    return ""
