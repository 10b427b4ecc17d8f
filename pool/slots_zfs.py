"""ZFS slot storage: one dataset per slot, emptied by rolling back to ``@empty``.

Layout (made by ``pool.provision.provision_zfs``)::

    <parent>/slot-000 ... slot-NNN   quota, setuid=off, devices=off, exec=on
    <parent>/slot-NNN@empty          taken right after creation (root 0700)

``zfs rollback -r <ds>@empty`` discards whatever the agent left in constant
time (5,000 files: ~0.2-0.4 s on zfs-fuse, milliseconds on kernel ZFS), and
works while a container still has the dataset bind-mounted. Files held open
across a rollback return EIO afterwards, which is what we want.
"""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath

import structlog

from pool import _zfs
from pool.errors import PoolError
from pool.slots import Slot, name_of

logger = structlog.get_logger(__name__)

SNAPSHOT = "empty"


def parent_root(parent: str, mountpoint: str) -> Path:
    """Validate the parent's ``mountpoint`` property and return it as a path.

    Raises:
        PoolError: ``ZFS_BAD_MOUNTPOINT`` for ``none``/``legacy``/relative values,
            since slot roots are derived from it.
    """
    if not PurePosixPath(mountpoint).is_absolute():
        raise PoolError(
            "ZFS_BAD_MOUNTPOINT",
            f"ZFS dataset {parent} has mountpoint {mountpoint!r}; give it an absolute "
            "mountpoint so slot datasets inherit <mountpoint>/slot-NNN.",
            {"dataset": parent, "mountpoint": mountpoint},
        )
    return Path(mountpoint)


class ZfsSlotStore:
    """Slots as ZFS datasets under ``parent``; see the module docstring.

    :meth:`open` reads the parent's mountpoint once, so that :meth:`slot`
    needs no I/O.
    """

    def __init__(self, parent: str) -> None:
        self.parent = parent
        self._mountpoint: Path | None = None

    @property
    def mountpoint(self) -> Path:
        if self._mountpoint is None:
            raise PoolError("SLOT_STORE_CLOSED", "The slot store is not open yet.")
        return self._mountpoint

    @property
    def base(self) -> Path:
        return self.mountpoint

    async def open(self) -> None:
        """Read where the slots under dataset ``parent`` are mounted.

        Raises:
            PoolError: ``ZFS_DATASET_NOT_FOUND`` if ``parent`` does not exist
                (run provisioning), ``ZFS_BAD_MOUNTPOINT``, ``ZFS_UNAVAILABLE``.
        """
        try:
            ds = await _zfs.get_one(self.parent, ("mountpoint",))
        except PoolError as exc:
            if exc.code == "ZFS_DATASET_NOT_FOUND":
                raise PoolError(
                    "ZFS_DATASET_NOT_FOUND",
                    f"ZFS dataset {self.parent} does not exist; run `sandbox-mcp provision` first.",
                    exc.details,
                ) from exc
            raise
        self._mountpoint = parent_root(self.parent, ds.get("mountpoint"))

    def dataset(self, slot: Slot) -> str:
        return f"{self.parent}/{slot.name}"

    def slot(self, index: int) -> Slot:
        name = name_of(index)
        return Slot(index=index, name=name, root=self.mountpoint / name)

    async def missing(self, size: int) -> list[str]:
        try:
            tree = await _zfs.get_tree(self.parent, ("type", "mountpoint", "mounted"), depth=2)
        except PoolError as exc:
            if exc.code != "ZFS_DATASET_NOT_FOUND":
                raise
            tree = {}
        bad: list[str] = []
        for index in range(size):
            slot = self.slot(index)
            reason = self._problem(slot, tree)
            if reason is not None:
                logger.warning("slot.unusable", slot=slot.name, reason=reason)
                bad.append(slot.name)
        return bad

    def _problem(self, slot: Slot, tree: dict[str, _zfs.Dataset]) -> str | None:
        ds = tree.get(self.dataset(slot))
        if ds is None or ds.get("type") != "filesystem":
            return f"dataset {self.dataset(slot)} does not exist"
        if f"{ds.name}@{SNAPSHOT}" not in tree:
            return f"snapshot {ds.name}@{SNAPSHOT} does not exist"
        # slot() derives roots from the parent's mountpoint; make sure it holds.
        if ds.get("mountpoint") != str(slot.root):
            return f"mountpoint is {ds.get('mountpoint')}, expected {slot.root}"
        if ds.get("mounted") != "yes":
            return "dataset is not mounted"
        return None

    async def reset(self, slot: Slot) -> None:
        started = time.perf_counter()
        snapshot = f"{self.dataset(slot)}@{SNAPSHOT}"
        try:
            await _zfs.run("zfs", "rollback", "-r", snapshot)
        except PoolError as exc:
            if exc.code == "ZFS_DATASET_NOT_FOUND":
                raise PoolError(
                    "SLOT_MISSING",
                    f"Slot {slot.name} cannot be emptied because {snapshot} does not exist; "
                    "run `sandbox-mcp provision` to repair it.",
                    {"slot": slot.name, **exc.details},
                ) from exc
            raise
        ms = round((time.perf_counter() - started) * 1000, 1)
        logger.info("slot.reset", backend="zfs", slot=slot.name, ms=ms)

    async def close(self) -> None:
        """Nothing runs in the background: a rollback is complete when it returns."""


async def mount_state(dataset: str) -> tuple[str, bool]:
    """The dataset's mountpoint (``-`` or ``none`` when it has none) and whether ZFS has
    it mounted: what a live workspace's remount (``app/experiments/recovery``) asks."""
    found = await _zfs.get_one(dataset, ("mountpoint", "mounted"))
    return found.get("mountpoint"), found.get("mounted") == "yes"


async def mount(dataset: str) -> None:
    """``zfs mount`` the dataset (its parent must be mounted already)."""
    await _zfs.run("zfs", "mount", dataset)
