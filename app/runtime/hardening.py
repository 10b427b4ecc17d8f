"""Checks that the engine and the host give the isolation the containers rely on.

- **seccomp**: Docker applies its default syscall filter unless the engine was
  built or configured without it. A container without one may call every
  syscall the kernel has (``keyctl``, ``userfaultfd``, ``bpf`` with a kernel
  bug...). The engine must list ``name=seccomp`` in ``docker info``
  SecurityOptions with a profile other than ``unconfined``; otherwise no
  container is created (RUNTIME_UNAVAILABLE, with the reason) and
  ``check_sandbox_runtime`` says why.
- **nosuid, nodev on workspaces**: Docker's bind mounts take no such flags, so
  they come from the filesystem the slots live on (ZFS slots are provisioned
  with ``setuid=off devices=off``). Where they are missing the server warns
  once: setuid bits stay inert anyway (``no-new-privileges``) and device nodes
  unusable (the engine's device cgroup, and no CAP_MKNOD), so it is defence in
  depth, not a hole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def engine_problem(engine_info: Mapping[str, Any], slots_base: Path) -> str | None:
    """Check ``docker info`` and the slots' filesystem (blocking: run it off the loop).

    Returns why no container may be created, or None; logs what it finds.
    """
    problem = seccomp_problem(engine_info)
    if problem is not None:
        log.error("runtime.seccomp_inactive", reason=problem)
    try:
        missing = missing_mount_flags(slots_base)
    except OSError as exc:
        missing = []
        log.warning("runtime.mount_flags_unknown", path=str(slots_base), error=exc.strerror)
    if missing:
        log.warning(
            "runtime.workspace_mount_flags",
            path=str(slots_base),
            missing=missing,
            advice="put the slots on a filesystem mounted nosuid,nodev (ZFS slots are)",
        )
    return problem


def seccomp_problem(engine_info: Mapping[str, Any]) -> str | None:
    """Why ``docker info`` shows no active seccomp filter, or None when it does."""
    options = [str(o) for o in engine_info.get("SecurityOptions") or ()]
    seccomp = [o for o in options if o.startswith("name=seccomp")]
    if not seccomp:
        return (
            "the Docker engine applies no seccomp profile (docker info lists no "
            "name=seccomp); sandboxes are refused until it does: use an engine built "
            "with seccomp and do not set seccomp-profile=unconfined in daemon.json"
        )
    if any("profile=unconfined" in o for o in seccomp):
        return (
            "the Docker engine's default seccomp profile is 'unconfined'; sandboxes are "
            "refused until daemon.json names the default (or a stricter) profile"
        )
    return None


def missing_mount_flags(path: Path) -> list[str]:
    """Which of nosuid, nodev the filesystem holding ``path`` is mounted without."""
    flags = os.statvfs(path).f_flag
    missing = []
    if not flags & os.ST_NOSUID:
        missing.append("nosuid")
    if not flags & os.ST_NODEV:
        missing.append("nodev")
    return missing
