"""``nosuid,nodev`` on the mounts that hold the slots (provisioning, as root).

Docker 20.10 takes no mount flags on a bind mount, but a bind mount inherits
the flags of the host mount its source sits on, so a workspace is ``nosuid,nodev``
inside its container exactly when the slot's host mount is. Provisioning makes
it so:

- dir slots: ``<state_dir>/slots`` becomes a bind mount of itself, remounted
  ``nosuid,nodev`` (every slot and the trash below it, one mount);
- ZFS slots: each dataset's mount is remounted ``nosuid,nodev``. The dataset
  properties ``setuid=off devices=off`` are set too, but zfs-fuse ignores them
  (its mounts show ``rw,relatime`` only), so they cannot be relied on alone.

Neither survives a reboot (nor a dataset remount): run ``sandbox-mcp provision``
at boot, or put the bind in fstab (README, "Deploying"). The flags are checked
with ``statvfs``, which reports the mount's own flags.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import structlog

from pool.errors import PoolError

logger = structlog.get_logger(__name__)

FLAGS = ("nosuid", "nodev")
_TIMEOUT_S = 30


def missing_flags(path: Path) -> list[str]:
    """Which of nosuid, nodev the mount holding ``path`` lacks."""
    flags = os.statvfs(path).f_flag
    return [
        name for name, bit in (("nosuid", os.ST_NOSUID), ("nodev", os.ST_NODEV)) if not flags & bit
    ]


def mount_points(mountinfo: str) -> set[str]:
    """The mount points listed in ``/proc/self/mountinfo`` text (octal escapes undone)."""
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            points.add(_unescape(fields[4]))
    return points


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \040, \011, \012, \134.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def seal(path: Path) -> bool:
    """Make ``path`` a mount of its own carrying nosuid,nodev (blocking; needs root).

    A path that is not a mount point is first bind-mounted onto itself, so only
    this tree gets the flags, never the filesystem around it. Returns whether
    anything was changed.

    Raises:
        PoolError: ``MOUNT_FLAGS_FAILED`` when ``mount`` fails or the flags are
            still missing afterwards.
    """
    if not missing_flags(path):
        return False
    real = os.path.realpath(path)
    if real not in mount_points(Path("/proc/self/mountinfo").read_text()):
        _mount("--bind", real, real)
    # remount,bind changes this mount point's flags only, not the filesystem's.
    _mount("-o", "remount,bind,nosuid,nodev", real)
    still = missing_flags(path)
    if still:
        raise PoolError(
            "MOUNT_FLAGS_FAILED",
            f"{real} is still mounted without {','.join(still)} after a remount; "
            "mount it nosuid,nodev yourself (see README, Deploying).",
            {"path": real, "missing": still},
        )
    logger.info("slot.mount_sealed", path=real, flags=list(FLAGS))
    return True


def _mount(*args: str) -> None:
    try:
        done = subprocess.run(  # noqa: S603 - fixed program, our own paths
            ["mount", *args],  # noqa: S607 - util-linux's, found on PATH like zfs
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PoolError(
            "MOUNT_FLAGS_FAILED",
            f"`mount {' '.join(args)}` could not run ({exc}); is util-linux installed?",
            {"args": list(args)},
        ) from exc
    if done.returncode != 0:
        raise PoolError(
            "MOUNT_FLAGS_FAILED",
            f"`mount {' '.join(args)}` failed: {done.stderr.strip()[:300]}",
            {"args": list(args)},
        )
