"""The running service: its parts, and how they start and stop together.

Built by the composition root (``app/root/main.py``); the HTTP lifespan and the stdio
transport call ``start`` and ``stop``.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from mcp.server.mcpserver import MCPServer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.egress.proxy import EgressProxy
from app.experiments.core.jobs import JobRegistry
from app.experiments.disk_budget import DiskBudget
from app.experiments.manager import ExperimentManager
from app.http.metrics import Metrics
from app.mcp.runner import ToolRunner
from app.mcp.server import SandboxMCPServer
from app.root.oauth import AuthParts
from app.root.slot_storage import open_slots
from app.root.state_dir import prepare_state_dir
from app.root.state_lock import hold_state_dir, release_state_dir
from app.runtime.backend import SandboxBackend
from app.runtime.docker.probe import DockerProbe
from app.runtime.warm.pool import WarmPool
from app.runtime.warm.prepared import PreparedContainers
from app.settings import Settings
from app.storage.audit import AuditTrail
from app.storage.db import Repository, upgrade_schema
from app.version import service_version
from pool.leases import PoolStats, SlotPool
from pool.mailer import ReadyMailer
from pool.slots import SlotStore
from pool.watchdog import IdleWatchdog

log = structlog.get_logger(__name__)

HOSTED_MEANING = (
    "anyone who reaches the URL signs in (OAuth) and gets a sandbox of their own; "
    "the server's disk and environment stay out of reach"
)
LOCAL_MEANING = (
    "one user, no sign-in (SANDBOX_MCP_AUTH=none, loopback only); that user may copy "
    "this machine's folders in (project_path) and forward its environment"
)


@dataclass
class Services:
    """Everything a transport needs; built by ``build_services``, opened by ``start``."""

    settings: Settings
    engine: AsyncEngine
    # the sign-in's and the rate ledger's (app/storage/signin/front_door.py)
    front_door: AsyncEngine
    repository: Repository
    audit: AuditTrail
    pool: SlotPool
    mailer: ReadyMailer
    watchdog: IdleWatchdog
    runner: ToolRunner
    mcp: MCPServer
    auth: AuthParts | None
    manager: ExperimentManager
    jobs: JobRegistry
    backend: SandboxBackend
    metrics: Metrics
    store: SlotStore
    docker_probe: DockerProbe
    egress: EgressProxy | None = None  # network "restricted"'s proxy, when offered
    disk_budget: DiskBudget | None = None  # dir slots only: ZFS has a kernel quota
    warm: WarmPool | None = None  # pre-started containers of the default image
    prepared: PreparedContainers | None = None  # each lessee's next experiment's container

    async def start(self) -> None:
        """Prepare the state dir, the schema and the slots; start the watchdog.

        Raises:
            StateDirUnusable: the state dir cannot be created or written.
            DatabaseUnavailable: the database cannot be reached or migrated.
            SlotsMissing: slots of the pool were never provisioned.
            PoolError: the slot storage cannot be opened.
        """
        prepare_state_dir(self.settings.storage)
        hold_state_dir(self.settings.storage)  # StateDirInUse: another process serves it (SQLite)
        await upgrade_schema(self.engine)
        await open_slots(self.store, self.settings)
        await self.pool.open()
        await self.mailer.open()  # hand-overs from other processes reach it from now on
        if self.auth is not None:
            await self.auth.open()  # and revocations
        await self.manager.recovery.registry.register()
        if self.egress is not None:
            await self.egress.start()  # before recovery: live containers get their lists
        recovered = await self.manager.recover(self.pool.holders())
        # What destroys left half-deleted when the server stopped (in the background).
        self.manager.trash.sweep(self.store.slot(i).root for i in range(self.settings.pool.size))
        log.info("experiments.recovered", **recovered)
        self.manager.recovery.start()  # heartbeat, and takeover of dead processes' work
        if self.warm is not None:
            # Handed-over warm containers keep counting in their sandbox's share.
            for container_id, label in (await self.manager.live_containers()).items():
                self.warm.claim(container_id, label)
            self.warm.start(self.store.slot(i).root for i in range(self.settings.pool.size))
        if self.prepared is not None:
            self.prepared.start()
        self.watchdog.start()
        if self.disk_budget is not None:
            self.disk_budget.start()
        log.info(
            "service.started",
            version=service_version(),
            auth=self.settings.auth.mode,
            slots=self.settings.pool.slot_backend,
            pool_size=self.settings.pool.size,
        )

    def begin_shutdown(self) -> None:
        """End the responses that never finish by themselves (listen streams)."""
        if isinstance(self.mcp, SandboxMCPServer) and self.mcp.listen_streams is not None:
            self.mcp.listen_streams.close()

    def announce_listening(self) -> None:
        """The line that says where to connect, once the HTTP server is ready."""
        server, hosted = self.settings.server, self.settings.auth.hosted
        log.info(
            "service.listening",
            url=server.listening_url,
            mcp_url=f"{server.effective_public_url}/mcp",
            mode="hosted" if hosted else "local",
            meaning=HOSTED_MEANING if hosted else LOCAL_MEANING,
        )

    async def stop(self) -> None:
        await self.watchdog.stop()
        if self.disk_budget is not None:
            await self.disk_budget.close()
        if self.warm is not None:
            await self.warm.stop()
        if self.prepared is not None:
            # Unlike experiments' containers, nothing finds them again after a restart.
            await self.prepared.stop()
        await self.pool.close()
        # Containers keep running: a restart finds them again (work is never lost to a
        # restart); their jobs are marked lost, and orphans are swept at start-up.
        await self.manager.stop_creations()
        await self.jobs.close()
        # Removals of destroyed experiments' containers, then their folders' deletions
        # (which wait for them); what is left, the next start sweeps.
        await self.manager.removals.close()
        await self.manager.trash.close()
        await self.manager.recovery.stop()  # this process's jobs reported lost, then gone
        if self.egress is not None:
            await self.egress.stop()
        await self.backend.aclose()
        await self.mailer.close()
        if self.auth is not None:
            await self.auth.close()
        await self.store.close()
        await self.runner.close()  # the counts of calls not written one by one
        await self.audit.close()  # rows of calls already answered
        self.docker_probe.close()
        await self.engine.dispose()
        await self.front_door.dispose()
        release_state_dir(self.settings.storage)

    async def pool_stats(self) -> PoolStats:
        return await self.pool.current_stats()
