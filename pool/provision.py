"""Provisioning: create and repair the slots. The only step needing admin rights.

Both functions are idempotent: they create what is missing, repair what is
wrong and leave correct slots alone. A slot whose index is in ``leased``
belongs to a live sandbox: it may be created if it is missing, but it is never
modified, rolled back or destroyed; what it would need is reported instead, to
be repaired by a later run once it is free.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import stat
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from pool import _zfs, mount_flags
from pool.errors import PoolError
from pool.slots import name_of
from pool.slots_dir import SLOT_MODE, TRASH, slots_dir_of
from pool.slots_zfs import SNAPSHOT, parent_root
from pool.spread import spread_subfolders

logger = structlog.get_logger(__name__)

_QUOTA = re.compile(r"([1-9][0-9]*)([KMGTP]?)", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_DATASET = re.compile(r"[A-Za-z0-9][\w.:-]*(/[\w.:-]+)*", re.ASCII)
_ZFS_PROPS = ("type", "setuid", "devices", "exec", "quota", "mountpoint", "mounted")

Owner = tuple[int, int]


@dataclass(frozen=True)
class ProvisionReport:
    """What a provisioning run did, slot by slot counted once."""

    created: int = 0
    repaired: int = 0
    untouched: int = 0
    skipped_leased: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass
class _Tally:
    created: int = 0
    repaired: int = 0
    untouched: int = 0
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def skip(self, name: str, problems: list[str]) -> None:
        self.skipped.append(name)
        self.notes.append(f"{name}: leased, not repaired: {'; '.join(problems)}")

    def repair(self, name: str, problems: list[str]) -> None:
        self.repaired += 1
        self.notes.append(f"{name}: repaired: {'; '.join(problems)}")
        logger.info("slot.repaired", slot=name, problems=problems)

    def report(self, backend: str, started: float) -> ProvisionReport:
        report = ProvisionReport(
            self.created, self.repaired, self.untouched, tuple(self.skipped), tuple(self.notes)
        )
        ms = round((time.perf_counter() - started) * 1000, 1)
        logger.info(
            "pool.provision", backend=backend, created=self.created, repaired=self.repaired,
            untouched=self.untouched, skipped_leased=self.skipped, ms=ms,
        )  # fmt: skip
        return report


def parse_quota(quota: str) -> int:
    """Return the size in bytes of a quota such as ``10G`` or ``512M`` (powers of 1024).

    Raises:
        PoolError: ``INVALID_QUOTA`` for anything but a positive whole number
            with an optional K, M, G, T or P suffix.
    """
    match = _QUOTA.fullmatch(quota.strip())
    if match is None:
        raise PoolError(
            "INVALID_QUOTA",
            f"Quota {quota!r} is not valid; use a whole number with an optional "
            "K, M, G, T or P suffix, e.g. 10G or 512M.",
            {"quota": quota},
        )
    number, unit = match.groups()
    return int(number) * _UNITS[unit.upper()]


def resolve_owner(owner: str | None) -> Owner | None:
    """Turn a user name or numeric uid into ``(uid, gid)``.

    A uid without a passwd entry is accepted (container uids often have
    none) and gets the group with the same number.

    Raises:
        PoolError: ``UNKNOWN_OWNER`` for a user name this host does not know.
    """
    if owner is None:
        return None
    if owner.isdigit():
        uid = int(owner)
        try:
            return uid, pwd.getpwuid(uid).pw_gid
        except KeyError:
            return uid, uid
    try:
        entry = pwd.getpwnam(owner)
    except KeyError:
        raise PoolError(
            "UNKNOWN_OWNER",
            f"There is no user named {owner!r} on this host; create it or pass a numeric uid.",
            {"owner": owner},
        ) from None
    return entry.pw_uid, entry.pw_gid


def _check_count(count: int) -> None:
    if count < 1:
        raise PoolError(
            "INVALID_SLOT_COUNT", f"Slot count must be at least 1, got {count}.", {"count": count}
        )


def _root_problems(root: Path, owner: Owner | None, *, follow: bool = False) -> list[str]:
    st = os.stat(root) if follow else os.lstat(root)
    problems = []
    if stat.S_IMODE(st.st_mode) != SLOT_MODE:
        problems.append(f"mode is {stat.S_IMODE(st.st_mode):04o}, want {SLOT_MODE:04o}")
    if owner is not None and (st.st_uid, st.st_gid) != owner:
        problems.append(f"owner is {st.st_uid}:{st.st_gid}, want {owner[0]}:{owner[1]}")
    return problems


def _fix_root(root: Path, owner: Owner | None) -> None:
    os.chmod(root, SLOT_MODE)
    if owner is not None:
        os.chown(root, *owner)


def _mkdir(path: Path, owner: Owner | None) -> None:
    path.mkdir(mode=SLOT_MODE)
    _fix_root(path, owner)
    spread_subfolders(path)  # each experiment in its own ext4 block group (pool/spread.py)


# -- dir backend -------------------------------------------------------------


async def provision_dir(
    state_dir: Path,
    count: int,
    *,
    owner: str | None,
    leased: Collection[int] = (),
    seal: bool = False,
) -> ProvisionReport:
    """Create or repair folder slots ``<state_dir>/slots/slot-000`` .. ``count-1``.

    Repairs: a file or link where a slot folder should be (replaced by an
    empty folder), wrong mode (0700 wanted), wrong owner (when ``owner`` is
    given). Never empties a slot folder. No quota: the dir backend has none.
    With ``seal`` (``sandbox-mcp provision``, as root) the slots folder becomes a
    mount of its own carrying nosuid,nodev (pool/mount_flags.py).

    Raises:
        PoolError: ``UNKNOWN_OWNER``, ``INVALID_SLOT_COUNT``, ``PROVISION_FAILED``.
    """
    _check_count(count)
    ids = resolve_owner(owner)
    started = time.perf_counter()
    try:
        tally = await asyncio.to_thread(_provision_dir, state_dir, count, ids, set(leased))
        if seal:
            await asyncio.to_thread(_seal, slots_dir_of(state_dir), tally)
    except OSError as exc:
        raise PoolError(
            "PROVISION_FAILED",
            f"Could not provision slots in {state_dir} ({exc.strerror}: {exc.filename}).",
            {"errno": exc.errno, "path": str(exc.filename)},
        ) from exc
    return tally.report("dir", started)


def _provision_dir(state_dir: Path, count: int, owner: Owner | None, leased: set[int]) -> _Tally:
    tally = _Tally()
    slots = slots_dir_of(state_dir)
    if not state_dir.exists():
        state_dir.mkdir(parents=True)
        if owner is not None:
            os.chown(state_dir, *owner)
    for folder in (slots, slots / TRASH):
        if not folder.exists():
            _mkdir(folder, owner)
        # An operator may link slots/ to another disk: judge (and fix) the target.
        elif problems := _root_problems(folder, owner, follow=True):
            _fix_root(folder, owner)
            tally.notes.append(f"{folder.name}: repaired: {'; '.join(problems)}")
    for index in range(count):
        name = name_of(index)
        root = slots / name
        try:
            st = os.lstat(root)
        except FileNotFoundError:
            _mkdir(root, owner)
            tally.created += 1
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        problems = _root_problems(root, owner) if is_dir else ["not a folder"]
        if not problems:
            tally.untouched += 1
        elif index in leased:
            tally.skip(name, problems)
        else:
            if not is_dir:
                root.unlink()  # a file or a link: removes the link, never its target
                _mkdir(root, owner)
            else:
                _fix_root(root, owner)
            tally.repair(name, problems)
    return tally


def _seal(path: Path, tally: _Tally) -> None:
    """Give ``path``'s mount nosuid,nodev, or say in the report why it could not."""
    if os.geteuid() != 0:
        missing = mount_flags.missing_flags(path)
        if missing:
            tally.notes.append(
                f"{path}: mounted without {','.join(missing)}; run provision as root to fix"
            )
        return
    if mount_flags.seal(path):
        tally.notes.append(f"{path}: remounted nosuid,nodev")


