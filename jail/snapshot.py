"""Snapshot copy: bring a host project into a sandbox folder (local mode only).

The copy holds no secret and nothing from outside the project: secret files
and folders are never copied whatever the configuration, links that leave the
project are not followed (nor copied), build output is skipped unless asked
for. The host tree is only read; access times are spared where the kernel
allows (O_NOATIME).

The source is resolved (every link followed) before it is judged, and the
opened descriptor is judged again by identity, so neither a link nor a rename
can launder a refused place: ``/``, the home folder or any folder above it,
kernel pseudo-filesystems, and credential folders such as ``~/.ssh``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from jail._copier import Copier
from jail._oserrors import translate
from jail._snapshot_rules import SECRET_DIR_NAMES, SnapshotFilter
from jail.errors import JailError
from jail.pack import PackWriter

__all__ = ["SnapshotReport", "snapshot_copy"]

logger = structlog.get_logger(__name__)

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_PSEUDO_FILESYSTEMS = ("proc", "sys", "dev")
# Two threads: on ext4 a 5,000-file copy (workspace and baseline) takes about half
# the time of one walk (740 vs 1,330 ms p50 on the 2-core CI machine); more gain
# nothing there, and each holds the GIL between its syscalls. zfs-fuse serialises
# the writes, so there it neither helps nor hurts.
DEFAULT_WORKERS = 2


@dataclass(frozen=True)
class SnapshotReport:
    """What a snapshot copy did. Paths are project-relative."""

    files_copied: int
    bytes_copied: int
    dirs_created: int
    links_copied: int
    secrets_skipped: int
    build_skipped: int
    excluded_skipped: int
    links_skipped: int
    special_skipped: int
    unreadable_skipped: int
    too_deep_skipped: int
    secret_paths: tuple[str, ...]
    seconds: float


def snapshot_copy(
    source: Path,
    dest: Path,
    *,
    extra_excludes: Sequence[str] = (),
    include_build_output: bool = False,
    home: Path | None = None,
    mirror: Path | None = None,
    pack: Path | None = None,
    pack_leave_out: Callable[[str], bool] | None = None,
    owner: tuple[int, int] | None = None,
    workers: int | None = None,
) -> SnapshotReport:
    """Copy the host project ``source`` into ``dest``, an existing empty folder
    (and, in the same walk, into ``mirror``, another one: an identical copy).

    Args:
        source: the host project folder (any links in it are resolved first).
        dest: the sandbox folder, created empty by the server. On error it may
            hold a partial copy; the caller empties it.
        extra_excludes: glob patterns to leave out (see ``SnapshotFilter``).
        include_build_output: copy node_modules, dist, target, .venv, ... too.
        home: the home folder to refuse; defaults to ``$HOME`` and the
            account's home from the password database.
        mirror: a second empty folder to fill in the same walk (an experiment's
            baseline): each file is read once from ``source``, then copied from
            ``dest``, so both hold the same bytes even if ``source`` changes.
        pack: a new file to write, in the same walk, with what ``dest`` received
            (jail/pack.py: an experiment's baseline as one file, not a second tree).
        pack_leave_out: folder names whose contents the pack does not record.
        owner: (uid, gid) to give ``dest`` and all it receives (the mirror keeps
            the server's): the sandbox user's workspace, without a second walk.
        workers: threads copying the top-level folders side by side (1: one walk);
            DEFAULT_WORKERS unless given.

    Raises:
        JailError: PROJECT_PATH_REFUSED, NOT_FOUND, NOT_A_DIRECTORY,
            DIRECTORY_NOT_EMPTY, INVALID_EXCLUDE_PATTERN, NO_SPACE, ...
    """
    started = time.perf_counter()
    rules = SnapshotFilter(tuple(extra_excludes), include_build_output=include_build_output)
    src_fd = _open_source(Path(source), home)
    dst_fds: list[int] = []
    writer: PackWriter | None = None
    try:
        for folder in (dest, *([mirror] if mirror is not None else [])):
            dst_fds.append(_open_dest(Path(folder)))
        # Never copy a destination into itself (one may lie inside the project).
        skip = frozenset((st.st_dev, st.st_ino) for st in map(os.fstat, dst_fds))
        if owner is not None:
            os.fchown(dst_fds[0], *owner)
        if pack is not None:
            try:
                writer = PackWriter(pack, pack_leave_out)
            except OSError as exc:
                raise translate(exc, ".") from None
        tally = Copier(rules, skip=skip, owner=owner, pack=writer).copy_tree(
            src_fd, *dst_fds, workers=workers or DEFAULT_WORKERS
        )
        if writer is not None:
            try:
                writer.close()
            except OSError as exc:
                raise translate(exc, ".") from None
    finally:
        if writer is not None:
            writer.release()
        for fd in dst_fds:
            os.close(fd)
        os.close(src_fd)
    report = SnapshotReport(
        files_copied=tally.files_copied,
        bytes_copied=tally.bytes_copied,
        dirs_created=tally.dirs_created,
        links_copied=tally.links_copied,
        secrets_skipped=tally.secrets_skipped,
        build_skipped=tally.build_skipped,
        excluded_skipped=tally.excluded_skipped,
        links_skipped=tally.links_skipped,
        special_skipped=tally.special_skipped,
        unreadable_skipped=tally.unreadable_skipped,
        too_deep_skipped=tally.too_deep_skipped,
        secret_paths=tuple(tally.secret_paths),
        seconds=time.perf_counter() - started,
    )
    logger.info(
        "jail.snapshot_copied",
        files=report.files_copied,
        bytes=report.bytes_copied,
        secrets_skipped=report.secrets_skipped,
        build_skipped=report.build_skipped,
        links_skipped=report.links_skipped,
        seconds=round(report.seconds, 3),
    )
    return report


def _open_source(source: Path, home: Path | None) -> int:
    try:
        resolved = source.resolve(strict=True)
    except FileNotFoundError:
        raise JailError(
            "NOT_FOUND", "The project folder does not exist; pass an existing folder."
        ) from None
    except (OSError, RuntimeError):
        raise _refused("its path cannot be resolved (a link loop, or no permission)") from None
    except ValueError:  # a NUL byte: no path on any filesystem holds one
        raise _refused("its path contains a NUL byte") from None
    homes = _homes(home)
    if resolved == Path("/") or any(resolved == h or resolved in h.parents for h in homes):
        raise _refused("it is / or your home folder (or a folder above it)")
    if resolved.parts[1:2] and resolved.parts[1] in _PSEUDO_FILESYSTEMS:
        raise _refused("it is part of a kernel pseudo-filesystem")
    if any(part.lower() in SECRET_DIR_NAMES for part in resolved.parts):
        raise _refused("it lies in a credentials folder such as .ssh or .aws")
    try:
        fd = os.open(resolved, _O_DIR | os.O_NOFOLLOW)
    except NotADirectoryError:
        raise JailError("NOT_A_DIRECTORY", "The project path is not a folder.") from None
    except OSError as exc:
        reason = errno.errorcode.get(exc.errno or 0, "unknown error")
        raise _refused(f"it cannot be opened ({reason})") from None
    # resolve() and open() are two steps; compare identities so a rename in
    # between cannot slip a refused folder in under an innocent name.
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in _refused_identities(homes):
        os.close(fd)
        raise _refused("it is / or your home folder (or a folder above it)")
    return fd


def _open_dest(dest: Path) -> int:
    try:
        fd = os.open(dest, _O_DIR)
    except FileNotFoundError:
        raise JailError("NOT_FOUND", "The sandbox folder for the snapshot is missing.") from None
    except OSError as exc:
        raise translate(exc, ".") from None
    with os.scandir(fd) as listing:
        empty = next(listing, None) is None
    if not empty:
        os.close(fd)
        raise JailError("DIRECTORY_NOT_EMPTY", "The sandbox folder for the snapshot is not empty.")
    return fd


def _homes(home: Path | None) -> list[Path]:
    if home is not None:
        return [home.resolve()]
    homes = [Path.home().resolve()]
    # A container's arbitrary uid may have no password entry: $HOME only, then.
    with contextlib.suppress(KeyError):
        homes.append(Path(pwd.getpwuid(os.getuid()).pw_dir).resolve())
    return homes


def _refused_identities(homes: list[Path]) -> set[tuple[int, int]]:
    identities = set()
    for place in {Path("/"), *homes, *(p for h in homes for p in h.parents)}:
        try:
            st = os.stat(place)
        except OSError:
            continue
        identities.add((st.st_dev, st.st_ino))
    return identities


def _refused(reason: str) -> JailError:
    return JailError(
        "PROJECT_PATH_REFUSED",
        f"The project folder was refused because {reason}; pass the project's own folder.",
    )
