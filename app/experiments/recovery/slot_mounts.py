"""Live experiments' workspaces after their slot's storage went away under them (ZFS).

A ZFS slot is a dataset mounted at the slot's root. When zfs-fuse restarts, or a
dataset is unmounted behind the server's back, the root is left stale (ENOTCONN)
or a plain empty folder of the parent dataset: a tool reading it would find an
empty workspace, and a container started on it would write outside the slot's
quota. Each recovery round checks the slots holding live experiments and, for one
whose dataset is not mounted there:

1. stops its experiments' containers: their bind mounts keep the dataset busy, and
   zfs-fuse refuses to mount it again while they do (measured);
2. lazily unmounts a stale mount, mounts the dataset again (``zfs mount``) and
   seals it ``nosuid,nodev`` again (``pool.mount_flags``: a new mount has no flags);
3. leaves the revive step of the same round to start the same containers again
   (until then it cannot: a workspace lies below its slot's root, so its bind
   source is missing while the dataset is away, and the engine refuses it),
   hardened as before, on the workspace as the dataset kept it (what their
   commands were doing when they stopped is lost).

A slot mounted again outside the server (zfs-fuse restarted and its pool imported
by the operator) is mounted but unsealed, and running containers' bind mounts still
point at the old, dead mount: a root server takes a mount without ``nosuid,nodev``
for such a one, stops its containers, seals it, and the revive step starts them.

While ZFS itself is away (zfs-fuse restarting) it tries again every round; when the
dataset cannot be mounted again, or ZFS stays away past ``GIVE_UP_S``, its
experiments fail with a reason saying so, rather than run on an empty folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from app.errors import ServiceError
from app.experiments.core.errors import InvalidTransition
from app.experiments.core.states import State
from app.experiments.core.store import ExperimentStore
from app.runtime.backend import SandboxBackend
from pool import slots_zfs
from pool.errors import PoolError
from pool.mount_flags import missing_flags, seal
from pool.slots import Slot

log = structlog.get_logger(__name__)

# What passes: the daemon restarting, or answering before it is ready.
TRANSIENT = frozenset({"ZFS_UNAVAILABLE", "ZFS_COMMAND_FAILED", "ZFS_DATASET_BUSY"})
GIVE_UP_S = 300.0  # then an operator's matter: the experiments fail with a reason
LOST_STORAGE = (
    "its slot's storage (ZFS dataset {dataset}) went away and could not be mounted "
    "again ({reason}); its files are kept in the dataset. Create a new experiment."
)


class WorkspaceUnavailable(ServiceError):
    """The workspace's storage is away (being mounted again): never shown as empty."""

    code = "WORKSPACE_UNAVAILABLE"

    def __init__(self) -> None:
        super().__init__(
            "This experiment's workspace storage is not reachable right now (it is being "
            "mounted again); its files are kept. Retry in a few seconds, or see "
            "get_experiment if it stays so."
        )


async def check_workspace(workspace: Path) -> Path:
    """``workspace`` if it is there; WorkspaceUnavailable if its slot's storage went
    away (an unmounted dataset leaves an empty folder in its place, never the files)."""
    if not await asyncio.to_thread(os.path.isdir, workspace):
        raise WorkspaceUnavailable()
    return workspace


def mount_problem(root: Path) -> str | None:
    """Why ``root`` is not the mount of its own dataset, or None if it is (blocking)."""
    try:
        here, parent = os.stat(root), os.stat(root.parent)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            return "stale"  # the FUSE daemon that served it is gone (zfs-fuse restarted)
        return f"unreadable ({exc.strerror})"
    return "not mounted" if here.st_dev == parent.st_dev else None


