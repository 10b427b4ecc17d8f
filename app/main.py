"""The composition root: the only place where the service's objects are wired together.

Read top to bottom it is the wiring diagram: storage, the pool and its slots, the
runtime and the experiments, the sign-in, the tool layer, then the HTTP app. How a
setting becomes a part's options is in ``app/options.py``; the operator's commands
are in ``app/admin.py``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import docker
import structlog
from mcp.server.mcpserver import MCPServer
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route

from app import options
from app.errors import ConfigurationError
from app.experiments.disk_budget import DiskBudget, containers_from
from app.experiments.jobs import JobRegistry
from app.experiments.manager import ExperimentManager
from app.experiments.process_registry import ProcessRegistry
from app.http.health import HealthEndpoint
from app.http.hsts import StrictTransportSecurity
from app.http.metrics import Metrics, MetricsEndpoint
from app.mcp.allowed_hosts import transport_security
from app.mcp.resources import register_resources
from app.mcp.runner import Identity, LocalIdentity, TokenIdentity, ToolRunner
from app.mcp.server import SandboxMCPServer
from app.mcp.task_mirror import TaskMirror
from app.mcp.task_store import TaskStore
from app.mcp.tasks import TasksExtension
from app.mcp.tools.evidence import register_evidence_tools
from app.mcp.tools.experiments import register_experiment_tools
from app.mcp.tools.files import register_file_tools
from app.mcp.tools.status import register_tools
from app.mcp.transport import StatelessTransport
from app.observability import configure_logging
from app.retention import Retention
from app.runtime.docker import DockerBackend, output_streams
from app.runtime.egress_proxy import EgressConfig, EgressProxy
from app.runtime.limits import Ceilings
from app.runtime.probe import DockerProbe
from app.runtime.warm import WarmPool
from app.services import AuthParts, Services
from app.settings import Settings
from app.shared_limits import SharedLimits
from app.slot_storage import slot_store
from app.state_dir import deployment_id, prepare_state_dir
from app.storage.audit import AuditTrail
from app.storage.auth_store import SqlAuthStore
from app.storage.db import Repository, create_engine
from app.storage.experiment_store import ExperimentRecords
from app.storage.pool_pg import leadership_for, pool_state_for
from app.storage.process_store import ProcessRecords
from app.storage.task_records import TaskRecords
from app.version import service_version
from auth.bearer import BearerGate
from auth.client_documents import ClientDocuments
from auth.clients import ClientDirectory
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.registration import Registrar
from auth.routes import create_auth_routes
from auth.safe_fetch import PublicFetcher
from auth.sealing import Sealer
from auth.signin import SigninFlow
from auth.tokens import TokenHasher, load_or_create_key
from jail.context import SandboxMemory
from pool.leases import SlotPool
from pool.mailer import ReadyMailer
from pool.slots import SlotStore
from pool.watchdog import IdleWatchdog

log = structlog.get_logger(__name__)

INSTRUCTIONS = (
    "sandbox-mcp gives you a private, disposable sandbox for running code. "
    "Every result carries `notes`: read them, they tell you when your sandbox was "
    "emptied, is ready, or how long it survives without activity."
)


ToolRegistrar = Callable[[MCPServer, ToolRunner], None]


def build_auth(
    settings: Settings, engine: AsyncEngine, mailer: ReadyMailer, shared: SharedLimits
) -> AuthParts:
    prepare_state_dir(settings)
    given = settings.token_key.get_secret_value() if settings.token_key else None
    key_file = settings.state_dir / "token-hmac.key"
    try:
        token_key = load_or_create_key(key_file, given)
        hasher = TokenHasher(token_key)
    except (ValueError, OSError) as exc:
        raise ConfigurationError(f"The token key cannot be used: {exc}") from exc
    config = AuthConfig(
        issuer=settings.effective_public_url,
        registrations_per_minute=settings.registrations_per_minute,
        signins_per_address_per_minute=settings.signins_per_minute,
        sandboxes_per_address=settings.sandboxes_per_address,
        new_sandboxes_per_hour=settings.new_sandboxes_per_hour,
        trusted_proxies=settings.trusted_proxy_networks,
        proxy_header=settings.proxy_header,
        client_metadata_documents=settings.client_metadata_documents,
    )
    store = SqlAuthStore(engine)
    documents = (
        ClientDocuments(
            PublicFetcher(user_agent=f"sandbox-mcp/{service_version()}"),
            fetches_per_minute=settings.client_document_fetches_per_minute,
            budget=shared.budget("client_documents", settings.client_document_fetches_per_minute),
        )
        if settings.client_metadata_documents
        else None
    )
    sealer = Sealer(token_key)  # every process with this key opens what another sealed
    remember = mailer.remember if mailer.enabled else None
    return AuthParts(
        config=config,
        store=store,
        registrar=Registrar(store),
        flow=SigninFlow(
            config, ClientDirectory(store, documents), hasher, sealer, remember_email=remember
        ),
        tokens=TokenService(config, store, hasher, sealer),
        registrations=shared.budget("register", config.registrations_per_minute),
    )


def build_services(settings: Settings, extra_tools: ToolRegistrar | None = None) -> Services:
    metrics = Metrics()
    configure_logging(settings.log_level, count_events=metrics.count_event)
    options.warn_if_sandboxes_cannot_write(settings)
    engine = create_engine(settings.effective_database_url)
    repository = Repository(engine)
    memory = SandboxMemory()
    shared = SharedLimits.build(engine, settings.effective_database_url, settings.smtp_max_per_hour)
    mailer = ReadyMailer(
        options.smtp_options(settings),
        public_url=settings.effective_public_url,
        max_per_hour=settings.smtp_max_per_hour,
        relay=shared.relay,
        take_mail_budget=shared.take_mail,
    )
    store = slot_store(settings)  # opened first thing in the lifespan
    ceilings = options.ceilings(settings)
    jobs = JobRegistry()
    registry = ProcessRegistry(ProcessRecords(engine), stale_s=settings.process_stale_s)
    egress_proxy = build_egress_proxy(settings, metrics)
    backend = build_backend(settings, store, ceilings, registry.process_id, egress_proxy)
    records = ExperimentRecords(engine)
    # The pool is built after the manager (its reset hook tears experiments down); the
    # warm pool asks it for free slots only once the service runs, when `pool` is bound.
    warm = WarmPool(
        backend,
        lambda n: pool.next_free(n),
        count=settings.warm_containers,
        image=settings.default_image,
        owner=settings.sandbox_ids if os.geteuid() == 0 else None,
    )
    manager = ExperimentManager(
        records,
        backend,
        jobs,
        options.experiment_options(settings, ceilings),
        registry,
        warm=warm,
    )
    hooks = _Hooks(memory, manager)
    pool = SlotPool(
        pool_state_for(engine),  # shared by every process on PostgreSQL
        store,
        size=settings.pool_size,
        idle_timeout_s=settings.idle_timeout_s,
        before_reset=hooks.before_reset,
        on_reserved=mailer.sandbox_ready,
    )
    # A container recreated by recovery goes on its sandbox's slot (whichever process leased it).
    manager.recovery.slot_of = pool.holding
    disk_budget = (
        DiskBudget(
            slot_root_of=lambda key: slot.root if (slot := pool.lease_of(key)) else None,
            artifact_bytes_of=records.artifact_bytes_of,
            containers_of=containers_from(records),
            jobs=jobs,
            backend=backend,
            limit_bytes=settings.dir_slot_budget_mb * 1_048_576,
            max_entries=settings.dir_slot_max_entries,
            interval_s=settings.disk_check_interval_s,
        )
        if settings.slot_backend == "dir"
        else None
    )
    auth = build_auth(settings, engine, mailer, shared) if settings.auth == "oauth" else None
    retention = Retention(repository, records, keep_s=settings.record_retention_days * 86_400)
    chores = [mailer.housekeeping, shared.housekeeping, manager.shelf.expire, retention.sweep]
    if auth is not None:
        chores.append(auth.housekeeping)
    watchdog = IdleWatchdog(
        pool,
        interval_s=min(5.0, settings.idle_timeout_s / 10),
        is_busy=manager.is_busy,
        housekeeping=chores,
        leadership=leadership_for(engine),  # one expiring watchdog across processes
    )
    identity: Identity = LocalIdentity() if auth is None else TokenIdentity()
    audit = AuditTrail(engine)
    runner = ToolRunner(
        identity,
        audit,
        memory,
        pool,
        queue_wait_s=settings.queue_wait_s,
        progress_every_s=settings.progress_interval_s,
        on_call=metrics.tool_call,
        disk_budget=disk_budget,
    )
    tasks = TaskStore(
        keep_s=settings.task_keep_s,
        max_per_sandbox=settings.max_tasks_per_sandbox,
        max_total=settings.max_tasks,
    )
    # Tasks mirrored to the database: tasks/get and tasks/cancel through any process.
    mirror = TaskMirror(TaskRecords(engine), registry, tasks)
    mcp = SandboxMCPServer(
        "sandbox-mcp",
        version=service_version(),
        instructions=INSTRUCTIONS,
        log_level=settings.log_level,
        extensions=[TasksExtension(identity, tasks, mirror)],
    )
    mcp.cap_listen_streams(
        identity,
        per_sandbox=settings.max_listen_streams_per_sandbox,
        total=settings.max_listen_streams,
    )
    register_tools(mcp, runner, pool)
    # Egress decides the openWorldHint of the tools that can then reach the network.
    # Network "restricted" reaches the open world too (its allow-list of it).
    egress = settings.allow_egress or settings.egress_proxy
    git_egress = settings.allow_git_egress or settings.egress_proxy
    register_experiment_tools(mcp, runner, manager, egress=egress, git_egress=git_egress)
    register_file_tools(mcp, runner, manager)
    register_evidence_tools(mcp, runner, manager, egress=egress)
    register_resources(mcp, runner, manager)
    if extra_tools is not None:
        extra_tools(mcp, runner)
    return Services(
        settings=settings,
        engine=engine,
        repository=repository,
        audit=audit,
        memory=memory,
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
        docker_probe=DockerProbe(images=settings.image_list, default_image=settings.default_image),
        egress=egress_proxy,
        disk_budget=disk_budget,
        warm=warm,
    )


@dataclass
class _Hooks:
    """What happens to the rest of the service when the pool empties a sandbox."""

    memory: SandboxMemory
    manager: ExperimentManager

    async def before_reset(self, sandbox_key: str) -> None:
        # Containers first (they hold the slot's folders), then what we remembered.
        await self.manager.teardown_sandbox(sandbox_key, "the sandbox was emptied after being idle")
        self.memory.drop(sandbox_key)


def build_egress_proxy(settings: Settings, metrics: Metrics) -> EgressProxy | None:
    """The proxy of network "restricted", when the operator offers it."""
    if not settings.egress_proxy:
        return None
    config = EgressConfig(
        ceiling=settings.egress_ceiling,
        max_bytes=settings.egress_max_bytes,
        deployment=deployment_id(settings),
        port=settings.egress_proxy_port,
        test_hosts=settings.egress_test_host_pairs,
        label_prefix=settings.label_prefix,
    )
    return EgressProxy(
        config,
        client_factory=lambda: docker.from_env(timeout=60),
        on_refused=metrics.egress_refused,
        on_bytes=metrics.egress_bytes,
    )


def build_backend(
    settings: Settings,
    slots: SlotStore,
    ceilings: Ceilings,
    process_id: str | None = None,
    egress: EgressProxy | None = None,
) -> DockerBackend:
    return DockerBackend(
        slots=slots,
        deployment=deployment_id(settings),
        process_id=process_id,
        allowed_images=settings.image_list,
        host_paths=(
            (settings.state_dir, settings.host_state_dir) if settings.host_state_dir else None
        ),
        default_image=settings.default_image,
        ceilings=ceilings,
        max_containers=settings.effective_max_containers,
        pool_size=settings.pool_size,
        max_containers_per_sandbox=settings.max_experiments,
        max_streams=output_streams(
            settings.pool_size, settings.max_jobs_per_sandbox, settings.max_experiments
        ),
        label_prefix=settings.label_prefix,
        user=settings.sandbox_user,
        exec_path=settings.exec_path,
        allow_egress=settings.allow_egress,
        allow_git_egress=settings.allow_git_egress,
        egress_proxy=egress,
        # DOCKER_HOST and friends are honoured, as by `docker` itself and `check`.
        client_factory=lambda: docker.from_env(timeout=60),
    )


def build_app(settings: Settings, *, extra_tools: ToolRegistrar | None = None) -> Starlette:
    """The HTTP application: ``/mcp``, ``/health``, ``/metrics`` (and, with OAuth, the
    sign-in routes).

    ``extra_tools`` lets the test suite register a tool of its own (for example a
    slot-taking probe) on the same runner as the real ones.
    """
    services = build_services(settings, extra_tools)
    # Stateless, both eras: no request depends on an MCP session (app/mcp/transport.py).
    mcp_app = StatelessTransport(
        services.mcp.streamable_http_app(
            streamable_http_path="/mcp",
            stateless_http=True,
            transport_security=transport_security(settings),
            host=settings.host,
        )
    )
    health = HealthEndpoint(
        version=service_version(),
        ping_database=services.repository.ping,
        pool_stats=services.pool_stats,
        probe_runtime=services.docker_probe,
        egress=services.egress.health if services.egress else None,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await services.start()
        try:
            # A mounted app's own lifespan never runs: enter the SDK's session manager here.
            async with services.mcp.session_manager.run():
                services.announce_listening()
                yield
        finally:
            await services.stop()

    metrics = MetricsEndpoint(
        services.metrics,
        services.pool_stats,
        settings.metrics_token.get_secret_value() if settings.metrics_token else None,
    )
    routes: list[BaseRoute] = [
        Route("/health", health.handle, methods=["GET"]),
        Route("/metrics", metrics.handle, methods=["GET"]),
    ]
    if services.auth is None:
        routes.append(Mount("/", app=mcp_app))
    else:
        auth = services.auth
        routes += create_auth_routes(
            auth.config,
            auth.registrar,
            auth.flow,
            auth.tokens,
            store=auth.store,
            ask_email=services.mailer.enabled,
            registrations=auth.registrations,
        )
        routes.append(Mount("/", app=BearerGate(mcp_app, auth.tokens, auth.config)))
    # Behind the TLS proxy every answer tells browsers to stay on https.
    middleware = (
        [Middleware(StrictTransportSecurity)]
        if settings.effective_public_url.startswith("https://")
        else []
    )
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    # Called by the HTTP server as its shutdown begins (app/http/graceful.py).
    app.state.begin_shutdown = services.begin_shutdown
    return app


async def run_stdio(settings: Settings) -> None:
    """Serve one local user over stdin/stdout (logs stay on stderr)."""
    services = build_services(settings)
    await services.start()
    try:
        await services.mcp.run_stdio_async()
    finally:
        await services.stop()
