"""This deployment's containers at the Docker engine: the client (opened once, when
first needed), what the engine offers (its version, the images it holds, the host's
CPUs, and whether it gives the isolation we rely on:
:func:`app.runtime.docker.hardening.engine_problem`), and creating, listing, starting again
(after an engine restart), sweeping and removing our containers.

A container is created (not started) with the host configuration of
:mod:`app.runtime.docker.hardening`, within its sandbox's share of the containers
(:mod:`app.runtime.docker.capacity`), with ``sleep infinity`` as its keep-alive; commands
run through ``docker exec`` (:mod:`app.runtime.exec.runner`).

Which containers are ours is a label: ``<prefix>.managed=<deployment>``; the sweep
and the container count never touch another deployment's. A container's sandbox is
its ``<prefix>.sandbox`` label, fixed at creation, unless it was claimed since (a
warm container handed over to a sandbox: :mod:`app.runtime.docker.handover`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import docker
import docker.errors
import structlog
from docker.types import Mount

from app.errors import ConfigurationError
from app.runtime.backend import WORKSPACE, Limits, Revival, RuntimeInfo
from app.runtime.docker.capacity import UNATTRIBUTED, ContainerLimiter, ContainerShares
from app.runtime.docker.cgroup_pids import CgroupPids
from app.runtime.docker.engine_errors import translate, translated
from app.runtime.docker.hardening import (
    TMP,
    engine_problem,
    hardened_host_config,
    refuse_docker_socket_in,
)
from app.runtime.docker.threads import Offload
from app.runtime.errors import ImageMissing, RuntimeFailure, RuntimeUnavailable
from pool.slots import SlotsRoot

log = structlog.get_logger(__name__)

_LABEL_PREFIX = re.compile(r"[a-z0-9]+([.-][a-z0-9]+)*")
_NAME_SAFE = re.compile(r"[A-Za-z0-9-]{1,64}")
# The name a warm container takes when handed over: it carries its new sandbox label.
HANDED_OVER = "smcp-handed-"
# The name of a sandbox's prepared container until it is handed over (renamed as above):
# the container shares do not count it, the warm budget does (app/runtime/warm/prepared.py).
PREPARED = "smcp-prepared-"


@dataclass(frozen=True)
class Labels:
    """The labels that say a container is this deployment's, and whose it is.

    Raises:
        ConfigurationError: a prefix or deployment id Docker labels cannot carry.
    """

    prefix: str  # e.g. io.sandbox-mcp
    deployment: str  # the value of the managed label
    process_id: str | None  # this server process (None: not recorded)

    def __post_init__(self) -> None:
        if not _LABEL_PREFIX.fullmatch(self.prefix):
            raise ConfigurationError("The label prefix must look like io.sandbox-mcp.")
        if not _NAME_SAFE.fullmatch(self.deployment):
            raise ConfigurationError("The deployment id must be 1-64 letters, digits or '-'.")

    def key(self, name: str) -> str:
        """The full name of our label ``name``: ``<prefix>.<name>``."""
        return f"{self.prefix}.{name}"

    @property
    def selector(self) -> str:
        """The engine's label filter for every container of this deployment."""
        return f"{self.key('managed')}={self.deployment}"

    def of_new(self, **more: str) -> dict[str, str]:
        """What a container made by this process is labelled: ours, its maker, ``more``
        (``<prefix>.<name>=<value>``)."""
        labels = {self.key("managed"): self.deployment}
        labels.update({self.key(name): value for name, value in more.items()})
        if self.process_id:
            labels[self.key("process")] = self.process_id
        return labels


