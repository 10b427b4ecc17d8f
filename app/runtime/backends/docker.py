"""DockerBackend: the SandboxBackend on the Docker Engine API, the façade of the runtime.

Each method is short and delegates; what an auditor wants lives in a module of its
own: the host configuration every container gets and the engine checks in
:mod:`app.runtime.docker.hardening`; the engine client and creating, listing and removing
our containers in :mod:`app.runtime.docker.engine`; which network a container joins (and
the restricted proxy's part in it) in :mod:`app.runtime.docker.network`; commands and
their kills in :mod:`app.runtime.exec.runner`; the fair container shares in
:mod:`app.runtime.docker.capacity`; handing a warm container over in
:mod:`app.runtime.docker.handover`; the clone helper in :mod:`app.runtime.git.clone`, what
git runs in :mod:`app.runtime.git.sources`, which network it joins in
:mod:`app.runtime.git.network` and where it may connect in :mod:`app.runtime.git.egress`.
Docker and ``requests`` errors become :mod:`app.runtime.errors` in
:mod:`app.runtime.docker.engine_errors`. It composes the engine (``docker/``), commands
(``exec/``) and clones (``git/``), so it lives above the three, which never import it.

An experiment container's keep-alive is ``sleep infinity``; commands run through
its executor (:mod:`app.runtime.exec.protocol`) or, as its fallback, ``docker exec``.
``clone`` runs ``git clone`` in a helper container with the same hardening and
modest fixed limits, removed when the clone ends, however it ends (its commands
always go through ``docker exec``).

Blocking SDK calls go through :class:`~app.runtime.docker.threads.Offload`.

About 350 lines: the constructor takes, checks and documents every runtime option
the composition root passes, and wires the parts above (about half the module);
each seam method then delegates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import docker
import structlog

from app.egress.proxy import SIGNIN_LABEL, EgressProxy
from app.errors import ConfigurationError, InvalidArgument
from app.runtime.backend import (
    WORKSPACE,
    Container,
    ContainerSpec,
    ExecResult,
    GitSource,
    Revival,
    RuntimeInfo,
)
from app.runtime.docker.capacity import UNATTRIBUTED, ContainerShares, output_streams
from app.runtime.docker.creates import CreateGate
from app.runtime.docker.engine import PREPARED, Engine, Labels
from app.runtime.docker.engine_errors import translated
from app.runtime.docker.handover import hand_over
from app.runtime.docker.hardening import CAPABILITIES, applied_isolation
from app.runtime.docker.network import Networks
from app.runtime.docker.threads import Offload
from app.runtime.docker.workspace import check_workspace
from app.runtime.errors import ImageNotAllowed, RuntimeFailure
from app.runtime.exec.process_tree import JOB_ID
from app.runtime.exec.protocol import ExecPath
from app.runtime.exec.runner import ExecRunner, OnStart
from app.runtime.exec.sessions import Executors
from app.runtime.git.clone import GIT_LIMITS, GIT_ROLE, Cloner
from app.runtime.git.egress import GIT_NETWORK, clone_resolver
from app.runtime.git.network import CloneNetwork
from app.runtime.limits import Ceilings, clamp_limits, clamp_timeout
from jail.addresses import AddressPolicy, Resolver, is_public_address
from pool.slots import SlotsRoot

__all__ = [
    "CAPABILITIES",
    "GIT_LIMITS",
    "WORKSPACE",
    "Ceilings",
    "DockerBackend",
    "output_streams",
]

log = structlog.get_logger(__name__)

_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")


class DockerBackend:
    """Hardened, throwaway experiment containers on a local Docker engine.

    Args:
        slots: Where the slots live (the slot store); a workspace must lie below its base.
        allowed_images: The images experiments may use (never pulled).
        default_image: Used when a spec names no image; must be allowed.
        ceilings: The most one experiment may get; requests above are clamped.
        max_containers: Live containers with our label, server-wide.
        pool_size: Sandboxes promised their first container out of ``max_containers``
            (see :mod:`app.runtime.docker.capacity`); 0: none.
        max_containers_per_sandbox: The most one sandbox may hold (None: no cap).
        user_ids: (uid, gid) every container process runs as (never root), as the
            settings parsed them (``RuntimeSettings.sandbox_ids``).
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
        max_creates: Container creations (create + start) sent to the engine at once;
            more wait their turn in arrival order, so a slow creation delays no one
            beyond its own place; prepared containers go only when no request waits
            (:mod:`app.runtime.docker.creates`).
        max_streams: Concurrent command output streams.
        kill_grace_s: After a kill, how long output may take to end before the
            stream is closed on our side.
        egress_proxy: The proxy of network ``restricted`` (None: the mode is refused);
            remote clones go through it too.
        exec_path: ``auto``: commands go through each container's executor when it is
            ready (:mod:`app.runtime.exec.protocol`), else ``docker exec``;
            ``docker-exec``: always ``docker exec``.
        dir_budget_bytes: dir slots' measured byte budget (None: the slots have a
            kernel quota); bounds what one call may allocate (``hardened_host_config``).
    """

    def __init__(
        self,
        *,
        slots: SlotsRoot,
        allowed_images: tuple[str, ...],
        client_factory: Callable[[], docker.DockerClient],
        host_paths: tuple[Path, Path] | None = None,
        default_image: str | None = None,
        ceilings: Ceilings | None = None,
        max_containers: int = 300,
        pool_size: int = 0,
        max_containers_per_sandbox: int | None = None,
        user_ids: tuple[int, int] = (1000, 1000),
        home: str = "/home/sandbox",
        allow_egress: bool = False,
        egress_network: str = "bridge",
        allow_git_egress: bool = False,
        git_network: str = GIT_NETWORK,
        resolve: Resolver = clone_resolver,
        git_address_policy: AddressPolicy = is_public_address,
        git_image: str | None = None,
        label_prefix: str = "io.sandbox-mcp",
        deployment: str = "1",
        process_id: str | None = None,
        max_calls: int = 16,
        max_creates: int = 8,
        max_streams: int = 512,
        kill_grace_s: float = 15.0,
        egress_proxy: EgressProxy | None = None,
        exec_path: ExecPath = "auto",
        dir_budget_bytes: int | None = None,
    ) -> None:
        if not allowed_images:
            raise ConfigurationError("At least one image must be allowed.")
        if default_image is not None and default_image not in allowed_images:
            raise ConfigurationError("The default image must be one of the allowed images.")
        if git_image is not None and git_image not in allowed_images:
            raise ConfigurationError("The git image must be one of the allowed images.")
        self._slots = slots
        self._allowed = allowed_images
        self._default_image = default_image or allowed_images[0]
        self._ceilings = ceilings or Ceilings()
        self._offload = Offload(calls=max_calls, streams=max_streams)
        self._creates = CreateGate(max_creates)
        self._engine = Engine(
            client_factory=client_factory,
            offload=self._offload,
            slots=slots,
            shares=ContainerShares(max_containers, pool_size, max_containers_per_sandbox),
            labels=Labels(label_prefix, deployment, process_id),
            user_ids=user_ids,
            home=home,
            host_paths=host_paths,
            dir_budget_bytes=dir_budget_bytes,
        )
        self._labels = self._engine.labels
        self._user = user = self._engine.user
        self._networks = Networks(
            allow_egress=allow_egress, egress_network=egress_network, proxy=egress_proxy
        )
        clone_network = CloneNetwork(
            networks=self._networks,
            allow_git_egress=allow_git_egress,
            git_network=git_network,
            git_network_labels={self._labels.key("managed"): "git"},
            resolve=resolve,
            git_address_policy=git_address_policy,
            api=self._engine.api,
            offload=self._offload,
        )
        self.exec_path = exec_path
        fast = Executors(api=self._engine.api, offload=self._offload, user=user)
        self._exec = ExecRunner(
            api=self._engine.api,
            offload=self._offload,
            user=user,
            kill_grace_s=kill_grace_s,
            fast=fast if exec_path == "auto" else None,
        )
        self._cloner = Cloner(
            engine=self._engine,
            networks=clone_network,
            offload=self._offload,
            slots_base=lambda: slots.base,
            ceilings=self._ceilings,
            image=git_image or self._default_image,
            run=self._run_clone,
            remove=self._remove_quietly,
        )

    # -- seam ------------------------------------------------------------------------

    async def info(self) -> RuntimeInfo:
        return await self._engine.info(self._allowed)

    async def create(self, spec: ContainerSpec, *, begun: asyncio.Event | None = None) -> Container:
        """A started container as ``spec`` asks; ``begun`` is set when its creation leaves
        the gate for the engine (a prepared one's owner then waits for it rather than
        go cold)."""
        started = time.monotonic()
        image = spec.image or self._default_image
        if image not in self._allowed:
            raise ImageNotAllowed(image, self._allowed)
        self._networks.mode(spec.network)  # refused before anything is made
        workspace = await self._offload.call(check_workspace, spec.workspace, self._slots.base)
        api = await self._engine.api()
        limits, warnings = clamp_limits(spec.limits, self._ceilings, await self._engine.cpus(api))
        mounts = [self._engine.workspace_mount(workspace)]
        signin = {SIGNIN_LABEL: spec.signin_label} if spec.signin_label else {}
        prepared = {"prepared": "1"} if spec.prepared else {}
        labels = self._labels.of_new(
            experiment=spec.experiment_id, sandbox=spec.sandbox_label, **signin, **prepared
        )
        kind = PREPARED if spec.prepared else "smcp-"
        name = f"{kind}{_NAME_UNSAFE.sub('-', spec.experiment_id)[:40]}-{secrets.token_hex(4)}"
        joining = self._networks.for_experiment(spec)
        labels.update(joining.labels)
        warnings = (*warnings, *joining.warnings)
        # The engine serves a few creations at once well; more only queue inside it.
        async with self._creates.place(background=spec.prepared):
            if begun is not None:
                begun.set()
            container_id = await self._engine.create(
                api,
                image,
                name,
                labels,
                mounts,
                joining.mode,
                limits,
                {**spec.env, **joining.env},
                spec.sandbox_label,
                admit=not spec.prepared,  # the warm budget bounds it until it is handed over
            )
            try:
                with translated(container_id):
                    await self._offload.call(api.start, container_id)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._remove_quietly(container_id)
                raise
        try:
            await self._networks.attach(api, container_id, joining)
            self._exec.prepare(container_id)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._remove_quietly(container_id)
            raise
        isolation = applied_isolation(
            image=image,
            user=self._user,
            network=spec.network,
            limits=limits,
            home=self._engine.home,
            egress_allowlist=joining.allowlist,
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
        notice = await self._networks.notice(container_id)
        return dataclasses.replace(result, stderr=result.stderr + notice) if notice else result

    async def cancel(self, container_id: str, job_id: str) -> bool:
        return await self._exec.cancel(container_id, job_id)

    async def kill_tree(self, container_id: str, pids: tuple[int, int]) -> bool:
        return await self._exec.kill_tree(container_id, pids)

    async def kill_all(self, container_id: str) -> None:
        await self._exec.kill_all(container_id)

    async def fast_exec_ready(self, container_id: str) -> bool:
        """Wait until the container's executor is ready (tests, benchmarks); False if
        its commands go through docker exec."""
        return await self._exec.fast_ready(container_id)

    @property
    def exec_runs(self) -> Mapping[str, int]:
        """Commands run so far, by path ("fast", "docker-exec")."""
        return self._exec.runs

    async def revive(self, container_ids: set[str]) -> Revival:
        return await self._engine.revive(container_ids)

    async def stop(self, container_id: str) -> None:
        await self._engine.stop(container_id)
        log.info("runtime.stop", container_id=container_id[:12])

    async def host_pids(self, container_id: str) -> list[int]:
        return await self._engine.host_pids(container_id)

    async def remove(self, container_id: str) -> None:
        self._exec.forget(container_id)
        await self._engine.delete(container_id)
        await self._networks.detach(container_id)
        log.info("runtime.remove", container_id=container_id[:12])

    async def running(self) -> set[str]:
        """The ids of our containers that are running now."""
        return await self._engine.running()

    def claim(self, container_id: str, sandbox_label: str) -> None:
        """Count ``container_id`` in ``sandbox_label``'s share from now on (whatever its label)."""
        self._engine.claim(container_id, sandbox_label)

    async def hand_over(
        self, warm: Container, spec: ContainerSpec, *, admit: bool = False
    ) -> Container | None:
        """Make the running (warm) container ``warm`` the one ``spec`` asks for, or None
        when it cannot be (see :mod:`app.runtime.docker.handover`); ``admit``: within the
        sandbox's share, as a cold create (a prepared container)."""
        image = spec.image or self._default_image
        engine, offload, ceilings = self._engine, self._offload, self._ceilings
        return await hand_over(
            warm, spec, image=image, engine=engine, offload=offload, ceilings=ceilings, admit=admit
        )

    async def remove_prepared(self, sandbox_label: str | None = None) -> int:
        """Remove the prepared containers not handed over yet: a sandbox's (whichever
        process made them), or all of this process's (``None``); how many."""
        found = await self._engine.prepared(sandbox_label=sandbox_label, mine=sandbox_label is None)
        for container_id in found:
            await self._remove_quietly(container_id)
        if found:
            log.info("runtime.prepared_removed", removed=len(found), sandbox=sandbox_label)
        return len(found)

    async def sweep(
        self, live_container_ids: set[str], live_processes: frozenset[str] = frozenset()
    ) -> int:
        await self._engine.cpus(await self._engine.api())  # at start-up: says if seccomp is off
        live = {c for c in live_container_ids if len(c) >= 12} | self._cloner.helpers
        found, orphans = await self._engine.orphans(live, live_processes)
        for container_id in orphans:
            await self.remove(container_id)
        log.info("runtime.sweep", found=found, removed=len(orphans))
        return len(orphans)

    async def clone(
        self,
        source: GitSource,
        workspace: Path,
        *,
        timeout_s: float = 300,
        sandbox_label: str = UNATTRIBUTED,
        signin_label: str = "",
    ) -> ExecResult:
        return await self._cloner.clone(
            source,
            workspace,
            timeout_s=timeout_s,
            sandbox_label=sandbox_label,
            signin_label=signin_label,
        )

    async def aclose(self) -> None:
        """Close the executors' streams and the Docker client (at shutdown); containers
        are left to the next sweep."""
        await self._exec.aclose()
        await self._engine.aclose()

    async def _run_clone(self, container_id: str, script: str, timeout_s: float) -> ExecResult:
        self._exec.docker_exec_only(container_id)  # a short-lived helper: no executor
        return await self.run(container_id, script, timeout_s=timeout_s, job_id=GIT_ROLE)

    async def _remove_quietly(self, container_id: str) -> None:
        try:
            await self.remove(container_id)
        except RuntimeFailure:
            log.warning("runtime.remove_failed", container_id=container_id[:12], exc_info=True)
