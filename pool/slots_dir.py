"""Folder slot storage, the embedded default: ``<state_dir>/slots/slot-NNN``.

A slot is emptied by renaming its folder into ``<state_dir>/slots/.trash/``
(same filesystem, so the rename is one atomic syscall whatever the tree holds)
and creating a fresh empty 0700 folder in its place at once; the old tree is
deleted afterwards by a background thread. Trash left behind by a crash is
swept when the store opens.

No quota: a slot can fill the filesystem holding the state dir. Use the ZFS
backend where tenants are not trusted with disk space.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import structlog

from jail.privilege import can_chown
from jail.tree_delete import DeleteStopped, delete_tree
from pool.errors import PoolError, PoolErrorCode
from pool.slots import Slot, name_of
from pool.spread import spread_subfolders

logger = structlog.get_logger(__name__)

T = TypeVar("T")
SLOT_MODE = 0o700
TRASH = ".trash"


def slots_dir_of(state_dir: Path) -> Path:
    return state_dir / "slots"


async def _in_thread(fn: Callable[[], T]) -> T:
    """The one way this backend runs blocking filesystem calls off the event loop."""
    return await asyncio.to_thread(fn)


class DirSlotStore:
    """Slots as plain folders; see the module docstring. Call :meth:`open` before use."""

    def __init__(self, state_dir: Path, *, close_timeout: float = 30.0) -> None:
        self.slots_dir = slots_dir_of(state_dir)
        self.trash = self.slots_dir / TRASH
        self._close_timeout = close_timeout
        # One worker: deletions are disk-bound, and serving calls matters more.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="slot-trash"
        )
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._stop = threading.Event()
        self._closed = False

    @property
    def base(self) -> Path:
        return self.slots_dir

    async def open(self) -> None:
        """Start deleting trash left by an earlier run."""
        leftovers = await _in_thread(self._leftovers)
        for path in leftovers:
            self._discard(path)
        if leftovers:
            logger.info("slot.trash_sweep", count=len(leftovers))

    def _leftovers(self) -> list[Path]:
        try:
            return sorted(self.trash.iterdir())
        except FileNotFoundError:
            return []  # nothing reset yet, or not provisioned (missing() will say so)
        except OSError as exc:
            # Not fatal here: missing() reports a trash we cannot write to.
            logger.warning("slot.trash_unreadable", path=str(self.trash), error=exc.strerror)
            return []

    def slot(self, index: int) -> Slot:
        name = name_of(index)
        return Slot(index=index, name=name, root=self.slots_dir / name)

    async def missing(self, size: int) -> list[str]:
        slots = [self.slot(i) for i in range(size)]
        problems = await _in_thread(lambda: [(s, self._problem(s)) for s in slots])
        bad: list[str] = []
        for slot, reason in problems:
            if reason is not None:
                logger.warning("slot.unusable", slot=slot.name, reason=reason)
                bad.append(slot.name)
        return bad

    async def reset(self, slot: Slot) -> None:
        if self._closed:
            raise PoolError(
                "SLOT_STORE_CLOSED", "The slot store is shut down; no slot can be reset."
            )
        started = time.perf_counter()
        try:
            aside = await _in_thread(lambda: self._swap(slot))
        except OSError as exc:
            code: PoolErrorCode = (
                "SLOT_MISSING" if isinstance(exc, FileNotFoundError) else "SLOT_RESET_FAILED"
            )
            raise PoolError(
                code,
                f"Slot {slot.name} could not be emptied ({exc.strerror}); check {self.slots_dir} "
                "and run `sandbox-mcp provision` to repair it.",
                {"slot": slot.name, "errno": exc.errno, "path": str(exc.filename)},
            ) from exc
        if aside is not None:
            self._discard(aside)
        ms = round((time.perf_counter() - started) * 1000, 1)
        logger.info("slot.reset", backend="dir", slot=slot.name, ms=ms)

    def _swap(self, slot: Slot) -> Path | None:
        """Move the slot's tree aside and put an empty folder in its place."""
        try:
            old = os.lstat(slot.root)
        except FileNotFoundError:
            old = None
        aside = None
        if old is not None:
            self.trash.mkdir(mode=SLOT_MODE, exist_ok=True)
            aside = self.trash / f"{slot.name}.{time.time_ns()}.{secrets.token_hex(3)}"
            os.rename(slot.root, aside)
        os.mkdir(slot.root, SLOT_MODE)
        os.chmod(slot.root, SLOT_MODE)  # mkdir's mode is filtered by the umask
        spread_subfolders(slot.root)  # each experiment in its own ext4 block group
        if old is not None and stat.S_ISDIR(old.st_mode) and can_chown():
            os.chown(slot.root, old.st_uid, old.st_gid)  # keep provisioning's --owner
        return aside

    def _discard(self, path: Path) -> None:
        future = self._executor.submit(_delete, path, self._stop)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    async def close(self) -> None:
        self._closed = True
        pending = list(self._pending)
        if pending:
            _, not_done = await _in_thread(
                lambda: concurrent.futures.wait(pending, timeout=self._close_timeout)
            )
            if not_done:
                # Stop between entries; what is left is swept at the next open().
                self._stop.set()
                logger.warning("slot.trash_abandoned", count=len(not_done))
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _problem(self, slot: Slot) -> str | None:
        # reset() renames inside these two folders, so it needs write access there too.
        for folder in (self.slots_dir, self.trash):
            if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):
                return f"{folder} is not writable by this process"
        return _root_problem(slot.root)


def _root_problem(root: Path) -> str | None:
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return f"folder {root} does not exist"
    if stat.S_ISLNK(st.st_mode):
        return f"{root} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{root} is not a folder"
    if not os.access(root, os.W_OK | os.X_OK):
        return f"{root} is not writable by this process"
    return None


def _delete(path: Path, stop: threading.Event) -> None:
    """Delete a trashed tree (worker thread); a shutdown can interrupt it.

    Never raises: this runs on the executor, where an exception would only be
    kept in a future nobody reads. Whatever is left is swept at the next open().
    """
    started = time.perf_counter()
    try:
        # Iterative and link-safe: a tenant's tree may be deeper than any recursion limit.
        delete_tree(path, stop=stop)
    except DeleteStopped:
        return
    except Exception:
        logger.exception("slot.trash_delete_failed", path=str(path))
        return
    ms = round((time.perf_counter() - started) * 1000, 1)
    logger.info("slot.trash_deleted", path=path.name, ms=ms)
