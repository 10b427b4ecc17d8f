"""The syscall filter of containers whose slots have no kernel quota (dir slots).

The dir slots' byte budget is kept by measuring (app/experiments/disk_budget.py), so
what a command can add between two measurements must be bounded by the time it
takes. Writing is; ``fallocate`` is not: one call reserves any number of blocks
at once (4 GiB past a 32 MB budget in one syscall), and ``FALLOC_FL_KEEP_SIZE``
does so without growing the file, so ``RLIMIT_FSIZE`` does not see it either.

So these containers get Docker's default profile (``seccomp_default.json``,
moby/profiles seccomp v0.2.3, Apache-2.0, as the engine vendors it; io_uring is
not in it, whose ``IORING_OP_FALLOCATE`` would step around the rule) with one
change: ``fallocate`` modes that allocate (plain, ``KEEP_SIZE``, ``ZERO_RANGE``,
``UNSHARE_RANGE``, ``WRITE_ZEROES``) fail with ``EOPNOTSUPP``, as on filesystems
without it, so glibc's ``posix_fallocate`` falls back to writing one byte per
block, which is writing: measured, and as slow as the disk. The modes that free or
move blocks (``PUNCH_HOLE``, ``COLLAPSE_RANGE``, ``INSERT_RANGE``) stay allowed.
Passing a profile replaces the engine's own (``seccomp-profile`` in daemon.json),
which is why ZFS slots, with a real quota, keep the engine's.
"""

from __future__ import annotations

import errno
import functools
import json
from pathlib import Path
from typing import Any

_DEFAULT = Path(__file__).with_name("seccomp_default.json")
_FALLOCATE = "fallocate"
# include/uapi/linux/falloc.h: a mode with one of these bits frees or moves blocks
# (the kernel refuses them combined with an allocating mode).
_FREEING_MODES = (0x02, 0x08, 0x20)  # PUNCH_HOLE, COLLAPSE_RANGE, INSERT_RANGE
_FREEING_MASK = 0x02 | 0x08 | 0x20


def _mode(mask: int, value: int) -> dict[str, Any]:
    # Docker's MASKED_EQ: (arg & value) == valueTwo; fallocate's mode is argument 1.
    return {"index": 1, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


@functools.cache
def no_preallocation_profile() -> str:
    """Docker's default profile with allocating ``fallocate`` refused (JSON, for
    ``security_opt=["seccomp=..."]``)."""
    profile = json.loads(_DEFAULT.read_text())
    for rule in profile["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW" and _FALLOCATE in rule["names"]:
            rule["names"] = [name for name in rule["names"] if name != _FALLOCATE]
    profile["syscalls"] += [
        {"names": [_FALLOCATE], "action": "SCMP_ACT_ALLOW", "args": [_mode(bit, bit)]}
        for bit in _FREEING_MODES
    ] + [
        {
            "names": [_FALLOCATE],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": errno.EOPNOTSUPP,
            "args": [_mode(_FREEING_MASK, 0)],
            "comment": "dir slots: allocation only by writing (app/runtime/docker/seccomp.py)",
        }
    ]
    return json.dumps(profile, separators=(",", ":"))
