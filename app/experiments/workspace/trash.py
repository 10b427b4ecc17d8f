"""Experiment folders deleted after the caller has its answer.

``destroy_experiment`` answers once the experiment's folder is renamed aside, into
its slot's trash (``<slot root>/.trash/``: the same filesystem, so the rename is one
syscall whatever the tree holds, and on ZFS the same dataset, whose quota keeps
counting it until it is gone). A worker thread deletes it afterwards with the
jail's link-safe walk, once the container that mounted it is gone (its removal
goes on after the answer too: app/experiments/removals.py). A crash or a restart
mid-way leaves the tree in the trash, which :meth:`Trash.sweep` empties at
start-up (in the background: /health answers meanwhile).

Nothing of a tenant's is followed: the rename moves a folder the server made, by
its name in a slot root no container can see, and the deletion never follows a
link (:mod:`jail.tree_delete`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from jail.tree_delete import DeleteStopped, delete_tree

log = structlog.get_logger(__name__)

TRASH = ".trash"

Deleter = Callable[[Path, threading.Event], None]


def _delete(path: Path, stop: threading.Event) -> None:
    delete_tree(path, stop=stop)


class Trash:
    """Moves experiment folders aside and deletes them on one worker thread.

    Args:
        delete: Deletes one tree (the jail's walk; a test may hold it back).
        close_timeout_s: How long :meth:`close` waits for deletions in progress;
            what is left then is swept at the next start.
    """

    def __init__(self, *, delete: Deleter = _delete, close_timeout_s: float = 10.0) -> None:
        self._delete = delete
        self._close_timeout_s = close_timeout_s
        # One worker: deletions are disk-bound, and serving calls matters more.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="experiment-trash"
        )
        self._pending: set[concurrent.futures.Future[None]] = set()
        # Deletions not yet done, by the slot whose trash holds them (for ``settled``).
        self._pending_in: dict[Path, set[concurrent.futures.Future[None]]] = {}
        self._stop = threading.Event()

    async def discard(self, root: Path, after: asyncio.Future[bool] | None = None) -> Path | None:
        """Move ``root`` (an experiment's folder) aside and delete it in the background;
        where it is now (None: there was nothing). Deleted where it is if it cannot be
        moved.

        ``after``: the end of the experiment's teardown (app/experiments/removals.py:
        its container's removal, then the measure of its changes on the folder
        returned here). The deletion waits for it, since a live container could still
        write into the tree, and is left to the next start's sweep if the container
        may still be there (False); the folder counts as pending in its slot
        (``settled``) from now on.
        """
        try:
            aside = await asyncio.to_thread(_move_aside, root)
        except OSError as exc:
            log.warning("trash.move_failed", path=str(root), error=exc.strerror)
            aside = root
        if aside is None:
            return None
        if after is None:
            self._submit(aside, root.parent)
            return aside
        waiting: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._track(waiting, root.parent)

        def go(teardown: asyncio.Future[bool]) -> None:
            # On the event loop, once the teardown has ended.
            if not _removed(teardown) or self._stop.is_set():
                waiting.set_result(None)  # left for the next start's sweep
                return
            try:
                deletion = self._executor.submit(self._run, aside)
            except RuntimeError:  # closed meanwhile: the same
                waiting.set_result(None)
                return
            deletion.add_done_callback(lambda _: waiting.set_result(None))

        after.add_done_callback(go)
        return aside

    def sweep(self, slot_roots: Iterable[Path]) -> None:
        """Delete, in the background, what an earlier run left in the slots' trash."""
        roots = list(slot_roots)
        future = self._executor.submit(self._sweep, roots)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    async def settled(self, slot_root: Path, timeout_s: float) -> bool:
        """Wait, at most ``timeout_s``, until what was destroyed in ``slot_root`` is deleted;
        whether there was anything to wait for. A sandbox over its disk budget that
        destroyed an experiment to free space is then measured without it (the trash is
        on the slot's disk, and counted there until it is gone)."""
        pending = [f for f in self._pending_in.get(slot_root, ()) if not f.done()]
        if not pending:
            return False
        await asyncio.wait([asyncio.wrap_future(f) for f in pending], timeout=timeout_s)
        return True

    async def idle(self) -> None:
        """Wait until every deletion submitted so far is done (tests, benches)."""
        while self._pending:
            await asyncio.to_thread(concurrent.futures.wait, list(self._pending))

    async def close(self) -> None:
        pending = list(self._pending)
        if pending:
            _, not_done = await asyncio.to_thread(
                concurrent.futures.wait, pending, self._close_timeout_s
            )
            if not_done:
                self._stop.set()  # stop between folders; the next start sweeps the rest
                log.warning("trash.abandoned", count=len(not_done))
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _submit(self, path: Path, slot_root: Path) -> None:
        future = self._executor.submit(self._run, path)
        self._track(future, slot_root)

    def _track(self, future: concurrent.futures.Future[None], slot_root: Path) -> None:
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        in_slot = self._pending_in.setdefault(slot_root, set())
        in_slot.add(future)
        future.add_done_callback(lambda done: self._forget(slot_root, done))

    def _forget(self, slot_root: Path, future: concurrent.futures.Future[None]) -> None:
        # A done callback runs on the worker thread: dict and set operations are atomic
        # under the GIL, and ``settled`` copies what it reads.
        in_slot = self._pending_in.get(slot_root)
        if in_slot is not None:
            in_slot.discard(future)
            if not in_slot:
                self._pending_in.pop(slot_root, None)

    def _sweep(self, roots: list[Path]) -> None:
        found = 0
        for root in roots:
            if self._stop.is_set():
                return
            try:
                leftovers = sorted((root / TRASH).iterdir())
            except OSError:
                continue  # no trash (nothing destroyed there), or a slot being reset
            for path in leftovers:
                found += 1
                self._run(path)
        if found:
            log.info("trash.swept", count=found)

    def _run(self, path: Path) -> None:
        """Delete one tree (worker thread). Never raises: what is left is swept later."""
        started = time.perf_counter()
        try:
            self._delete(path, self._stop)
        except DeleteStopped:
            return
        except Exception:
            log.exception("trash.delete_failed", path=str(path))
            return
        log.info("trash.deleted", path=path.name, ms=round((time.perf_counter() - started) * 1000))


def _removed(removal: asyncio.Future[bool]) -> bool:
    return not removal.cancelled() and removal.exception() is None and removal.result()


def _move_aside(root: Path) -> Path | None:
    """Rename ``root`` into its slot's trash; None when it does not exist."""
    trash = root.parent / TRASH
    with contextlib.suppress(FileExistsError):
        os.mkdir(trash, 0o700)
    aside = trash / f"{root.name}.{time.time_ns()}.{secrets.token_hex(3)}"
    try:
        os.rename(root, aside)
    except FileNotFoundError:
        return None
    return aside
