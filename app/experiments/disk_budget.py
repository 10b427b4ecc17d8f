"""A byte budget per sandbox where the slots have no kernel quota (the dir backend).

Plain folders have no quota, and the server that runs as a non-root user (the
image) can neither loop-mount an image per slot nor set XFS project quotas; so
the budget is kept by accounting, which works wherever the server runs:

- **what counts**: the bytes the slot's tree has allocated on disk (``st_blocks``,
  so a sparse file counts what it really holds and a hard link counts once:
  workspaces, baselines and copies), the files on the slot's filesystem that the
  sandbox's processes hold open or mapped after deleting them (no walk finds them:
  app/experiments/held_files.py) and the sandbox's artifacts on the shelf;
- **when**: after every call that writes (file writes, commands, new
  experiments), and every ``interval_s`` while the sandbox has a running job or a
  live container (a call's measurement begun during an interval's round stands for
  the round's): a command that kills its job's supervisor leaves the rest of its
  tree running under the container's PID 1, outside any job
  (app/runtime/exec/process_tree.py), and it may pause before it writes, so neither a job's
  end nor a measurement without growth is the end of its writing. An idle sandbox
  with live containers costs one walk per interval (about 2 to 9 microseconds an
  entry, each descriptor and mapping of its processes included; bounded by
  ``max_entries``) and a list of each container's processes (read from its cgroup:
  app/runtime/docker/cgroup_pids.py; ``docker top`` where it cannot be), in its own share of the
  tenants' threads; one
  whose containers are gone costs a look at its records. The walk
  (``measure_tree``) is iterative, opens every folder through the jail without
  following a link, and stops at ``max_entries`` (past it the slot counts as
  over: millions of empty files exhaust inodes);
- **over the budget**: calls that write are refused with ``QUOTA_EXCEEDED``
  (destroying an experiment, reading, listing and the slot's reset still work),
  the sandbox's running jobs are cancelled and every process of the sandbox user
  in its containers is killed: once, unless the sandbox still grows afterwards or
  a kill failed (then again at the next interval). The kill comes from outside
  the container (``SandboxBackend.kill_all``: a ``docker exec`` of its own,
  retried, and as the last resort a restart of the container), never through its
  command executor, which the sandbox can stop or kill.

Bytes come only as fast as they are written: the containers of dir slots refuse
the ``fallocate`` modes that reserve blocks at once and cap every file at the
budget (``RLIMIT_FSIZE``; app/runtime/docker/seccomp.py, app/runtime/docker/hardening.py). So it
is a soft bound: a sandbox may write for up to one interval (plus one walk and the
kill) past the budget before it is stopped, at whatever speed the disk allows. A
server anyone can reach therefore still refuses dir slots on the database's
filesystem (app/root/slot_storage.py) unless told otherwise; a hosted deployment that
wants a hard bound uses ZFS slots, which have a kernel quota.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from app.errors import ServiceError
from app.experiments.core.jobs import JobRegistry, stop_job
from app.experiments.core.records import DiskHoldings
from app.experiments.held_files import held_bytes, missing_capabilities
from app.runtime.backend import SandboxBackend
from app.runtime.errors import ContainerGone, RuntimeFailure
from app.tenancy.threads import TenantThreads
from jail import Jail, JailError

log = structlog.get_logger(__name__)

_O_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW

# The calls that can add bytes to a slot; the others are never refused.
# How long a writing call of a sandbox over its budget waits for the deletion of what it
# destroyed (one worker deletes every sandbox's trash, so on a busy server it may lag):
# the agent was told to destroy an experiment and continue.
TRASH_WAIT_S = 30.0

WRITING_TOOLS = frozenset(
    {
        "create_experiment",
        "execute_experiment",
        "run_tests",
        "write_sandbox_file",
        "edit_sandbox_file",
        "collect_artifacts",
    }
)


# Sandboxes checked side by side each interval (check_once): one slow check must not
# put off the others, nor may they all crowd the runtime's engine calls at once.
CHECKS_AT_ONCE = 4


class QuotaExceeded(ServiceError):
    code = "QUOTA_EXCEEDED"


@dataclass(frozen=True)
class DiskUsage:
    bytes: int
    entries: int
    truncated: bool  # stopped at max_entries: counted as over the budget

    def over(self, limit: int) -> bool:
        return self.truncated or self.bytes > limit


def measure_tree(root: Path, max_entries: int) -> DiskUsage:
    """Bytes allocated under ``root`` (blocking; iterative, links never followed).

    Each folder is opened beneath ``root`` through the jail, its last step never a
    link: a folder swapped for a link after it was listed is skipped, never followed
    (out of the slot, or around it). A folder too deep to open by path (``PATH_MAX``)
    counts the slot as over, as past ``max_entries``: its bytes must not hide.
    """
    total = entries = 0
    seen: set[tuple[int, int]] = set()
    try:
        tree = Jail.open(root)
    except JailError:
        return DiskUsage(0, 0, truncated=False)  # gone (the slot was reset meanwhile)
    with tree:
        pending = ["."]
        while pending:
            folder = pending.pop()
            try:
                fd = tree.open_fd(folder, _O_LIST)
            except JailError as exc:
                if exc.code == "INVALID_PATH":
                    return DiskUsage(total, entries, truncated=True)
                continue  # removed, or swapped for a link, since it was listed
            try:
                with os.scandir(fd) as found:
                    for entry in found:
                        entries += 1
                        if entries > max_entries:
                            return DiskUsage(total, entries, truncated=True)
                        try:
                            st = entry.stat(follow_symlinks=False)  # fstatat beneath fd
                        except OSError:
                            continue  # gone meanwhile
                        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                            if (st.st_dev, st.st_ino) in seen:
                                continue
                            seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
                        if stat.S_ISDIR(st.st_mode):
                            pending.append(f"{folder}/{entry.name}")
            except OSError:
                continue  # unreadable or removed: a tenant cannot hide bytes from root this way
            finally:
                os.close(fd)
    return DiskUsage(total, entries, truncated=False)


def measure_slot(
    root: Path, pids_of: Mapping[str, Sequence[int]], max_entries: int
) -> tuple[DiskUsage, int]:
    """The slot's tree and the unlinked files its containers' processes hold on its
    filesystem (blocking), and how many of those processes could not be looked into;
    ``max_entries`` bounds the tree's entries and the descriptors together."""
    tree = measure_tree(root, max_entries)
    if tree.truncated or not pids_of:
        return tree, 0
    try:
        device = os.stat(root).st_dev
    except OSError:
        return tree, 0  # gone (the slot was reset meanwhile)
    held = held_bytes(pids_of, device, max_entries - tree.entries)
    usage = DiskUsage(tree.bytes + held.bytes, tree.entries + held.entries, held.truncated)
    return usage, held.unreadable


