"""Everything that makes a sandbox container safe, in one place for an auditor to read:
the host configuration every container gets, and the checks that the engine and the
host give the isolation it relies on.

The host configuration (``hardened_host_config``): not privileged; every capability
dropped, the bounding set included (``CAPABILITIES`` is empty: a non-root process
under ``no-new-privileges`` could never use one); ``no-new-privileges``; pids,
memory (no swap) and CPU caps; a read-only root with capped tmpfs at ``/tmp`` and
the home folder; tini as PID 1; no core dumps; no container log; and it is refused
outright if any mount would expose the Docker socket.

The checks:

- **seccomp**: Docker applies its default syscall filter unless the engine was
  built or configured without it. A container without one may call every
  syscall the kernel has (``keyctl``, ``userfaultfd``, ``bpf`` with a kernel
  bug...). The engine must list ``name=seccomp`` in ``docker info``
  SecurityOptions with a profile other than ``unconfined``; otherwise no
  container is created (RUNTIME_UNAVAILABLE, with the reason) and
  ``check_sandbox_runtime`` says why.
- **nosuid, nodev on workspaces**: Docker's bind mounts take no such flags, so
  they come from the host mount the slots sit on: ``sandbox-mcp provision`` (as
  root) remounts it ``nosuid,nodev`` (pool/mount_flags.py; zfs-fuse ignores the
  datasets' ``setuid=off devices=off``). Where they are missing the server warns
  once and still serves, even in hosted mode: setuid bits stay inert anyway
  (``no-new-privileges``) and device nodes unusable (the engine's device cgroup,
  and no CAP_MKNOD), so the flags are a second layer, not the only one; refusing
  would make every deployment (the non-root image included) need a root mount.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import docker
import structlog
from docker.types import LogConfig, Mount, Ulimit

from app.runtime.backend import WORKSPACE, Isolation, Limits, NetworkMode
from app.runtime.docker.seccomp import no_preallocation_profile
from app.runtime.docker.workspace import DOCKER_SOCKETS, refuse_docker_socket

log = structlog.get_logger(__name__)

# None: a non-root process under no-new-privileges has no way to use any (execve
# clears them, setuid/file capabilities are ignored); an empty bounding set makes sure.
CAPABILITIES: Final[tuple[str, ...]] = ()
TMP: Final = "/tmp"  # noqa: S108 - the container's own /tmp, a private tmpfs


def hardened_host_config(
    api: docker.APIClient,
    *,
    mounts: list[Mount],
    network_mode: str,
    limits: Limits,
    home: str,
    uid: int,
    gid: int,
    dir_budget_bytes: int | None = None,
) -> dict[str, Any]:
    """The host configuration of every container we create (experiments and helpers).

    ``dir_budget_bytes``: the slots have no kernel quota, only this measured budget
    (dir slots): allocating ``fallocate`` is refused (app/runtime/docker/seccomp.py) and no
    process may grow a file past the budget (``RLIMIT_FSIZE``), so one call can add
    no more than the budget, and bytes come only as fast as they are written.
    """
    memory = limits.memory_mb * 1024 * 1024
    security_opt = ["no-new-privileges:true"]
    # Core dumps would land in the workspace and eat its quota.
    ulimits = [Ulimit(name="core", soft=0, hard=0)]
    if dir_budget_bytes is not None:
        security_opt.append(f"seccomp={no_preallocation_profile()}")
        ulimits.append(Ulimit(name="fsize", soft=dir_budget_bytes, hard=dir_budget_bytes))
    tmpfs_opts = "rw,exec,nosuid,nodev"
    config: dict[str, Any] = api.create_host_config(
        mounts=mounts,
        network_mode=network_mode,
        privileged=False,
        cap_drop=["ALL"],
        cap_add=list(CAPABILITIES),
        security_opt=security_opt,
        pids_limit=limits.pids,
        mem_limit=memory,
        memswap_limit=memory,
        nano_cpus=round(limits.cpus * 1e9),
        read_only=True,
        tmpfs={
            TMP: f"{tmpfs_opts},size={limits.tmp_mb}m,mode=1777",
            home: f"{tmpfs_opts},size={limits.tmp_mb}m,uid={uid},gid={gid},mode=0700",
        },
        init=True,
        ulimits=ulimits,
        # Under host memory pressure, a sandbox dies before the server does.
        oom_score_adj=500,
        log_config=LogConfig(type=LogConfig.types.NONE),
    )
    return config


def applied_isolation(
    *,
    image: str,
    user: str,
    network: NetworkMode,
    limits: Limits,
    home: str,
    egress_allowlist: tuple[str, ...] = (),
) -> Isolation:
    """What ``hardened_host_config`` gives an experiment container, as the agent is told."""
    return Isolation(
        image,
        user,
        network,
        **dataclasses.asdict(limits),  # cpus, memory_mb, pids, tmp_mb: as clamped
        capabilities=CAPABILITIES,
        no_new_privileges=True,
        read_only_mounts=("/",),
        writable_mounts=(WORKSPACE, TMP, home),
        egress_allowlist=egress_allowlist,
    )


def refuse_docker_socket_in(host_config: Mapping[str, Any]) -> None:
    """Refuse a host configuration any of whose mounts would expose the engine's socket.

    Raises:
        WorkspaceRefused: one does.
    """
    sources = [str(mount.get("Source")) for mount in host_config.get("Mounts") or ()]
    sources += [str(bind).split(":")[0] for bind in host_config.get("Binds") or ()]
    refuse_docker_socket(sources, DOCKER_SOCKETS)


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
            advice="run `sandbox-mcp provision` as root: it remounts the slots nosuid,nodev",
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
