"""The composition root: the only place where the service's objects are wired together.

Read top to bottom it is the wiring diagram: storage, the pool and its slots, the
runtime and the experiments, the sign-in, the tool layer, then the HTTP app. Each part
gets its group of settings whole (``settings.pool``, ``settings.runtime``, ...); the
builders that need more than a constructor call live beside what they build
(``app/root/runtime.py``, ``app/root/experiments.py``, ``app/root/oauth.py``,
``app/root/mcp.py``). The operator's commands are in ``app/ops/admin.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route

from app.experiments.core.jobs import JobRegistry
from app.experiments.manager import ExperimentManager
from app.experiments.recovery.process_registry import ProcessRegistry
from app.experiments.recovery.slot_mounts import SlotMounts
from app.http.health import HealthEndpoint
from app.http.hsts import StrictTransportSecurity
from app.http.metrics import Metrics, MetricsEndpoint
from app.mcp.call_sampling import CallSampling
from app.mcp.runner import Identity, LocalIdentity, TokenIdentity, ToolRunner
from app.observability import configure_logging
from app.root.experiments import (
    SandboxReset,
    build_disk_budget,
    experiment_options,
)
from app.root.mcp import build_mcp_server, mcp_endpoint
from app.root.oauth import build_auth
from app.root.runtime import (
    build_backend,
    build_egress_proxy,
    build_prepared,
    build_warm_demand,
    build_warm_pool,
    warn_if_sandboxes_cannot_write,
)
from app.root.services import Services
from app.root.shared_limits import SharedLimits
from app.root.slot_storage import slot_store
from app.root.state_dir import deployment_id
from app.runtime.docker.probe import DockerProbe
from app.settings import Settings
from app.storage.audit import AuditTrail
from app.storage.audit_day_store import SqlDayLedger
from app.storage.db import Repository, create_engine
from app.storage.egress_store import SqlUsageRecords
from app.storage.experiment_store import SqlExperimentStore
from app.storage.process_store import SqlProcessRecords
from app.storage.retention import Retention
from app.storage.signin.front_door import front_door_engine
from app.storage.slots.pool_pg_store import EGRESS_LOCK, leadership_for, pool_state_for
from app.storage.slots.warm_store import SqlWarmClaimLedger
from app.storage.sqlite_writes import in_turns
from app.storage.task_store import SqlTaskRecords
from app.tenancy.threads import TenantThreads
from app.version import service_version
from jail.context import SandboxMemory
from pool.leases import SlotPool
from pool.mailer import ReadyMailer
from pool.slots_zfs import ZfsSlotStore
from pool.watchdog import IdleWatchdog


def build_services(settings: Settings) -> Services:
    metrics = Metrics()
    configure_logging(settings.server.log_level, count_events=metrics.count_event)
    warn_if_sandboxes_cannot_write(settings.runtime)
    # Storage: one database for every process, budgets counted in it.
    database_url = settings.storage.effective_database_url
    engine = create_engine(database_url)
    # The sign-in's and the rate ledger's connections, apart from the tenants' (front_door.py).
    front_door = front_door_engine(database_url)
    in_turns(engine, front_door)  # SQLite's one writer: the sign-in's writes go first
    repository = Repository(engine)
    memory = SandboxMemory()
    shared = SharedLimits.build(front_door, database_url, settings.smtp.max_per_hour)
    mailer = ReadyMailer(
        settings.smtp.options(),
        public_url=settings.server.effective_public_url,
        max_per_hour=settings.smtp.max_per_hour,
        relay=shared.relay,
        take_mail_budget=shared.take_mail,
    )
    # The slots: built without I/O; the lifespan opens the store before anything uses it.
    store = slot_store(settings)
    # The runtime, on the store (it asks where the slots live once the service runs).
    jobs = JobRegistry()
    registry = ProcessRegistry(SqlProcessRecords(engine), stale_s=settings.server.process_stale_s)
    deployment = deployment_id(settings.storage)
    egress_usage = SqlUsageRecords(engine)  # the byte cap, per experiment, kept across restarts
    egress = build_egress_proxy(
        settings,
        deployment,
        usage=egress_usage,
        on_refused=metrics.egress_refused,
        on_bytes=metrics.egress_bytes,
        # One Squid for every process: the one elected runs it.
        leadership=leadership_for(engine, EGRESS_LOCK, "egress"),
        processes=registry,
    )
    backend = build_backend(settings, store, deployment, registry.process_id, egress)
    # The experiments. The pool is built after the manager (its reset hook tears
    # experiments down); the warm pool asks it for free slots only once the service runs.
    records = SqlExperimentStore(engine)
    demand = build_warm_demand(
        settings.runtime,
        # One sign-in address grows the warm pool by its share of the budget at most.
        address_share_percent=settings.auth.address_share_percent,
        holds_slot=lambda key: pool.lease_of(key) is not None,
        queued=lambda: pool.stats().queued,
    )
    warm = build_warm_pool(
        settings.runtime,
        backend,
        lambda n: pool.next_free(n),
        demand=demand,
        # Several processes place theirs in the slots they share: claims in the database.
        claims=SqlWarmClaimLedger(engine) if engine.dialect.name == "postgresql" else None,
        processes=registry,
        refresh_free=lambda: pool.refresh(),
    )
    # Each lessee's next experiment's container, in what the warm budget leaves beside it.
    prepared = build_prepared(
        settings.runtime,
        backend,
        warm,
        demand=demand,
        holding=lambda key: pool.holding(key),
        address_share_percent=settings.auth.address_share_percent,
    )
    options = experiment_options(settings)
    manager = ExperimentManager(
        records, backend, jobs, options, registry, warm=warm, prepared=prepared
    )
    pool = SlotPool(
        pool_state_for(engine),  # shared by every process on PostgreSQL
        store,
        size=settings.pool.size,
        idle_timeout_s=settings.pool.idle_timeout_s,
        before_reset=SandboxReset(memory, manager, prepared),
        on_reserved=mailer.sandbox_ready,
    )
    # A container recreated by recovery goes on its sandbox's slot (whichever process leased it).
    manager.recovery.slot_of = pool.holding
    if isinstance(store, ZfsSlotStore):  # a dataset can go away under live experiments
        mounts = SlotMounts(records, backend, store.dataset, pool.holding)
        manager.recovery.check_mounts = mounts.repair
    # Tenants' blocking work: a thread share per sandbox, apart from the upkeep's executor.
    threads = TenantThreads(
        total=settings.mcp.tenant_threads,
        per_sandbox=settings.mcp.threads_per_sandbox,
        per_address=settings.mcp.threads_per_address,
    )
    disk_budget = build_disk_budget(
        settings.pool, pool, records, jobs, backend, threads, trash_settled=manager.trash.settled
    )
    # The sign-in (hosted mode), and the chores of the one watchdog across processes.
    auth = (
        build_auth(settings, front_door, mailer, shared, on_signin=demand.signed_in)
        if settings.auth.hosted
        else None
    )
    retention = Retention(
        repository, records, egress_usage, keep_s=settings.storage.record_retention_s
    )
    chores = [mailer.housekeeping, shared.housekeeping, manager.shelf.expire, retention.sweep]
    if auth is not None:
        chores.append(auth.housekeeping)
    watchdog = IdleWatchdog(
        pool,
        interval_s=settings.pool.watchdog_interval_s,
        is_busy=manager.is_busy,
        housekeeping=chores,
        leadership=leadership_for(engine),
    )
    # The tool layer: one runner for every tool and resource.
    identity: Identity = LocalIdentity() if auth is None else TokenIdentity()
    audit = AuditTrail(engine)
    runner = ToolRunner(
        identity,
        audit,
        memory,
        pool,
        queue_wait_s=settings.mcp.queue_wait_s,
        progress_every_s=settings.mcp.progress_interval_s,
        on_call=metrics.tool_call,
        disk_budget=disk_budget,
        threads=threads,
        max_calls_per_sandbox=settings.mcp.max_calls_per_sandbox,
        max_calls_per_address=settings.mcp.max_calls_per_address,
        sampling=CallSampling(
            settings.storage.audit_refusals_per_minute,
            settings.storage.audit_rows_per_sandbox_per_day,
            rows_per_address_per_day=settings.storage.audit_rows_per_address_per_day,
            # Counted in the database: the day's bound holds across every process.
            days=SqlDayLedger(engine),
        ),
    )
    mcp = build_mcp_server(
        settings, identity, runner, pool, manager, SqlTaskRecords(engine), registry
    )
    probe = DockerProbe(
        images=settings.runtime.image_list, default_image=settings.runtime.default_image
    )
    return Services(
        settings=settings,
        engine=engine,
        front_door=front_door,
        repository=repository,
        audit=audit,
        pool=pool,
        mailer=mailer,
        watchdog=watchdog,
        runner=runner,
        mcp=mcp,
        auth=auth,
        manager=manager,
        jobs=jobs,
        backend=backend,
        metrics=metrics,
        store=store,
        docker_probe=probe,
        egress=egress,
        disk_budget=disk_budget,
        warm=warm,
        prepared=prepared,
    )


def build_app(settings: Settings) -> Starlette:
    """The HTTP application: ``/mcp``, ``/health``, ``/metrics`` (and, with OAuth, the
    sign-in routes)."""
    return build_http_app(build_services(settings))


def build_http_app(services: Services) -> Starlette:
    """The HTTP application around services already built (a test may add a tool of its
    own to ``services.mcp``, on ``services.runner``, before this call)."""
    settings = services.settings

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await services.start()  # opens the slot store first, then the pool and the rest
        try:
            # A mounted app's own lifespan never runs: enter the SDK's session manager here.
            async with services.mcp.session_manager.run():
                services.announce_listening()
                yield
        finally:
            await services.stop()

    health = HealthEndpoint(
        version=service_version(),
        ping_database=services.repository.ping,
        pool_stats=services.pool_stats,
        probe_runtime=services.docker_probe,
        egress=services.egress.health if services.egress else None,
    )
    metrics = MetricsEndpoint(services.metrics, services.pool_stats, settings.server.metrics_secret)
    mcp_app = mcp_endpoint(services.mcp, settings.server, services.runner)
    front = mcp_app if services.auth is None else services.auth.gate(mcp_app)
    # ``/mcp`` first: the router tries its routes in order, and every tool call was
    # matched against the nine others' patterns before reaching the catch-all (3% of a
    # light call's CPU in-process). The catch-all still serves the rest the same way
    # (``/mcp/``, and unknown paths, which the gate and the SDK answer 404).
    routes: list[BaseRoute] = [
        Route("/mcp", front),
        Route("/health", health.handle, methods=["GET"]),
        Route("/metrics", metrics.handle, methods=["GET"]),
    ]
    if services.auth is not None:
        routes += services.auth.routes()
    routes.append(Mount("/", app=front))
    # Behind the TLS proxy every answer tells browsers to stay on https.
    https = settings.server.effective_public_url.startswith("https://")
    middleware = [Middleware(StrictTransportSecurity)] if https else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    # Called by the HTTP server as its shutdown begins (app/http/graceful.py).
    app.state.begin_shutdown = services.begin_shutdown
    return app


async def run_stdio(settings: Settings) -> None:
    """Serve one local user over stdin/stdout (logs stay on stderr) until the end of
    stdin, SIGTERM or SIGINT; each stops the service the same way (warm containers
    removed). Without the handlers SIGTERM ended the process on the spot (issue 27)."""
    services = build_services(settings)
    await services.start()
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    stop_signals = (signal.SIGTERM, signal.SIGINT)
    for number in stop_signals:
        loop.add_signal_handler(number, stopped.set)
    serving = asyncio.ensure_future(services.mcp.run_stdio_async())
    signalled = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({serving, signalled}, return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            serving.result()  # its failure, if any, is the caller's
    finally:
        for number in stop_signals:
            loop.remove_signal_handler(number)
        signalled.cancel()
        serving.cancel()
        await services.stop()
    if stopped.is_set():
        # The SDK's reader thread is blocked reading stdin, which only the client
        # closes, and a cancelled read waits for it (so would asyncio.run, for ever):
        # everything is stopped, so the process ends here.
        logging.shutdown()
        os._exit(0)