# -- zfs backend -------------------------------------------------------------


async def provision_zfs(
    parent: str,
    count: int,
    *,
    quota: str | None,
    owner: str | None,
    leased: Collection[int] = (),
) -> ProvisionReport:
    """Create or repair dataset slots ``<parent>/slot-000`` .. ``count-1``.

    Creates ``parent`` (with ``-p``) if needed, but never a pool. Each slot
    gets ``setuid=off``, ``devices=off``, ``exec=on``, the quota (when
    given; ``None`` leaves existing quotas alone), a 0700 root owned by
    ``owner`` (when given) and an ``@empty`` snapshot of that empty root.
    Repairs: properties, mountpoint, mounting, root mode/owner (by rollback,
    fix, re-snapshot) and a missing ``@empty`` (by destroying and recreating
    the dataset, whose content is garbage since it is not leased).

    Raises:
        PoolError: ``INVALID_DATASET``, ``INVALID_QUOTA``, ``UNKNOWN_OWNER``,
            ``INVALID_SLOT_COUNT``,
            ``ZFS_POOL_NOT_FOUND``, ``ZFS_BAD_MOUNTPOINT``, ``ZFS_UNAVAILABLE``,
            ``ZFS_COMMAND_FAILED``.
    """
    _check_count(count)
    if _DATASET.fullmatch(parent) is None:
        raise PoolError(
            "INVALID_DATASET",
            f"{parent!r} is not a ZFS dataset name such as tank/sandbox-slots.",
            {"dataset": parent},
        )
    wanted = {"setuid": "off", "devices": "off", "exec": "on"}
    if quota is not None:
        wanted["quota"] = str(parse_quota(quota))
    ids = resolve_owner(owner)
    started = time.perf_counter()
    mountpoint = await _ensure_parent(parent)
    tree = await _zfs.get_tree(parent, _ZFS_PROPS, depth=2)
    tally = _Tally()
    leased_set = set(leased)
    for index in range(count):
        slot = _ZfsSlot(f"{parent}/{name_of(index)}", mountpoint / name_of(index), wanted, ids)
        ds = tree.get(slot.dataset)
        if ds is None:
            await slot.create()
            tally.created += 1
            continue
        has_snapshot = f"{slot.dataset}@{SNAPSHOT}" in tree
        problems = await slot.problems(ds, has_snapshot=has_snapshot)
        if not problems:
            tally.untouched += 1
        elif index in leased_set:
            tally.skip(name_of(index), problems)
        else:
            await slot.repair(ds, has_snapshot=has_snapshot)
            tally.repair(name_of(index), problems)
    return tally.report("zfs", started)


