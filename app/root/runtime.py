"""How the composition root builds the Docker runtime from the settings: the backend,
network "restricted"'s proxy and the warm containers, plus the start-up warning when
sandbox commands could not write their workspace.

Each builder takes the groups of settings it needs; what the parts do is in their own
modules (``docker.py``, ``egress_proxy.py``, ``warm.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import docker
import structlog

from app.egress.meter import UsageRecords
from app.egress.proxy import EgressProxy
from app.runtime.backends.docker import DockerBackend
from app.runtime.docker.capacity import output_streams
from app.runtime.warm.demand import WarmBudget, WarmDemand
from app.runtime.warm.pool import WarmPool
from app.runtime.warm.prepared import PreparedBackend, PreparedContainers
from app.settings import RuntimeSettings, Settings
from jail.privilege import can_chown
from pool.slots import Slot, SlotsRoot
from pool.watchdog import Leadership

if TYPE_CHECKING:  # wiring only: the runtime itself never imports the stores or the domain
    from app.experiments.recovery.process_registry import ProcessRegistry
    from app.storage.slots.warm_store import SqlWarmClaimLedger

log = structlog.get_logger(__name__)


def docker_client() -> docker.DockerClient:
    # DOCKER_HOST and friends are honoured, as by `docker` itself and `check`.
    return docker.from_env(timeout=60)


def build_egress_proxy(
    settings: Settings,
    deployment: str,
    *,
    usage: UsageRecords,
    on_refused: Callable[[str], None],
    on_bytes: Callable[[int], None],
    leadership: Leadership | None = None,
    processes: ProcessRegistry | None = None,
) -> EgressProxy | None:
    """The proxy of network "restricted", when the operator offers it (``leadership``:
    which of several processes runs Squid; ``processes``: whether others still serve
    when this one stops)."""
    config = settings.egress.proxy_config(
        deployment=deployment,
        label_prefix=settings.runtime.label_prefix,
        slots=settings.pool.size,
    )
    if config is None:
        return None
    return EgressProxy(
        config,
        usage=usage,
        client_factory=docker_client,
        on_refused=on_refused,
        on_bytes=on_bytes,
        leadership=leadership,
        process_id=processes.process_id if processes else "",
        others_live=None if processes is None else lambda: _others_live(processes),
    )


async def _others_live(processes: ProcessRegistry) -> bool:
    return bool(await processes.live() - {processes.process_id})


def build_backend(
    settings: Settings,
    slots: SlotsRoot,
    deployment: str,
    process_id: str | None = None,
    egress: EgressProxy | None = None,
) -> PreparedBackend:
    """The Docker backend, as the protocol the root holds (``PreparedBackend``: the
    ``SandboxBackend`` the warm pool and the prepared containers can hand containers
    over with); ``slots`` is the
    slot store, opened later by the lifespan (the backend asks it where the slots live
    only once the service runs)."""
    runtime, experiments, pool = settings.runtime, settings.experiments, settings.pool
    return DockerBackend(
        slots=slots,
        deployment=deployment,
        process_id=process_id,
        allowed_images=runtime.image_list,
        host_paths=settings.storage.host_paths,
        default_image=runtime.default_image,
        ceilings=runtime.ceilings(),
        max_containers=settings.effective_max_containers,
        pool_size=pool.size,
        max_containers_per_sandbox=experiments.max_experiments,
        max_streams=output_streams(
            pool.size, experiments.max_jobs_per_sandbox, experiments.max_experiments
        ),
        label_prefix=runtime.label_prefix,
        user_ids=runtime.sandbox_ids,
        exec_path=runtime.exec_path,
        allow_egress=settings.egress.allow,
        allow_git_egress=settings.egress.allow_git,
        egress_proxy=egress,
        client_factory=docker_client,
        max_creates=runtime.engine_creates,
        dir_budget_bytes=(
            pool.dir_slot_budget_mb * 1_048_576 if pool.slot_backend == "dir" else None
        ),
    )


def build_warm_demand(
    runtime: RuntimeSettings,
    *,
    address_share_percent: int,
    holds_slot: Callable[[str], bool],
    queued: Callable[[], int],
    clock: Callable[[], float] = time.monotonic,
) -> WarmDemand:
    """How many warm containers to keep: WARM_CONTAINERS at least, more with sign-ins,
    a queue and the rate of creates (those of the last WARM_RATE_WINDOW_S), within
    WARM_MAX_CONTAINERS and WARM_MEMORY_MB (less the prepared containers:
    ``build_prepared``); one sign-in address grows it by its share of that budget at
    most. ``clock``: monotonic seconds (a fake one in tests)."""
    budget = WarmBudget(
        floor=runtime.warm_containers,
        max_containers=runtime.warm_max_containers,
        max_memory_mb=runtime.warm_memory_mb,
    )
    return WarmDemand(
        budget,
        address_share_percent=address_share_percent,
        holds_slot=holds_slot,
        queued=queued,
        clock=clock,
        rate_window_s=runtime.warm_rate_window_s,
    )


def build_warm_pool(
    runtime: RuntimeSettings,
    backend: PreparedBackend,
    next_free: Callable[[int], list[Slot]],
    *,
    demand: WarmDemand,
    claims: SqlWarmClaimLedger | None,
    processes: ProcessRegistry,
    refresh_free: Callable[[], Awaitable[None]],
) -> WarmPool:
    """Containers of the default image kept started in the free slots handed out next,
    as many as ``demand`` asks; ``claims`` (PostgreSQL) keep two processes out of one slot."""
    return WarmPool(
        backend,
        next_free,
        count=runtime.warm_containers,
        demand=demand,
        # Half the engine's creations at most: refills never fill the line real
        # requests wait in.
        concurrent_makes=max(1, runtime.engine_creates // 2),
        image=runtime.default_image,
        owner=runtime.sandbox_ids if os.geteuid() == 0 else None,
        claims=claims,
        process_id=processes.process_id,
        live_processes=processes.live,
        refresh_free=refresh_free,
    )


def build_prepared(
    runtime: RuntimeSettings,
    backend: PreparedBackend,
    warm: WarmPool,
    *,
    demand: WarmDemand,
    holding: Callable[[str], Awaitable[Slot | None]],
    address_share_percent: int,
) -> PreparedContainers | None:
    """A container made ahead for each lessee's next experiment, in what the warm budget
    leaves beside the warm pool (never its floor); one sign-in address holds its share of
    that budget at most. None: WARM_PREPARED=0."""
    if not runtime.warm_prepared:
        return None
    prepared = PreparedContainers(
        backend,
        holding=holding,
        spare=warm.spare,
        per_address=demand.budget.per_address(address_share_percent),
        owner=runtime.sandbox_ids if os.geteuid() == 0 else None,
    )
    demand.prepared = prepared.count  # the pool's target leaves them their room
    return prepared


def warn_if_sandboxes_cannot_write(runtime: RuntimeSettings) -> None:
    """Only root can hand a workspace to another uid: a server that is not root must run
    sandbox commands as its own uid, or they can read their workspace but not write it."""
    uid, _ = runtime.sandbox_ids
    if not can_chown() and uid != os.geteuid():
        log.warning(
            "config.sandbox_user_cannot_write",
            sandbox_user=runtime.sandbox_user,
            server_uid=os.geteuid(),
            fix=f"set SANDBOX_MCP_SANDBOX_USER={os.geteuid()}:{os.getegid()} or run as root",
        )