class SlotMounts:
    def __init__(
        self,
        records: ExperimentStore,
        backend: SandboxBackend,
        dataset_of: Callable[[Slot], str],
        slot_of: Callable[[str], Awaitable[Slot | None]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self._backend = backend
        self._dataset_of = dataset_of
        self._slot_of = slot_of
        self._clock = clock
        self._away: dict[Path, float] = {}  # slot root -> when its storage went away
        self._retrying: set[Path] = set()
        self._failed: set[Path] = set()

    async def repair(self) -> int:
        """One round: remount the slots of live experiments whose dataset is gone; how
        many were mounted again."""
        by_slot: dict[Path, tuple[Slot, list[tuple[str, str | None]]]] = {}
        for experiment in await self._records.live():
            slot = await self._slot_of(experiment.sandbox_key)
            if slot is not None:
                entry = by_slot.setdefault(slot.root, (slot, []))
                entry[1].append((experiment.experiment_id, experiment.container_id))
        remounted = 0
        for slot, experiments in by_slot.values():
            problem = await asyncio.to_thread(mount_problem, slot.root)
            dataset = self._dataset_of(slot)
            if problem is None:
                if await self._renewed(slot.root):
                    # Mounted again outside the server (zfs-fuse restarted, its pool
                    # imported): unsealed, and the containers' binds hold the old mount.
                    try:
                        await asyncio.to_thread(seal, slot.root)
                    except PoolError as exc:
                        log.error("slot.seal_failed", slot=slot.name, reason=exc.message)
                        continue
                    log.warning("slot.mount_renewed", slot=slot.name, dataset=dataset)
                    await self._stop(experiments)
                    remounted += 1
                continue
            if slot.root not in self._away:
                log.warning("slot.mount_lost", slot=slot.name, dataset=dataset, problem=problem)
                await self._stop(experiments)  # their bind mounts keep the dataset busy
                self._away[slot.root] = self._clock()
            try:
                if problem == "stale":
                    await asyncio.to_thread(_lazy_unmount, slot.root)
                await self._remount(slot, dataset)
            except PoolError as exc:
                await self._not_yet(slot, dataset, experiments, exc)
                continue
            self._away.pop(slot.root, None)
            self._retrying.discard(slot.root)
            self._failed.discard(slot.root)
            log.warning("slot.remounted", slot=slot.name, dataset=dataset)
            remounted += 1
        return remounted

    async def _not_yet(
        self, slot: Slot, dataset: str, experiments: list[tuple[str, str | None]], exc: PoolError
    ) -> None:
        """ZFS away (zfs-fuse restarting) is tried again every round for a while; a
        dataset that cannot be mounted, or an outage past ``GIVE_UP_S``, fails them."""
        waited = self._clock() - self._away[slot.root]
        if exc.code in TRANSIENT and waited < GIVE_UP_S:
            if slot.root not in self._retrying:
                self._retrying.add(slot.root)
                log.warning("slot.remount_retrying", slot=slot.name, reason=exc.message)
            return
        if slot.root in self._failed:
            return  # said once; tried again every round all the same
        self._failed.add(slot.root)
        log.error("slot.remount_failed", slot=slot.name, dataset=dataset, reason=exc.message)
        for experiment_id, _ in experiments:
            with contextlib.suppress(InvalidTransition):
                await self._records.transition(
                    experiment_id,
                    State.FAILED,
                    LOST_STORAGE.format(dataset=dataset, reason=exc.message),
                    self._clock(),
                )

    async def _renewed(self, root: Path) -> bool:
        """A mount without nosuid,nodev: not the one provisioning (or this) sealed."""
        return os.geteuid() == 0 and bool(await asyncio.to_thread(missing_flags, root))

    async def _stop(self, experiments: list[tuple[str, str | None]]) -> None:
        for _, container_id in experiments:
            if container_id:
                with contextlib.suppress(ServiceError):
                    await self._backend.stop(container_id)  # revive starts it again

    async def _remount(self, slot: Slot, dataset: str) -> None:
        # Top down: a dataset mounts only where its parent is (a mount over a folder
        # holding the child's mountpoint would be refused as not empty). After a
        # zfs-fuse restart every one of them is stale or unmounted.
        parts = dataset.split("/")
        for depth in range(1, len(parts) + 1):
            name = "/".join(parts[:depth])
            mountpoint, mounted = await slots_zfs.mount_state(name)
            if mounted or not mountpoint.startswith("/"):
                continue
            if await asyncio.to_thread(mount_problem, Path(mountpoint)) == "stale":
                await asyncio.to_thread(_lazy_unmount, Path(mountpoint))
            await slots_zfs.mount(name)
            log.info("slot.dataset_mounted", dataset=name)
        problem = await asyncio.to_thread(mount_problem, slot.root)
        if problem is not None:
            raise PoolError("SLOT_MISSING", f"{slot.root} is still {problem}", {})
        if os.geteuid() == 0:
            await asyncio.to_thread(seal, slot.root)  # a new mount has no nosuid,nodev


def _lazy_unmount(root: Path) -> None:
    subprocess.run(  # noqa: S603 - fixed program, our own path
        ["umount", "-l", str(root)],  # noqa: S607 - util-linux's, on PATH like zfs
        capture_output=True,
        timeout=30,
        check=False,
    )