async def _ensure_parent(parent: str) -> Path:
    pool = parent.split("/", 1)[0]
    try:
        await _zfs.run("zpool", "list", "-H", "-o", "name", pool)
    except PoolError as exc:
        if exc.code != "ZFS_POOL_NOT_FOUND":
            raise
        raise PoolError(
            "ZFS_POOL_NOT_FOUND",
            f"ZFS pool {pool!r} does not exist; create or import it first "
            "(provisioning never creates pools).",
            exc.details,
        ) from exc
    try:
        ds = await _zfs.get_one(parent, ("mountpoint",))
    except PoolError as exc:
        if exc.code != "ZFS_DATASET_NOT_FOUND":
            raise
        await _zfs.run("zfs", "create", "-p", parent)
        logger.info("pool.parent_created", dataset=parent)
        ds = await _zfs.get_one(parent, ("mountpoint",))
    return parent_root(parent, ds.get("mountpoint"))


@dataclass(frozen=True)
class _ZfsSlot:
    dataset: str
    root: Path
    wanted: dict[str, str]
    owner: Owner | None

    async def create(self) -> None:
        options = [arg for prop, value in self.wanted.items() for arg in ("-o", f"{prop}={value}")]
        await _zfs.run("zfs", "create", *options, self.dataset)
        await self._mount()
        await asyncio.to_thread(_fix_root, self.root, self.owner)
        await _zfs.run("zfs", "snapshot", f"{self.dataset}@{SNAPSHOT}")

    async def problems(self, ds: _zfs.Dataset, *, has_snapshot: bool) -> list[str]:
        problems = [
            f"{prop} is {ds.get(prop)}, want {value}"
            for prop, value in self.wanted.items()
            if ds.get(prop) != value
        ]
        if ds.get("mountpoint") != str(self.root):
            problems.append(f"mountpoint is {ds.get('mountpoint')}, want {self.root}")
        elif ds.get("mounted") != "yes":
            problems.append("not mounted")
        elif os.geteuid() == 0 and (missing := mount_flags.missing_flags(self.root)):
            problems.append(f"mounted without {','.join(missing)}")
        else:
            problems += await asyncio.to_thread(_root_problems, self.root, self.owner)
        if not has_snapshot:
            problems.append(f"no @{SNAPSHOT} snapshot")
        return problems

    async def repair(self, ds: _zfs.Dataset, *, has_snapshot: bool) -> None:
        if not has_snapshot:
            # Without @empty there is no cheap way back to a known-empty root.
            await _zfs.destroy(self.dataset)
            await self.create()
            return
        for prop, value in self.wanted.items():
            if ds.get(prop) != value:
                await _zfs.run("zfs", "set", f"{prop}={value}", self.dataset)
        if ds.get("mountpoint") != str(self.root):
            await _zfs.run("zfs", "inherit", "mountpoint", self.dataset)
        await self._mount()
        if await asyncio.to_thread(_root_problems, self.root, self.owner):
            # The snapshot may hold the wrong mode too: fix the empty root, retake it.
            await _zfs.run("zfs", "rollback", "-r", f"{self.dataset}@{SNAPSHOT}")
            await asyncio.to_thread(_fix_root, self.root, self.owner)
            await _zfs.run("zfs", "destroy", f"{self.dataset}@{SNAPSHOT}")
            await _zfs.run("zfs", "snapshot", f"{self.dataset}@{SNAPSHOT}")

    async def _mount(self) -> None:
        ds = await _zfs.get_one(self.dataset, ("mountpoint", "mounted"))
        if ds.get("mountpoint") != str(self.root):
            raise PoolError(
                "ZFS_BAD_MOUNTPOINT",
                f"{self.dataset} mounts at {ds.get('mountpoint')}, not {self.root}; "
                "check the mountpoint of its parent.",
                {"dataset": self.dataset, "mountpoint": ds.get("mountpoint")},
            )
        if ds.get("mounted") != "yes":
            await _zfs.run("zfs", "mount", self.dataset)
        if os.geteuid() == 0:
            # zfs-fuse ignores setuid=off devices=off: the mount itself must carry them.
            await asyncio.to_thread(mount_flags.seal, self.root)