HoldingsOf = Callable[[str], Awaitable[DiskHoldings]]


class DiskBudget:
    """Measures and enforces the budget; see the module docstring."""

    def __init__(
        self,
        *,
        slot_root_of: Callable[[str], Path | None],
        holdings_of: HoldingsOf,
        jobs: JobRegistry,
        backend: SandboxBackend,
        limit_bytes: int,
        max_entries: int,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        threads: TenantThreads | None = None,
        trash_settled: Callable[[Path, float], Awaitable[bool]] | None = None,
    ) -> None:
        self._slot_root_of = slot_root_of
        # Waits for the deletions of what the sandbox destroyed (Trash.settled).
        self._trash_settled = trash_settled
        # A measurement walks the sandbox's tree: in the tenants' threads, but never
        # behind the sandbox's own calls (its flood must not put off its check).
        self._threads = threads or TenantThreads()
        # Its live containers and artifacts' bytes: one read of the records (a burst
        # of first calls measures each sandbox two or three times, and waits on every
        # round trip to the database).
        self._holdings_of = holdings_of
        self._jobs = jobs
        self._backend = backend
        self.limit_bytes = limit_bytes
        self._max_entries = max_entries
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, tuple[float, DiskUsage]] = {}
        # When each sandbox's last measurement began: one begun after an interval's
        # round began stands for the round's (check_once).
        self._measured_from: dict[str, float] = {}
        self._measuring: dict[str, asyncio.Task[DiskUsage]] = {}
        self._watched: set[str] = set()  # wrote since their slot was leased
        self._background: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        # Stopped, not yet back under the budget: the bytes each held when it was.
        self._over: dict[str, int] = {}
        self._told_unreadable = False

    # -- around a call -----------------------------------------------------------

    async def before(self, tool: str, sandbox_key: str) -> None:
        """Refuse a writing call while the sandbox is over its budget.

        Raises:
            QuotaExceeded: the last measurement (a fresh one when it is older than
                one interval) is over the budget.
        """
        if tool not in WRITING_TOOLS or self._slot_root_of(sandbox_key) is None:
            return
        last = self._last.get(sandbox_key)
        # An over-budget sandbox is measured again: it may just have destroyed an experiment.
        if last is None or self._stale(last[0]) or last[1].over(self.limit_bytes):
            usage = await self.measure(sandbox_key)
        else:
            usage = last[1]
        if (
            usage is not None
            and usage.over(self.limit_bytes)
            and await self._trash_was_due(sandbox_key)
        ):
            # What it destroyed to free space was still being deleted: measured again once
            # it is gone, by a walk that starts now (not one begun while it was there).
            usage = await self._measure_now(sandbox_key)
        if usage is not None and usage.over(self.limit_bytes):
            raise self._refusal(usage)

    async def _trash_was_due(self, sandbox_key: str) -> bool:
        root = self._slot_root_of(sandbox_key)
        if root is None or self._trash_settled is None:
            return False
        return await self._trash_settled(root, TRASH_WAIT_S)

    async def _measure_now(self, sandbox_key: str) -> DiskUsage | None:
        root = self._slot_root_of(sandbox_key)
        return None if root is None else await self._measure(sandbox_key, root)

    def after(self, tool: str, sandbox_key: str) -> None:
        """Measure the slot once the call is answered (the answer does not wait)."""
        if tool not in WRITING_TOOLS or self._slot_root_of(sandbox_key) is None:
            return
        self._watched.add(sandbox_key)
        # What was measured before this call is out of date: the next writing call waits
        # for this measurement (or makes its own), never admits itself on the old one.
        self._last.pop(sandbox_key, None)
        task = asyncio.create_task(self._follow_from(sandbox_key), name="disk-budget")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- measuring -----------------------------------------------------------------

    def _stale(self, at: float) -> bool:
        return self._clock() - at >= self._interval_s

    async def measure(
        self, sandbox_key: str, holdings: DiskHoldings | None = None
    ) -> DiskUsage | None:
        """The sandbox's usage now; one walk at a time per sandbox (callers share it).
        ``holdings``: its containers and artifacts, if just read."""
        running = self._measuring.get(sandbox_key)
        if running is not None:
            return await asyncio.shield(running)
        root = self._slot_root_of(sandbox_key)
        if root is None:
            self._forget(sandbox_key)
            return None
        task = asyncio.create_task(self._measure(sandbox_key, root, holdings))
        task.add_done_callback(_read_unwaited_error)
        self._measuring[sandbox_key] = task
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._measuring.pop(sandbox_key, None)

    async def _measure(
        self, sandbox_key: str, root: Path, holdings: DiskHoldings | None = None
    ) -> DiskUsage:
        self._measured_from[sandbox_key] = self._clock()
        try:
            if holdings is None:
                holdings = await self._holdings_of(sandbox_key)
            pids_of = await self._host_pids(holdings.containers)
            tree, unreadable = await self._threads.run_server_work(
                measure_slot, root, pids_of, self._max_entries
            )
            if unreadable and not self._told_unreadable:
                self._told_unreadable = True  # once: a namespace or a capability, not a tenant
                log.warning("disk.held_files_unreadable", sandbox=sandbox_key, processes=unreadable)
            usage = DiskUsage(tree.bytes + holdings.artifact_bytes, tree.entries, tree.truncated)
            self._last[sandbox_key] = (self._clock(), usage)
            if not usage.over(self.limit_bytes):
                self._over.pop(sandbox_key, None)  # back under (an experiment destroyed)
            return usage
        finally:
            self._measuring.pop(sandbox_key, None)

    async def _host_pids(self, containers: Iterable[str]) -> dict[str, list[int]]:
        """The host pids of each of the sandbox's live containers (gone ones left out)."""
        found = {}
        for container_id in containers:
            try:
                found[container_id] = await self._backend.host_pids(container_id)
            except ContainerGone:
                continue  # stopped or removed: its processes hold nothing
            except RuntimeFailure as exc:
                log.warning("disk.host_pids_failed", container_id=container_id[:12], error=str(exc))
        return found

    async def enforce(
        self, sandbox_key: str, holdings: DiskHoldings | None = None
    ) -> DiskUsage | None:
        """Measure, and stop the sandbox's work if it is over; the usage measured."""
        try:
            usage = await self.measure(sandbox_key, holdings)
            if usage is None or not usage.over(self.limit_bytes):
                return usage
            stopped_at = self._over.get(sandbox_key)
            # Once per episode (its writing calls are refused until it is back under),
            # unless it grew since: then something of it still runs. A failed stop is
            # not recorded, so the next measurement tries again.
            owed = stopped_at is None or usage.bytes > stopped_at
            if owed and await self._stop(sandbox_key, usage):
                self._over[sandbox_key] = usage.bytes
            return usage
        except Exception:
            log.exception("disk.budget_check_failed")
            return None

    async def _stop(self, sandbox_key: str, usage: DiskUsage) -> bool:
        """Cancel the sandbox's jobs and kill its processes; False if a kill failed."""
        jobs = [job for job in self._jobs.running() if job.sandbox_key == sandbox_key]
        for job in jobs:
            await stop_job(self._backend, job)
        containers = (await self._holdings_of(sandbox_key)).containers
        failed = 0
        for container_id in containers:
            # From outside the container (its own docker exec, retried, then a restart),
            # never through its executor: the tenant can stop that, and the kill kills
            # it too (app/runtime/_kill.py).
            try:
                await self._backend.kill_all(container_id)
            except ContainerGone:
                continue  # its processes went with it
            except Exception as exc:
                failed += 1
                log.warning("disk.kill_failed", container_id=container_id[:12], error=str(exc))
        log.warning(
            "disk.budget_exceeded",
            used_bytes=usage.bytes,
            entries=usage.entries,
            limit_bytes=self.limit_bytes,
            jobs_cancelled=len(jobs),
            containers=len(containers),
            kills_failed=failed,
        )
        return failed == 0

    def _refusal(self, usage: DiskUsage) -> QuotaExceeded:
        limit_mb = self.limit_bytes // 1_048_576
        if usage.truncated and usage.entries > self._max_entries:
            what = f"more than {self._max_entries} files, folders and open files"
        elif usage.truncated:  # stopped at a folder it could not reach (measure_tree)
            what = "folders nested too deep to measure (paths past 4095 bytes)"
        else:
            what = f"{usage.bytes // 1_048_576} MB"
        return QuotaExceeded(
            f"Your sandbox holds {what}, over its budget of {limit_mb} MB and "
            f"{self._max_entries} entries (workspaces, copies and artifacts together); "
            "running commands were stopped. Destroy an experiment (destroy_experiment) to "
            "free space, then continue.",
            used_bytes=usage.bytes,
            limit_bytes=self.limit_bytes,
            entries=usage.entries,
        )

    def _forget(self, sandbox_key: str) -> None:
        self._last.pop(sandbox_key, None)
        self._measured_from.pop(sandbox_key, None)
        self._over.pop(sandbox_key, None)
        self._watched.discard(sandbox_key)

    # -- after a call, and while its processes may write ------------------------------

    async def _follow_from(self, sandbox_key: str) -> None:
        """Enforce after a writing call (it may have started what writes on)."""
        await self.enforce(sandbox_key)

    def start(self) -> None:
        missing = missing_capabilities()
        if missing:  # once: every measurement would miss them alike
            log.warning(
                "disk.held_files_unseen",
                missing=missing,
                detail="files the sandboxes delete while holding them open are not counted",
            )
        self._loop = asyncio.create_task(self.run(), name="disk-budget-watch")

    async def run(self) -> None:
        """Check the watched sandboxes each interval, until cancelled."""
        while True:
            await asyncio.sleep(self._interval_s)
            await self.check_once()

    async def check_once(self) -> None:
        """One interval's checks: every sandbox written to since its lease that may
        still write, that is with a running job or a live container (a process that
        left its job writes on under the container's PID 1, and may pause first: see
        the module docstring). The others cost nothing but a look at their records.

        The sandboxes are checked side by side, not one after another: each check
        waits for a walk, a list of processes per container and perhaps a kill, which
        under load take long enough that, summed over every sandbox with a live
        container, a writer was measured only once its 256 MB were written (the
        fairness bench). At most ``CHECKS_AT_ONCE`` at a time: their engine calls (an
        ``inspect`` per container once, ``docker top`` where no cgroup can be read)
        share the runtime's pool of engine calls with every tenant's."""
        began = self._clock()
        at_once = asyncio.Semaphore(CHECKS_AT_ONCE)
        await asyncio.gather(*(self._check(key, at_once, began) for key in list(self._watched)))

    async def _check(self, key: str, at_once: asyncio.Semaphore, began: float) -> None:
        async with at_once:
            await self._check_one(key, began)

    async def _check_one(self, key: str, began: float = float("-inf")) -> None:
        """Measure ``key`` if it may still write, unless a measurement begun after this
        round began (its call's, while the round waited its turn among the others)
        already stands for this one: under a burst a round of a hundred sandboxes takes
        longer than an interval, and every one of them is measured after each call."""
        try:
            if self._slot_root_of(key) is None:
                self._forget(key)  # emptied: its next lease starts at zero
                return
            if self._measured_from.get(key, float("-inf")) > began:
                return
            holdings = None if self._jobs.is_busy(key) else await self._holdings_of(key)
            if holdings is None or holdings.containers:
                await self.enforce(key, holdings)  # what was just read, not read again
        except Exception:  # one sandbox's failure must not end the checks of all
            log.exception("disk.budget_check_failed")

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
        for waiting in list(self._background):
            waiting.cancel()
        for walk in list(self._measuring.values()):
            walk.cancel()


def _read_unwaited_error(task: asyncio.Task[DiskUsage]) -> None:
    """A measurement goes on when its callers leave (it is shielded: the next caller
    shares it). Its error, when every caller has left (a call cancelled, the server
    stopping and its database cut off mid-read), is read here and logged, not reported
    by asyncio as never retrieved; a caller still waiting gets it as before."""
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.info("disk.measure_failed", error=type(error).__name__)