class Engine:
    """The engine client of this deployment and the containers it holds for us.

    Args:
        client_factory: Builds the Docker client (called once, in a thread).
        offload: Where blocking SDK calls run.
        slots: Where the slots live (the engine check looks at their mount).
        shares: How many containers the server and each sandbox may hold.
        labels: Which containers are ours.
        user_ids: (uid, gid) every container process runs as (never root), as the
            settings parsed them (``RuntimeSettings.sandbox_ids``).
        home: The user's home in the images (a tmpfs, as the root is read-only).
        host_paths: (as this process sees it, as the engine sees it): bind-mount
            sources are the engine's paths, which differ when this server runs in a
            container (None: the same).
        dir_budget_bytes: The slots' measured byte budget when they have no kernel
            quota (dir slots; see ``hardened_host_config``), else None.

    Raises:
        ConfigurationError: a root user, a home that is not a folder of
            its own.
    """

    def __init__(
        self,
        *,
        client_factory: Callable[[], docker.DockerClient],
        offload: Offload,
        slots: SlotsRoot,
        shares: ContainerShares,
        labels: Labels,
        user_ids: tuple[int, int],
        home: str,
        host_paths: tuple[Path, Path] | None = None,
        dir_budget_bytes: int | None = None,
        cgroups: CgroupPids | None = None,
    ) -> None:
        if user_ids[0] == 0:
            raise ConfigurationError("The sandbox user must be uid:gid of a non-root user.")
        if not home.startswith("/") or home.rstrip("/") in ("", WORKSPACE, TMP):
            raise ConfigurationError("home must be an absolute path other than / and /tmp.")
        self._host_paths = host_paths
        self._dir_budget_bytes = dir_budget_bytes
        self._client_factory = client_factory
        self._offload = offload
        self._slots = slots
        self._containers = ContainerLimiter(shares, self._live)
        self.labels = labels
        self._uid, self._gid = user_ids
        self.user = f"{self._uid}:{self._gid}"  # as the engine API wants it
        self.home = home.rstrip("/")
        self._client: docker.DockerClient | None = None
        self._client_lock = anyio.Lock()
        self._host_cpus: float | None = None
        self.problem: str | None = None  # e.g. seccomp missing: no container is made
        # Containers whose sandbox is not the one their label names (labels are fixed at
        # creation): warm ones handed over to a sandbox (see app/runtime/warm/pool.py).
        self._claimed: dict[str, str] = {}
        self._cgroups = cgroups or CgroupPids()

    def path(self, path: Path) -> str:
        """``path`` as the Docker engine sees it (see ``host_paths``)."""
        if self._host_paths is None:
            return str(path)
        ours, engines = self._host_paths
        for base in (ours, ours.resolve()):
            if path.is_relative_to(base):
                return str(engines / path.relative_to(base))
        return str(path)

    def workspace_mount(self, workspace: Path) -> Mount:
        """``workspace`` (checked) bind-mounted read-write at /workspace."""
        return Mount(target=WORKSPACE, source=self.path(workspace), type="bind")

    async def api(self) -> docker.APIClient:
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    with translated():
                        self._client = await self._offload.call(self._client_factory)
        return self._client.api

    async def cpus(self, api: docker.APIClient) -> float | None:
        """The host's CPUs (None: unknown); the first call also checks the engine."""
        if self._host_cpus is None:
            with translated():
                info = await self._offload.call(api.info)
            ncpu = info.get("NCPU")
            self._host_cpus = float(ncpu) if isinstance(ncpu, int) and ncpu > 0 else None
            self.problem = await self._offload.call(engine_problem, info, self._slots.base)
        return self._host_cpus

    async def ours(self) -> list[dict[str, Any]]:
        """Every container of this deployment, running or not (as the engine lists them)."""
        api = await self.api()
        with translated():
            found: list[dict[str, Any]] = await self._offload.call(
                api.containers, all=True, filters={"label": self.labels.selector}
            )
        return found

    async def running(self) -> set[str]:
        """The ids of our containers that are running now."""
        api = await self.api()
        with translated():
            found = await self._offload.call(
                api.containers,
                quiet=True,
                filters={"label": self.labels.selector, "status": "running"},
            )
        return {c["Id"] for c in found}

    async def info(self, allowed: tuple[str, ...]) -> RuntimeInfo:
        """Reachability, version, which of the ``allowed`` images exist. Never raises."""
        try:
            api = await self.api()
            with translated():
                version = await self._offload.call(api.version)
                images = await self._offload.call(api.images)
        except RuntimeFailure as exc:
            reason = str(exc.details.get("reason") or exc.message)
            return RuntimeInfo(False, None, (), allowed, reason=reason)
        except Exception:  # the health check must answer whatever happened
            log.exception("runtime.info_failed")
            return RuntimeInfo(False, None, (), allowed, reason="unexpected error")
        tags = {tag for image in images for tag in (image.get("RepoTags") or ())}
        present = tuple(i for i in allowed if _tagged(i) in tags)
        missing = tuple(i for i in allowed if _tagged(i) not in tags)
        with contextlib.suppress(RuntimeFailure):
            await self.cpus(api)
        problem = self.problem
        return RuntimeInfo(problem is None, str(version.get("Version")), present, missing, problem)

    async def revive(self, container_ids: set[str]) -> Revival:
        """Start those of ``container_ids`` (prefixes) the engine holds stopped; which were
        started, and which it does not hold at all."""
        found = await self.ours()
        present = [c["Id"] for c in found]
        stopped = [c["Id"] for c in found if c.get("State") != "running"]
        revived = [c for c in stopped if any(c.startswith(i) for i in container_ids if i)]
        api = await self.api()
        for container_id in revived:
            with translated(container_id):
                # The same container, so exactly the hardening it was created with.
                await self._offload.call(api.start, container_id)
            log.info("runtime.revive", container_id=container_id[:12])
        missing = [i for i in container_ids if i and not any(c.startswith(i) for c in present)]
        return Revival(revived, missing)

    async def orphans(
        self, live: set[str], live_processes: frozenset[str]
    ) -> tuple[int, list[str]]:
        """How many containers are ours, and those of them that are no one's: not in
        ``live`` (id prefixes), and not made by a process in ``live_processes``."""
        found = await self.ours()
        process = self.labels.key("process")
        orphans = [
            c["Id"]
            for c in found
            if not any(c["Id"].startswith(i) for i in live)
            and (c.get("Labels") or {}).get(process) not in live_processes
        ]
        return len(found), orphans

    def claim(self, container_id: str, sandbox_label: str) -> None:
        """Count ``container_id`` in ``sandbox_label``'s share from now on (whatever its label)."""
        self._claimed[container_id] = sandbox_label

    def admitted(
        self, sandbox: str, name: str, *, admit: bool = True
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """A place in ``sandbox``'s share for the container ``name`` while it is made
        (or handed over); ``admit=False``: none asked for.

        Raises:
            LimitReached, CapacityExceeded: see ``ContainerLimiter.admit``.
        """
        return self._containers.admit(sandbox, name) if admit else contextlib.nullcontext()

    async def prepared(self, *, sandbox_label: str | None = None, mine: bool = False) -> list[str]:
        """The ids of the prepared containers not handed over yet (any process's, or this
        process's only), of one sandbox or of all."""
        filters = [self.labels.selector, f"{self.labels.key('prepared')}=1"]
        if sandbox_label is not None:
            filters.append(f"{self.labels.key('sandbox')}={sandbox_label}")
        if mine and self.labels.process_id:
            filters.append(f"{self.labels.key('process')}={self.labels.process_id}")
        api = await self.api()
        with translated():
            found = await self._offload.call(api.containers, all=True, filters={"label": filters})
        # Labels are fixed at creation: a handed-over one keeps its label, not its name.
        return [
            c["Id"] for c in found if (c.get("Names") or [""])[0].lstrip("/").startswith(PREPARED)
        ]

    async def create(
        self,
        api: docker.APIClient,
        image: str,
        name: str,
        labels: dict[str, str],
        mounts: list[Mount],
        network_mode: str,
        limits: Limits,
        env: Mapping[str, str],
        sandbox: str,
        *,
        admit: bool = True,
    ) -> str:
        """Create (not start) a hardened container within ``sandbox``'s share; its id.

        ``admit=False``: outside the shares (a prepared container, named ``PREPARED...``:
        its own budget bounds it, and it is admitted when handed over)."""
        await self.cpus(api)
        if self.problem is not None:
            raise RuntimeUnavailable(self.problem)
        host_config = hardened_host_config(
            api,
            mounts=mounts,
            network_mode=network_mode,
            limits=limits,
            home=self.home,
            uid=self._uid,
            gid=self._gid,
            dir_budget_bytes=self._dir_budget_bytes,
        )
        # Defence in depth: whatever the code above became, never the engine's socket.
        await self._offload.call(refuse_docker_socket_in, host_config)
        async with self.admitted(sandbox, name, admit=admit):
            with translated():
                try:
                    created = await self._offload.call(
                        api.create_container,
                        image,
                        entrypoint=["sleep", "infinity"],
                        user=self.user,
                        environment={**env, "HOME": self.home},
                        working_dir=WORKSPACE,
                        hostname="sandbox",
                        labels=labels,
                        name=name,
                        host_config=host_config,
                    )
                except docker.errors.ImageNotFound as exc:
                    raise ImageMissing(image) from exc
        container_id: str = created["Id"]
        return container_id

    async def delete(self, container_id: str) -> None:
        """Kill and remove a container; a missing one, or one being removed, is no error."""
        self._claimed.pop(container_id, None)
        self._cgroups.forget(container_id)
        api = await self.api()
        try:
            await self._offload.call(api.remove_container, container_id, v=True, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if not (exc.status_code == 409 and "in progress" in str(exc)):
                raise translate(exc, container_id) from exc
        except Exception as exc:
            raise translate(exc, container_id) from exc

    async def aclose(self) -> None:
        """Close the client; containers are left to the next sweep."""
        if self._client is not None:
            client, self._client = self._client, None
            await self._offload.call(client.close)

    async def stop(self, container_id: str) -> None:
        """Stop a container (its processes' work is lost anyway: a short grace)."""
        api = await self.api()
        with translated(container_id):
            await self._offload.call(api.stop, container_id, timeout=2)

    async def host_pids(self, container_id: str) -> list[int]:
        """The container's processes, as pids of the engine's host: read from its cgroup
        where this process can (:mod:`app.runtime.docker.cgroup_pids`), else ``docker top``."""
        found = self._cgroups.pids(container_id)
        if found is not None:
            return found
        api = await self.api()
        if not self._cgroups.tried(container_id):
            with translated(container_id):
                state = (await self._offload.call(api.inspect_container, container_id))["State"]
            if state.get("Running") and state.get("Pid"):
                self._cgroups.learn(container_id, int(state["Pid"]))
                found = self._cgroups.pids(container_id)
                if found is not None:
                    return found
        with translated(container_id):
            top = await self._offload.call(api.top, container_id, ps_args="-eo pid")
        return [int(row[0]) for row in top.get("Processes") or [] if row and row[0].isdigit()]

    async def rename(self, container_id: str, name: str) -> None:
        api = await self.api()
        with translated(container_id):
            await self._offload.call(api.rename, container_id, name)

    async def _live(self) -> dict[str, str]:
        """Our containers at the engine (server-wide): the sandbox of each, by name."""
        live = {}
        for c in await self.ours():
            name = (c.get("Names") or [c["Id"]])[0].lstrip("/")
            if name.startswith(PREPARED):
                continue  # the warm budget's, until handed over (and admitted then)
            label = (c.get("Labels") or {}).get(self.labels.key("sandbox"), UNATTRIBUTED)
            if name.startswith(HANDED_OVER):  # a warm one, handed over by any process
                label = name.removeprefix(HANDED_OVER).rsplit("-", 1)[0]
            live[name] = self._claimed.get(c["Id"], label)
        return live


def _tagged(image: str) -> str:
    name = image.rsplit("/", 1)[-1]
    return image if ":" in name else f"{image}:latest"
