"""The SandboxBackend seam: hardened, throwaway containers for experiments.

The experiment manager decides *what* runs; a backend decides *how* it is
isolated. All container hardening lives in the implementation
(``app/runtime/backends/docker.py``); nothing above this seam ever sees a Docker flag,
a mount or a privilege.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, Protocol

# restricted: only the allow-listed names, through the server's proxy (egress_proxy.py).
NetworkMode = Literal["none", "egress", "restricted"]


# Where every experiment container sees its workspace (the seam's contract).
WORKSPACE: Final = "/workspace"


@dataclass(frozen=True)
class Limits:
    """Resource limits an experiment asks for (clamped to the operator's ceilings)."""

    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 256
    tmp_mb: int = 256


@dataclass(frozen=True)
class ContainerSpec:
    """What to start for one experiment.

    ``workspace`` is the host folder mounted read-write at ``/workspace``: it must
    lie inside the caller's own slot (the backend checks it lies under the slot
    base it was configured with). ``labels`` identify the owner without naming
    the sandbox key itself (a fingerprint).
    """

    experiment_id: str
    sandbox_label: str
    image: str
    workspace: Path
    network: NetworkMode = "none"
    limits: Limits = field(default_factory=Limits)
    env: dict[str, str] = field(default_factory=dict)
    # network "restricted": the names asked for (None: all the server allows); clamped.
    egress_allowlist: tuple[str, ...] | None = None
    # The caller's sign-in address, hashed (its sandboxes share the proxy's bounds).
    signin_label: str = ""
    # Made ahead for the sandbox's next experiment (app/runtime/warm/prepared.py): sent
    # to the engine only when no real creation waits, and outside the container shares
    # (the warm budget bounds it) until it is handed over.
    prepared: bool = False


@dataclass(frozen=True)
class GitSource:
    """A git project to clone into a new workspace.

    ``url`` is an ``https://`` URL and ``ref`` a branch, a tag or a commit
    (``None``: the default branch). ``local_path`` is set only by a server in
    local mode, to a git repository (bare or not) on the server's own disk: it
    is then cloned from there, without network, and ``url`` is not used.
    """

    url: str
    ref: str | None = None
    local_path: Path | None = None


@dataclass(frozen=True)
class Isolation:
    """The isolation actually applied, reported back to the agent."""

    image: str
    user: str
    network: NetworkMode
    cpus: float
    memory_mb: int
    pids: int
    tmp_mb: int
    capabilities: tuple[str, ...]
    no_new_privileges: bool
    read_only_mounts: tuple[str, ...]
    writable_mounts: tuple[str, ...]
    egress_allowlist: tuple[str, ...] = ()  # network "restricted": what it may reach


@dataclass(frozen=True)
class Container:
    container_id: str
    isolation: Isolation
    warnings: tuple[str, ...]  # e.g. "memory_mb 20000 was clamped to 8192"


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when killed (timeout, cancel) before it exited
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    timed_out: bool = False
    cancelled: bool = False


@dataclass(frozen=True)
class Revival:
    started: list[str]  # stopped containers started again
    missing: list[str]  # containers the engine no longer has


@dataclass(frozen=True)
class RuntimeInfo:
    reachable: bool
    version: str | None
    images: tuple[str, ...]  # allowed images that are present
    missing_images: tuple[str, ...]  # allowed images that are not built
    reason: str | None = None


class SandboxBackend(Protocol):
    async def info(self) -> RuntimeInfo:
        """Reachability, version and which allowed images exist. Never raises."""
        ...

    async def create(self, spec: ContainerSpec) -> Container:
        """Create and start a hardened container for one experiment.

        Raises:
            RuntimeFailure: IMAGE_NOT_ALLOWED, IMAGE_MISSING, WORKSPACE_REFUSED,
                CAPACITY_EXCEEDED (the server's containers, or the share left for a
                sandbox's second and later ones, are in use), RUNTIME_UNAVAILABLE.
            LimitReached: LIMIT_REACHED (the sandbox holds its own maximum).
        """
        ...

    async def run(
        self,
        container_id: str,
        command: str,
        *,
        timeout_s: float,
        job_id: str,
        max_output_bytes: int = 1_048_576,
        env: dict[str, str] | None = None,
        on_start: Callable[[tuple[int, int]], Awaitable[None]] | None = None,
    ) -> ExecResult:
        """Run ``/bin/sh -c command`` in ``/workspace`` and wait for it (bounded).

        ``on_start`` is told the pids of the command's process tree once it started:
        with them any process can kill the tree (``kill_tree``).

        On timeout, or when ``cancel(job_id)`` is called meanwhile, the command's
        whole process tree is killed (not only its first process). Output is
        capped per stream while it is read; a non-zero exit is a normal result.

        Raises:
            RuntimeFailure: CONTAINER_GONE, RUNTIME_UNAVAILABLE.
        """
        ...

    async def cancel(self, container_id: str, job_id: str) -> bool:
        """Kill the process tree of a running ``run`` call; False if it was not running."""
        ...

    async def kill_tree(self, container_id: str, pids: tuple[int, int]) -> bool:
        """Kill the process tree of a command another process started (its ``on_start``
        pids); False if it was not running any more."""
        ...

    async def kill_all(self, container_id: str) -> None:
        """Kill every process of the sandbox user in the container but its keep-alive
        (the dir slots' disk budget), from outside it: never through anything the
        sandbox can stop, such as its command executor; retried, and as the last
        resort the container restarted (the workspace stays).

        Raises:
            RuntimeFailure: CONTAINER_GONE, RUNTIME_UNAVAILABLE (the engine is away).
        """
        ...

    async def revive(self, container_ids: set[str]) -> Revival:
        """Start again those of ``container_ids`` that the engine holds stopped (an engine
        restart stops every container); which were started, and which the engine no
        longer has at all.

        Raises:
            RuntimeFailure: RUNTIME_UNAVAILABLE (the engine is still away).
        """
        ...

    async def stop(self, container_id: str) -> None:
        """Stop a container, keeping it (``revive`` starts it again, on fresh mounts)."""
        ...

    async def host_pids(self, container_id: str) -> list[int]:
        """The container's processes, as pids of the host the engine runs on.

        Raises:
            RuntimeFailure: CONTAINER_GONE (not running), RUNTIME_UNAVAILABLE.
        """
        ...

    async def remove(self, container_id: str) -> None:
        """Kill and remove a container; removing a missing one is not an error."""
        ...

    async def sweep(
        self, live_container_ids: set[str], live_processes: frozenset[str] = frozenset()
    ) -> int:
        """Remove every container with our label that is not in ``live_container_ids``.

        Helpers of clones still running in this process are spared, and so is what a
        process in ``live_processes`` created (an experiment it is still creating, a
        clone it runs).
        """
        ...

    async def clone(
        self,
        source: GitSource,
        workspace: Path,
        *,
        timeout_s: float = 300,
        sandbox_label: str = "",
        signin_label: str = "",
    ) -> ExecResult:
        """Clone ``source`` into the (empty) ``workspace`` folder.

        The clone runs in a short-lived, hardened helper container: the only
        container that ever gets network for it (and only for an ``https``
        URL on a server that allows git egress).

        The working tree lands in ``workspace`` with its ``.git`` (owned by the
        sandbox user); the helper is removed whatever happens. A clone that
        fails (no such ref, not a repository, unreachable) is a normal result
        with a non-zero exit code, and may leave files in ``workspace`` for the
        caller to clean; on timeout (or cancellation) the clone is killed.

        Args:
            source: Where from; checked before any container starts.
            workspace: An empty folder inside the caller's own slot (checked as
                for ``create``), writable by the sandbox user.
            timeout_s: Wall clock for the whole clone (clamped as for ``run``).
            sandbox_label: The sandbox the clone is for (as in ``ContainerSpec``): its
                helper counts against that sandbox's share of the containers.
            signin_label: Its sign-in address, hashed (as in ``ContainerSpec``): a remote
                URL's host is looked up within that sandbox's and that address's shares.

        Returns:
            The clone's exit code, capped output, duration and ``timed_out``.

        Raises:
            RuntimeFailure: GIT_SOURCE_REFUSED (a URL, ref or local path that may
                not be cloned), GIT_EGRESS_DISABLED (a remote URL on a server
                that allows no git egress), WORKSPACE_REFUSED (also when not
                empty), IMAGE_MISSING, CAPACITY_EXCEEDED, RUNTIME_UNAVAILABLE.
        """
        ...

    async def aclose(self) -> None:
        """Release the engine client; running containers are left running (a restart
        finds them again)."""
        ...
