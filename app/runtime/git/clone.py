"""The clone helper: ``git clone`` in a short-lived container of its own.

The helper has the same hardening as an experiment's container and modest fixed
limits (``GIT_LIMITS``, clamped to the ceilings like an experiment's), is labelled
``<prefix>.role=git-clone`` and is removed when the clone ends, however it ends. Its
mounts are the (empty) workspace, read-write, and, for a local repository, that
repository read-only (and not recursively) at ``/source``. It is the only container
that may get network for a clone (:mod:`app.runtime.git.network`), and a failed remote
clone tells the tenant only one of a few fixed sentences, never git's own lines
(:mod:`app.runtime.git.egress`). What git runs is :mod:`app.runtime.git.sources`.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import anyio
import structlog
from docker.types import Mount

from app.runtime.backend import ExecResult, GitSource, Limits
from app.runtime.docker.engine import Engine
from app.runtime.docker.engine_errors import translated
from app.runtime.docker.threads import Offload
from app.runtime.docker.workspace import check_workspace
from app.runtime.git.egress import tenant_error
from app.runtime.git.network import CloneNetwork
from app.runtime.git.sources import (
    SOURCE,
    ClonePlan,
    clone_env,
    clone_script,
    plan_clone,
    require_empty,
)
from app.runtime.limits import Ceilings, clamp_limits

log = structlog.get_logger(__name__)

GIT_LIMITS: Final = Limits(cpus=1.0, memory_mb=1024, pids=256, tmp_mb=256)
GIT_ROLE: Final = "git-clone"

# Runs a script in a container: (container id, script, timeout) -> its result.
RunScript = Callable[[str, str, float], Awaitable[ExecResult]]


class Cloner:
    """Clones git sources into workspaces through helper containers.

    Args:
        engine: Creates and lists the helpers (within their sandbox's share).
        networks: Which network a helper joins.
        offload: Where blocking calls run.
        slots_base: Where every workspace (and a local source) must lie below.
        ceilings: What the helper's limits are clamped to.
        image: The image helpers run (it needs git).
        run: Runs the clone script in a helper (as an experiment's command).
        remove: Removes a helper, never raising.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        networks: CloneNetwork,
        offload: Offload,
        slots_base: Callable[[], Path],
        ceilings: Ceilings,
        image: str,
        run: RunScript,
        remove: Callable[[str], Awaitable[None]],
    ) -> None:
        self._engine = engine
        self._networks = networks
        self._offload = offload
        self._slots_base = slots_base
        self._ceilings = ceilings
        self._image = image
        self._run = run
        self._remove = remove
        self.helpers: set[str] = set()  # clone helpers running in this process

    async def clone(
        self,
        source: GitSource,
        workspace: Path,
        *,
        timeout_s: float,
        sandbox_label: str,
        signin_label: str = "",
    ) -> ExecResult:
        """See :meth:`app.runtime.backend.SandboxBackend.clone`."""
        started = time.monotonic()
        plan = await self._offload.call(plan_clone, source, self._slots_base())
        env = clone_env(plan)
        plan, joining = await self._networks.for_clone(
            plan, sandbox=sandbox_label, address=signin_label
        )
        real_workspace = await self._offload.call(check_workspace, workspace, self._slots_base())
        await self._offload.call(require_empty, real_workspace)
        api = await self._engine.api()
        limits, _ = clamp_limits(GIT_LIMITS, self._ceilings, await self._engine.cpus(api))
        # Its sandbox's share pays for it.
        sandbox = {"sandbox": sandbox_label} if sandbox_label else {}
        labels = self._engine.labels.of_new(role=GIT_ROLE, **sandbox)
        labels.update(joining.labels)
        container_id = await self._engine.create(
            api,
            self._image,
            f"smcp-git-clone-{secrets.token_hex(6)}",
            labels,
            self._mounts(plan, real_workspace),
            joining.mode,
            limits,
            {**env, **joining.env},
            sandbox_label,
        )
        self.helpers.add(container_id)
        try:
            with translated(container_id):
                await self._offload.call(api.start, container_id)
            await self._networks.attach(api, container_id, joining)
            result = await self._run(container_id, clone_script(plan), timeout_s)
        finally:
            with anyio.CancelScope(shield=True):
                await self._remove(container_id)
            self.helpers.discard(container_id)
        # The whole clone, helper start and removal included: what the caller waited.
        result = dataclasses.replace(result, duration_s=round(time.monotonic() - started, 3))
        result = _shown_to_tenant(plan, result)
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

    def _mounts(self, plan: ClonePlan, workspace: Path) -> list[Mount]:
        """The workspace, and a local repository read-only at /source."""
        mounts = [self._engine.workspace_mount(workspace)]
        if plan.local_source is not None:
            source = Mount(
                target=SOURCE, source=str(plan.local_source), type="bind", read_only=True
            )
            # Read-only applies to the bind itself only (Docker < 25): a mount
            # below the repository would stay writable, so none is carried over.
            source["BindOptions"] = {"NonRecursive": True}
            mounts.append(source)
        return mounts


def _shown_to_tenant(plan: ClonePlan, result: ExecResult) -> ExecResult:
    """A failed remote clone as the tenant may see it: a fixed sentence (and what the
    proxy refused), never git's own lines (the operator's log has them)."""
    if plan.local_source is not None or result.exit_code == 0:
        return result
    log.info("runtime.clone_failed", stderr=result.stderr[-2000:])
    refused = result.stderr.partition("\n[sandbox-mcp] ")[2]  # the proxy's notice
    shown = tenant_error(result.stderr) + (f"\n[sandbox-mcp] {refused}" if refused else "")
    return dataclasses.replace(result, stdout="", stderr=shown)
