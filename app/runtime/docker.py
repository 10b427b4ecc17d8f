"""DockerBackend: the SandboxBackend on the Docker Engine API, the façade of the runtime.

What an auditor wants lives in a module of its own: the host configuration every
container gets and the engine checks in :mod:`app.runtime.hardening`, commands and
their kills in :mod:`app.runtime._exec`, the fair container shares in
:mod:`app.runtime._capacity`, git's egress in :mod:`app.runtime.git_egress`, and
what a clone does in :mod:`app.runtime._git`; Docker and ``requests`` errors become
:mod:`app.runtime.errors` in :mod:`app.runtime._engine_errors`.

This module is longer than the others (about 570 lines) for a reason: it is the one
place that holds the engine client, the labels of this deployment and the helpers
in flight, which every operation here needs; each method is short and delegates.

An experiment container's keep-alive is ``sleep infinity``; commands run through
its executor (:mod:`app.runtime.fast_exec`) or, as its fallback, ``docker exec``.
``clone`` runs ``git clone`` in a helper container with the same hardening and
modest fixed limits, labelled ``<prefix>.role=git-clone`` and removed when the
clone ends, however it ends. Its mounts are the (empty) workspace,
read-write, and, for a local repository, that repository read-only (and not
recursively) at ``/source``. It is the only container that may get network for a
clone, and only for an ``https`` URL on a server built with ``allow_git_egress``,
whose host resolved to public addresses only: then it joins a network of its own
(never the default bridge) and git is pinned to the checked address.

Blocking SDK calls go through :class:`~app.runtime._threads.Offload`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import docker
import docker.errors
import structlog
from docker.types import Mount

if TYPE_CHECKING:
    pass

from app.errors import ConfigurationError, InvalidArgument
from app.runtime._capacity import (
    UNATTRIBUTED,
    ContainerLimiter,
    ContainerShares,
    output_streams,
)
from app.runtime._engine_errors import translate, translated
from app.runtime._exec import Executor, OnStart
from app.runtime._git import SOURCE, clone_env, clone_script, plan_clone, require_empty
from app.runtime._jobs import (
    JOB_ID,
)
from app.runtime._threads import Offload
from app.runtime._workspace import check_workspace
from app.runtime.backend import (
    WORKSPACE,
    Container,
    ContainerSpec,
    ExecResult,
    GitSource,
    Isolation,
    Limits,
    NetworkMode,
    Revival,
    RuntimeInfo,
)
from app.runtime.egress_proxy import EgressProxy
from app.runtime.errors import (
    EgressDisabled,
    GitEgressDisabled,
    ImageMissing,
    ImageNotAllowed,
    RestrictedUnavailable,
    RuntimeFailure,
    RuntimeUnavailable,
)
from app.runtime.fast_exec import ExecPath, Executors
from app.runtime.git_egress import GIT_NETWORK, ensure_network, pin_remote, tenant_error
from app.runtime.hardening import (
    CAPABILITIES,
    TMP,
    engine_problem,
    hardened_host_config,
    refuse_docker_socket_in,
)
from app.runtime.limits import Ceilings, clamp_limits, clamp_timeout
from auth.safe_fetch import AddressPolicy, Resolver, is_public_address, system_resolver
from pool.slots import SlotsRoot

__all__ = [
    "CAPABILITIES",
    "DEFAULT_DOCKER_URL",
    "GIT_LIMITS",
    "WORKSPACE",
    "Ceilings",
    "DockerBackend",
    "output_streams",
]

log = structlog.get_logger(__name__)

DEFAULT_DOCKER_URL: Final = "unix:///var/run/docker.sock"
# A clone helper's limits (clamped to the ceilings like an experiment's).
GIT_LIMITS: Final = Limits(cpus=1.0, memory_mb=1024, pids=256, tmp_mb=256)
GIT_ROLE: Final = "git-clone"

# Generic only in the type stubs.
_USER = re.compile(r"([0-9]+):([0-9]+)")
_LABEL_PREFIX = re.compile(r"[a-z0-9]+([.-][a-z0-9]+)*")
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")
_NAME_SAFE = re.compile(r"[A-Za-z0-9-]{1,64}")


def _default_client() -> docker.DockerClient:
    return docker.DockerClient(base_url=DEFAULT_DOCKER_URL, timeout=60)


class DockerBackend:
    """Hardened, throwaway experiment containers on a local Docker engine.

    Args:
        slots: Where the slots live (the slot store); a workspace must lie below its base.
        allowed_images: The images experiments may use (never pulled).
        default_image: Used when a spec names no image; must be allowed.
        ceilings: The most one experiment may get; requests above are clamped.
        max_containers: Live containers with our label, server-wide.
        pool_size: Sandboxes promised their first container out of ``max_containers``
            (see :mod:`app.runtime._capacity`); 0: none.
        max_containers_per_sandbox: The most one sandbox may hold (None: no cap).
        user: ``uid:gid`` every container process runs as (never root).
        home: The user's home in the images (a tmpfs, as the root is read-only).
        allow_egress: Whether ``network="egress"`` is honoured (else refused).
        egress_network: The Docker network egress containers join.
        git_network: The network of its own remote clone helpers join (created when
            missing, without inter-container traffic); never the default bridge.
        resolve: How a remote clone's host is resolved before it is checked and pinned.
        git_address_policy: Which addresses a remote clone may reach (public only).
        allow_git_egress: Whether ``clone`` may fetch an ``https`` URL (else refused).
        git_image: The image clone helpers run (it needs git); must be allowed.
            Defaults to ``default_image``.
        label_prefix: Prefix of our labels (``<prefix>.managed=<deployment>`` etc.).
        deployment: Which deployment's containers are ours (the value of the managed
            label): the sweep and the container count never touch another's.
        process_id: This server process (``<prefix>.process`` on what it creates): the
            sweep spares what a live process is still creating or cloning.
        client_factory: Builds the Docker client (called once, in a thread).
        max_calls: Concurrent blocking SDK calls.
        max_streams: Concurrent command output streams.
        kill_grace_s: After a kill, how long output may take to end before the
            stream is closed on our side.
        egress_proxy: The proxy of network ``restricted`` (None: the mode is refused);
            remote clones go through it too.
        exec_path: ``auto``: commands go through each container's executor when it is
            ready (:mod:`app.runtime.fast_exec`), else ``docker exec``;
            ``docker-exec``: always ``docker exec``.
    """

    def __init__(
        self,
        *,
        slots: SlotsRoot,
        allowed_images: tuple[str, ...],
        host_paths: tuple[Path, Path] | None = None,
        default_image: str | None = None,
        ceilings: Ceilings | None = None,
        max_containers: int = 300,
        pool_size: int = 0,
        max_containers_per_sandbox: int | None = None,
        user: str = "1000:1000",
        home: str = "/home/sandbox",
        allow_egress: bool = False,
        egress_network: str = "bridge",
        allow_git_egress: bool = False,
        git_network: str = GIT_NETWORK,
        resolve: Resolver = system_resolver,
        git_address_policy: AddressPolicy = is_public_address,
        git_image: str | None = None,
        label_prefix: str = "io.sandbox-mcp",
        deployment: str = "1",
        process_id: str | None = None,
        client_factory: Callable[[], docker.DockerClient] | None = None,
        max_calls: int = 16,
        max_streams: int = 512,
        kill_grace_s: float = 15.0,
        egress_proxy: EgressProxy | None = None,
        exec_path: ExecPath = "auto",
    ) -> None:
        if not allowed_images:
            raise ConfigurationError("At least one image must be allowed.")
        if default_image is not None and default_image not in allowed_images:
            raise ConfigurationError("The default image must be one of the allowed images.")
        if git_image is not None and git_image not in allowed_images:
            raise ConfigurationError("The git image must be one of the allowed images.")
        match = _USER.fullmatch(user)
        if match is None or int(match.group(1)) == 0:
            raise ConfigurationError("The sandbox user must be uid:gid of a non-root user.")
        if not _LABEL_PREFIX.fullmatch(label_prefix):
            raise ConfigurationError("The label prefix must look like io.sandbox-mcp.")
        if not _NAME_SAFE.fullmatch(deployment):
            raise ConfigurationError("The deployment id must be 1-64 letters, digits or '-'.")
        if not home.startswith("/") or home.rstrip("/") in ("", WORKSPACE, TMP):
            raise ConfigurationError("home must be an absolute path other than / and /tmp.")
        self._slots = slots
        # (as this process sees it, as the Docker engine sees it): bind-mount sources
        # are the engine's paths, which differ when this server runs in a container.
        self._host_paths = host_paths
        self._allowed = allowed_images
        self._default_image = default_image or allowed_images[0]
        self._ceilings = ceilings or Ceilings()
        self._containers = ContainerLimiter(
            ContainerShares(max_containers, pool_size, max_containers_per_sandbox)
        )
        self._user = user
        self._uid, self._gid = int(match.group(1)), int(match.group(2))
        self._home = home.rstrip("/")
        self._allow_egress = allow_egress
        self._egress_network = egress_network
        self._allow_git_egress = allow_git_egress
        self._git_network_name = git_network
        self._git_network_ready = False
        self._resolve = resolve
        self._git_address_policy = git_address_policy
        self._git_image = git_image or self._default_image
        self._prefix = label_prefix
        self._managed = f"{label_prefix}.managed"
        self._deployment = deployment
        self._process = f"{label_prefix}.process"
        self._owner = {self._process: process_id} if process_id else {}
        self._client_factory = client_factory or _default_client
        self._offload = Offload(calls=max_calls, streams=max_streams)
        self.exec_path = exec_path
        fast = Executors(api=self._api, offload=self._offload, user=user)
        self._exec = Executor(
            api=self._api,
            offload=self._offload,
            user=user,
            kill_grace_s=kill_grace_s,
            fast=fast if exec_path == "auto" else None,
        )
        self._client: docker.DockerClient | None = None
        self._client_lock = anyio.Lock()
        self._host_cpus: float | None = None
        self._engine_problem: str | None = None  # seccomp missing: no container is made
        self._helpers: set[str] = set()  # clone helpers running in this process
        self._egress = egress_proxy  # network "restricted" (None: not offered)
        # Containers whose sandbox is not the one their label names (labels are fixed at
        # creation): warm ones handed over to a sandbox (see app/runtime/warm.py).
        self._claimed: dict[str, str] = {}

    def _engine_path(self, path: Path) -> str:
        """``path`` as the Docker engine sees it (see ``host_paths``)."""
        if self._host_paths is None:
            return str(path)
        ours, engines = self._host_paths
        for base in (ours, ours.resolve()):
            if path.is_relative_to(base):
                return str(engines / path.relative_to(base))
        return str(path)

    # -- seam ------------------------------------------------------------------------

    async def info(self) -> RuntimeInfo:
        try:
            api = await self._api()
            with translated():
                version = await self._offload.call(api.version)
                images = await self._offload.call(api.images)
        except RuntimeFailure as exc:
            reason = str(exc.details.get("reason") or exc.message)
            return RuntimeInfo(False, None, (), self._allowed, reason=reason)
        except Exception:  # the health check must answer whatever happened
            log.exception("runtime.info_failed")
            return RuntimeInfo(False, None, (), self._allowed, reason="unexpected error")
        tags = {tag for image in images for tag in (image.get("RepoTags") or ())}
        present = tuple(i for i in self._allowed if _tagged(i) in tags)
        missing = tuple(i for i in self._allowed if _tagged(i) not in tags)
        with contextlib.suppress(RuntimeFailure):
            await self._cpus(api)
        return RuntimeInfo(
            self._engine_problem is None,
            str(version.get("Version")),
            present,
            missing,
            reason=self._engine_problem,
        )

    async def create(self, spec: ContainerSpec) -> Container:
        started = time.monotonic()
        image = spec.image or self._default_image
        if image not in self._allowed:
            raise ImageNotAllowed(image, self._allowed)
        network_mode = self._network_mode(spec.network)
        workspace = await self._offload.call(check_workspace, spec.workspace, self._slots.base)
        api = await self._api()
        limits, warnings = clamp_limits(spec.limits, self._ceilings, await self._cpus(api))
        mounts = [Mount(target=WORKSPACE, source=self._engine_path(workspace), type="bind")]
        labels = {
            self._managed: self._deployment,
            f"{self._prefix}.experiment": spec.experiment_id,
            f"{self._prefix}.sandbox": spec.sandbox_label,
            **self._owner,
        }
        name = f"smcp-{_NAME_UNSAFE.sub('-', spec.experiment_id)[:40]}-{secrets.token_hex(4)}"
        env: Mapping[str, str] = spec.env
        allowlist: tuple[str, ...] = ()
        if spec.network == "restricted":
            restricted = self._restricted().plan(spec.egress_allowlist)
            env, allowlist = {**spec.env, **restricted.env}, restricted.allowlist
            labels.update(restricted.labels)
            warnings = (*warnings, *restricted.warnings)
        container_id = await self._create_container(
            api, image, name, labels, mounts, network_mode, limits, env, spec.sandbox_label
        )
        try:
            with translated(container_id):
                await self._offload.call(api.start, container_id)
            if spec.network == "restricted":
                await self._restricted().attach(api, container_id)
            self._exec.prepare(container_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._remove_quietly(container_id)
            raise
        isolation = Isolation(
            image=image,
            user=self._user,
            network=spec.network,
            cpus=limits.cpus,
            memory_mb=limits.memory_mb,
            pids=limits.pids,
            tmp_mb=limits.tmp_mb,
            capabilities=CAPABILITIES,
            no_new_privileges=True,
            read_only_mounts=("/",),
            writable_mounts=(WORKSPACE, TMP, self._home),
            egress_allowlist=allowlist,
        )
        log.info(
            "runtime.create",
            container_id=container_id[:12],
            experiment_id=spec.experiment_id,
            image=image,
            network=spec.network,
            warnings=len(warnings),
            ms=round((time.monotonic() - started) * 1000),
        )
        return Container(container_id, isolation, warnings)

    async def run(
        self,
        container_id: str,
        command: str,
        *,
        timeout_s: float,
        job_id: str,
        max_output_bytes: int = 1_048_576,
        env: dict[str, str] | None = None,
        on_start: OnStart | None = None,
    ) -> ExecResult:
        if not JOB_ID.fullmatch(job_id):
            raise InvalidArgument(
                "job_id must be 1-128 letters, digits, '_', '.', ':' or '-'.", field="job_id"
            )
        if max_output_bytes < 0:
            raise InvalidArgument(
                "max_output_bytes must not be negative.", field="max_output_bytes"
            )
        # The manager clamped already and told the agent; this bound holds for any caller.
        timeout, _ = clamp_timeout(timeout_s, self._ceilings.timeout_s)
        result = await self._exec.run(
            container_id,
            command,
            timeout_s=timeout,
            job_id=job_id,
            max_output_bytes=max_output_bytes,
            env=env,
            on_start=on_start,
        )
        # What the proxy refused meanwhile reaches the agent with this result.
        notice = await self._egress.take_notice(container_id) if self._egress else None
        return dataclasses.replace(result, stderr=result.stderr + notice) if notice else result

    async def cancel(self, container_id: str, job_id: str) -> bool:
        return await self._exec.cancel(container_id, job_id)

    async def kill_tree(self, container_id: str, pids: tuple[int, int]) -> bool:
        return await self._exec.kill_tree(container_id, pids)

    async def fast_exec_ready(self, container_id: str) -> bool:
        """Wait until the container's executor is ready (tests, benchmarks); False if
        its commands go through docker exec."""
        return await self._exec.fast_ready(container_id)

    @property
    def exec_runs(self) -> Mapping[str, int]:
        """Commands run so far, by path ("fast", "docker-exec")."""
        return self._exec.runs

    async def revive(self, container_ids: set[str]) -> Revival:
        api = await self._api()
        with translated():
            found = await self._offload.call(
                api.containers,
                all=True,
                filters={"label": f"{self._managed}={self._deployment}"},
            )
        present = [c["Id"] for c in found]
        stopped = [c["Id"] for c in found if c.get("State") != "running"]
        revived = [c for c in stopped if any(c.startswith(i) for i in container_ids if i)]
        for container_id in revived:
            with translated(container_id):
                # The same container, so exactly the hardening it was created with.
                await self._offload.call(api.start, container_id)
            log.info("runtime.revive", container_id=container_id[:12])
        missing = [i for i in container_ids if i and not any(c.startswith(i) for c in present)]
        return Revival(revived, missing)

    async def remove(self, container_id: str) -> None:
        self._claimed.pop(container_id, None)
        self._exec.forget(container_id)
        api = await self._api()
        try:
            await self._offload.call(api.remove_container, container_id, v=True, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if not (exc.status_code == 409 and "in progress" in str(exc)):
                raise translate(exc, container_id) from exc
        except Exception as exc:
            raise translate(exc, container_id) from exc
        if self._egress is not None:
            await self._egress.detach(container_id)
        log.info("runtime.remove", container_id=container_id[:12])

    async def running(self) -> set[str]:
        """The ids of our containers that are running now."""
        api = await self._api()
        with translated():
            found = await self._offload.call(
                api.containers,
                quiet=True,
                filters={"label": f"{self._managed}={self._deployment}", "status": "running"},
            )
        return {c["Id"] for c in found}

    def claim(self, container_id: str, sandbox_label: str) -> None:
        """Count ``container_id`` in ``sandbox_label``'s share from now on (whatever its label)."""
        self._claimed[container_id] = sandbox_label

    async def hand_over(self, warm: Container, spec: ContainerSpec) -> Container | None:
        """Make the running (warm) container ``warm`` the one ``spec`` asks for, or None
        when it cannot be: another image, network or environment, or another /tmp size
        (fixed at creation). CPU, memory and pids limits are updated in place."""
        image = spec.image or self._default_image
        given = warm.isolation
        if image != given.image or spec.network != given.network or spec.env:
            return None
        api = await self._api()
        limits, warnings = clamp_limits(spec.limits, self._ceilings, await self._cpus(api))
        if limits.tmp_mb != given.tmp_mb:
            return None
        update = (limits.cpus, limits.memory_mb, limits.pids) != (
            given.cpus,
            given.memory_mb,
            given.pids,
        )
        if update:
            with translated(warm.container_id):
                await self._offload.call(_update_limits, api, warm.container_id, limits)
        self.claim(warm.container_id, spec.sandbox_label)
        isolation = dataclasses.replace(
            given, cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids
        )
        log.info("runtime.hand_over", container_id=warm.container_id[:12], updated=update)
        return Container(warm.container_id, isolation, warnings)

    async def sweep(
        self, live_container_ids: set[str], live_processes: frozenset[str] = frozenset()
    ) -> int:
        api = await self._api()
        await self._cpus(api)  # at start-up: says at once if seccomp is off
        with translated():
            found = await self._offload.call(
                api.containers,
                all=True,
                filters={"label": f"{self._managed}={self._deployment}"},
            )
        live = {c for c in live_container_ids if len(c) >= 12} | self._helpers
        orphans = [
            c["Id"]
            for c in found
            if not any(c["Id"].startswith(i) for i in live)
            and (c.get("Labels") or {}).get(self._process) not in live_processes
        ]
        for container_id in orphans:
            await self.remove(container_id)
        log.info("runtime.sweep", found=len(found), removed=len(orphans))
        return len(orphans)

    async def clone(
        self,
        source: GitSource,
        workspace: Path,
        *,
        timeout_s: float = 300,
        sandbox_label: str = UNATTRIBUTED,
    ) -> ExecResult:
        started = time.monotonic()
        plan = await self._offload.call(plan_clone, source, self._slots.base)
        env, extra_labels = clone_env(plan), {}
        if plan.local_source is not None:
            network_mode = "none"
        elif self._egress is not None:
            # Through the proxy, with its rules (the server's list): it resolves and checks.
            restricted = self._egress.plan(None)
            network_mode, extra_labels = restricted.network, restricted.labels
            env = {**env, **restricted.env}
        elif self._allow_git_egress:
            plan = dataclasses.replace(plan, pin=await self._pin(plan.url))
            network_mode = await self._git_network(await self._api())
        else:
            raise GitEgressDisabled()
        real_workspace = await self._offload.call(check_workspace, workspace, self._slots.base)
        await self._offload.call(require_empty, real_workspace)
        api = await self._api()
        limits, _ = clamp_limits(GIT_LIMITS, self._ceilings, await self._cpus(api))
        mounts = [Mount(target=WORKSPACE, source=self._engine_path(real_workspace), type="bind")]
        if plan.local_source is not None:
            source_mount = Mount(
                target=SOURCE, source=str(plan.local_source), type="bind", read_only=True
            )
            # Read-only applies to the bind itself only (Docker < 25): a mount
            # below the repository would stay writable, so none is carried over.
            source_mount["BindOptions"] = {"NonRecursive": True}
            mounts.append(source_mount)
        labels = {
            self._managed: self._deployment,
            f"{self._prefix}.role": GIT_ROLE,
            **self._owner,
        }
        if sandbox_label:
            labels[f"{self._prefix}.sandbox"] = sandbox_label  # its sandbox's share pays
        labels.update(extra_labels)
        name = f"smcp-git-clone-{secrets.token_hex(6)}"
        container_id = await self._create_container(
            api,
            self._git_image,
            name,
            labels,
            mounts,
            network_mode,
            limits,
            env,
            sandbox_label,
        )
        self._helpers.add(container_id)
        self._exec.docker_exec_only(container_id)
        try:
            with translated(container_id):
                await self._offload.call(api.start, container_id)
            if extra_labels and self._egress is not None:
                await self._egress.attach(api, container_id)
            result = await self.run(
                container_id, clone_script(plan), timeout_s=timeout_s, job_id=GIT_ROLE
            )
        finally:
            with anyio.CancelScope(shield=True):
                await self._remove_quietly(container_id)
            self._helpers.discard(container_id)
        # The whole clone, helper start and removal included: what the caller waited.
        result = dataclasses.replace(result, duration_s=round(time.monotonic() - started, 3))
        if plan.local_source is None and result.exit_code != 0:
            log.info("runtime.clone_failed", stderr=result.stderr[-2000:])  # the operator's
            refused = result.stderr.partition("\n[sandbox-mcp] ")[2]  # the proxy's notice
            shown = tenant_error(result.stderr) + (f"\n[sandbox-mcp] {refused}" if refused else "")
            result = dataclasses.replace(result, stdout="", stderr=shown)
        log.info(
            "runtime.clone",
            container_id=container_id[:12],
            source="local" if plan.local_source is not None else "https",
            ref=plan.ref,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            ms=round(result.duration_s * 1000),
        )
        return result

    async def aclose(self) -> None:
        """Close the Docker client (at shutdown); containers are left to the next sweep."""
        await self._exec.aclose()
        if self._client is not None:
            client, self._client = self._client, None
            await self._offload.call(client.close)

    # -- helpers ---------------------------------------------------------------------

    async def _api(self) -> docker.APIClient:
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    with translated():
                        self._client = await self._offload.call(self._client_factory)
        return self._client.api

    async def _pin(self, url: str) -> str:
        return await pin_remote(url, resolve=self._resolve, allow=self._git_address_policy)

    async def _git_network(self, api: docker.APIClient) -> str:
        if not self._git_network_ready:
            with translated():
                await self._offload.call(
                    ensure_network, api, self._git_network_name, {self._managed: "git"}
                )
            self._git_network_ready = True
        return self._git_network_name

    async def _cpus(self, api: docker.APIClient) -> float | None:
        if self._host_cpus is None:
            with translated():
                info = await self._offload.call(api.info)
            ncpu = info.get("NCPU")
            self._host_cpus = float(ncpu) if isinstance(ncpu, int) and ncpu > 0 else None
            self._engine_problem = await self._offload.call(engine_problem, info, self._slots.base)
        return self._host_cpus

    async def _create_container(
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
    ) -> str:
        """Create (not start) a hardened container within ``sandbox``'s share; its id."""
        await self._cpus(api)
        if self._engine_problem is not None:
            raise RuntimeUnavailable(self._engine_problem)
        host_config = hardened_host_config(
            api,
            mounts=mounts,
            network_mode=network_mode,
            limits=limits,
            home=self._home,
            uid=self._uid,
            gid=self._gid,
        )
        # Defence in depth: whatever the code above became, never the engine's socket.
        await self._offload.call(refuse_docker_socket_in, host_config)
        async with self._containers.admit(sandbox, name, functools.partial(self._live, api)):
            with translated():
                try:
                    created = await self._offload.call(
                        api.create_container,
                        image,
                        entrypoint=["sleep", "infinity"],
                        user=self._user,
                        environment={**env, "HOME": self._home},
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

    def _network_mode(self, network: NetworkMode) -> str:
        if network == "none":
            return "none"
        if network == "egress" and self._allow_egress:
            return self._egress_network
        if network == "egress":
            raise EgressDisabled()
        if network == "restricted":
            return self._restricted().network
        raise InvalidArgument("network must be 'none', 'egress' or 'restricted'.", field="network")

    def _restricted(self) -> EgressProxy:
        if self._egress is None:
            raise RestrictedUnavailable()
        return self._egress

    async def _live(self, api: docker.APIClient) -> dict[str, str]:
        """Our containers at the engine (server-wide): the sandbox label of each, by name."""
        with translated():
            found = await self._offload.call(
                api.containers, all=True, filters={"label": f"{self._managed}={self._deployment}"}
            )
        sandbox = f"{self._prefix}.sandbox"
        return {
            (c.get("Names") or [c["Id"]])[0].lstrip("/"): self._claimed.get(
                c["Id"], (c.get("Labels") or {}).get(sandbox, UNATTRIBUTED)
            )
            for c in found
        }

    async def _remove_quietly(self, container_id: str) -> None:
        try:
            await self.remove(container_id)
        except RuntimeFailure:
            log.warning("runtime.remove_failed", container_id=container_id[:12], exc_info=True)


def _update_limits(api: docker.APIClient, container_id: str, limits: Limits) -> None:
    # The SDK's update_container knows neither NanoCpus nor PidsLimit; the engine does.
    memory = limits.memory_mb * 1024 * 1024
    body = {
        "NanoCpus": round(limits.cpus * 1e9),
        "Memory": memory,
        "MemorySwap": memory,
        "PidsLimit": limits.pids,
    }
    raw: Any = api  # the SDK has no public call for these two fields
    raw._raise_for_status(
        raw._post_json(raw._url("/containers/{0}/update", container_id), data=body)
    )


def _tagged(image: str) -> str:
    name = image.rsplit("/", 1)[-1]
    return image if ":" in name else f"{image}:latest"
