"""The composition root: the only place where the service's objects are wired together."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from urllib.parse import urlsplit

import docker
import structlog
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route

from app.auth_store import SqlAuthStore
from app.calls import Identity, LocalIdentity, TokenIdentity, ToolRunner
from app.db import Repository, create_engine, upgrade_schema
from app.errors import ConfigurationError, DatabaseUnavailable, ServiceError
from app.evidence_tools import ResourceReader, register_evidence_tools, register_resources
from app.experiment_tools import register_experiment_tools
from app.experiments.jobs import JobRegistry
from app.experiments.manager import ExperimentManager
from app.experiments.options import ExperimentOptions
from app.experiments.records import ExperimentRecords
from app.experiments.workspace import Owner
from app.file_tools import register_file_tools
from app.health import HealthEndpoint, PoolStats
from app.hsts import StrictTransportSecurity
from app.mcp_server import SandboxMCPServer
from app.metrics import Metrics, MetricsEndpoint
from app.observability import configure_logging
from app.pool_store import SqlPoolState
from app.runtime.docker import Ceilings, DockerBackend
from app.runtime.probe import probe_docker
from app.settings import Settings, is_loopback_host
from app.tools import register_tools
from auth.bearer import BearerGate
from auth.client_documents import ClientDocuments
from auth.clients import ClientDirectory
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.pending import CodeGrant, ExpiringMap
from auth.registration import Registrar
from auth.routes import create_auth_routes
from auth.safe_fetch import PublicFetcher
from auth.signin import SigninFlow
from auth.tokens import TokenHasher, load_or_create_key
from jail.context import SandboxMemory
from pool.leases import SlotPool
from pool.mailer import ReadyMailer, SmtpOptions
from pool.provision import provision_dir, provision_zfs
from pool.slots import SlotStore
from pool.slots_dir import DirSlotStore
from pool.slots_zfs import ZfsSlotStore
from pool.watchdog import IdleWatchdog

log = structlog.get_logger(__name__)

INSTRUCTIONS = (
    "sandbox-mcp gives you a private, disposable sandbox for running code. "
    "Every result carries `notes`: read them, they tell you when your sandbox was "
    "emptied, is ready, or how long it survives without activity."
)


def service_version() -> str:
    try:
        return package_version("sandbox-mcp")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


class StateDirUnusable(ServiceError):
    code = "STATE_DIR_UNUSABLE"


class SlotsMissing(ServiceError):
    code = "SLOTS_MISSING"


ToolRegistrar = Callable[[MCPServer, ToolRunner], None]


@dataclass
class Services:
    """Everything a transport needs; built by ``build_services``, opened by ``start``."""

    settings: Settings
    engine: AsyncEngine
    repository: Repository
    memory: SandboxMemory
    pool: SlotPool
    mailer: ReadyMailer
    watchdog: IdleWatchdog
    runner: ToolRunner
    mcp: MCPServer
    auth: AuthParts | None
    manager: ExperimentManager
    jobs: JobRegistry
    backend: DockerBackend
    metrics: Metrics
    store: SlotStore | None = None

    async def start(self) -> None:
        """Prepare the state dir, the schema and the slots; start the watchdog.

        Raises:
            StateDirUnusable: the state dir cannot be created or written.
            DatabaseUnavailable: the database cannot be reached or migrated.
            SlotsMissing: slots of the pool were never provisioned.
            PoolError: the slot storage cannot be opened.
        """
        prepare_state_dir(self.settings)
        await upgrade_schema(self.engine)
        self.store = await open_slot_store(self.settings)
        await self.pool.open(self.store)
        recovered = await self.manager.recover(self.pool.holders())
        log.info("experiments.recovered", **recovered)
        self.watchdog.start()
        log.info(
            "service.started",
            version=service_version(),
            auth=self.settings.auth,
            slots=self.settings.slot_backend,
            pool_size=self.settings.pool_size,
        )

    async def stop(self) -> None:
        await self.watchdog.stop()
        # Containers keep running: a restart finds them again (work is never lost to a
        # restart); their jobs are marked lost, and orphans are swept at start-up.
        await self.jobs.close()
        await self.backend.aclose()
        await self.mailer.close()
        if self.store is not None:
            await self.store.close()
        await self.engine.dispose()

    async def pool_stats(self) -> PoolStats:
        stats = self.pool.stats()
        return PoolStats(
            size=stats.size,
            busy=stats.busy,
            free=stats.free,
            reserved=stats.reserved,
            queued=stats.queued,
            oldest_wait_s=stats.oldest_wait_s,
        )


def prepare_state_dir(settings: Settings) -> None:
    state_dir = settings.state_dir
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = state_dir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StateDirUnusable(
            f"The state dir {state_dir} cannot be written ({exc.strerror}); set "
            "SANDBOX_MCP_STATE_DIR to a folder this user owns.",
            reason=exc.strerror,
        ) from exc


async def open_slot_store(settings: Settings) -> SlotStore:
    """Open the configured slot storage and make sure every slot of the pool exists.

    The dir backend lives in the server's own state dir, so the server creates
    missing folders itself; ZFS datasets are created only by `sandbox-mcp
    provision`, which needs administrator rights.
    """
    size = settings.pool_size
    if settings.slot_backend == "dir":
        await provision_dir(settings.state_dir, size, owner=None)
        store: SlotStore = await DirSlotStore.open(settings.state_dir)
    else:
        assert settings.zfs_parent is not None  # validated by Settings
        store = await ZfsSlotStore.open(settings.zfs_parent)
    missing = await store.missing(size)
    if missing:
        await store.close()
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise SlotsMissing(
            f"{len(missing)} of {size} slots are missing or unusable ({shown}); run "
            f"`sandbox-mcp provision --slots {size} --zfs-parent {settings.zfs_parent}` as root "
            "(it repairs, and never touches a leased slot)."
        )
    return store


@dataclass
class AuthParts:
    """The anonymous OAuth 2.1 authorization server (``SANDBOX_MCP_AUTH=oauth``)."""

    config: AuthConfig
    store: SqlAuthStore
    registrar: Registrar
    flow: SigninFlow
    tokens: TokenService

    async def housekeeping(self) -> None:
        now = time.time()
        await self.store.delete_expired(now)
        await self.store.delete_stale_clients(now - self.config.client_ttl_without_grant_s)


def build_auth(settings: Settings, engine: AsyncEngine, mailer: ReadyMailer) -> AuthParts:
    prepare_state_dir(settings)
    given = settings.token_key.get_secret_value() if settings.token_key else None
    key_file = settings.state_dir / "token-hmac.key"
    try:
        hasher = TokenHasher(load_or_create_key(key_file, given))
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
        )
        if settings.client_metadata_documents
        else None
    )
    codes: ExpiringMap[CodeGrant] = ExpiringMap(config.max_codes)
    remember = mailer.remember if mailer.enabled else None
    return AuthParts(
        config=config,
        store=store,
        registrar=Registrar(store),
        flow=SigninFlow(
            config, ClientDirectory(store, documents), hasher, codes, remember_email=remember
        ),
        tokens=TokenService(config, store, hasher, codes),
    )


def build_services(settings: Settings, extra_tools: ToolRegistrar | None = None) -> Services:
    metrics = Metrics()
    configure_logging(settings.log_level, count_events=metrics.count_event)
    warn_if_sandboxes_cannot_write(settings)
    engine = create_engine(settings.effective_database_url)
    repository = Repository(engine)
    memory = SandboxMemory()
    mailer = ReadyMailer(
        smtp_options(settings),
        public_url=settings.effective_public_url,
        max_per_hour=settings.smtp_max_per_hour,
    )
    jobs = JobRegistry()
    backend = build_backend(settings)
    manager = ExperimentManager(
        ExperimentRecords(engine), backend, jobs, experiment_options(settings)
    )
    hooks = _Hooks(memory, manager)
    pool = SlotPool(
        SqlPoolState(engine),
        size=settings.pool_size,
        idle_timeout_s=settings.idle_timeout_s,
        before_reset=hooks.before_reset,
        on_reserved=mailer.sandbox_ready,
    )
    auth = build_auth(settings, engine, mailer) if settings.auth == "oauth" else None
    chores = [mailer.housekeeping, manager.shelf.expire]
    if auth is not None:
        chores.append(auth.housekeeping)
    watchdog = IdleWatchdog(
        pool,
        interval_s=min(5.0, settings.idle_timeout_s / 10),
        is_busy=manager.is_busy,
        housekeeping=chores,
    )
    identity: Identity = LocalIdentity() if auth is None else TokenIdentity()
    runner = ToolRunner(
        identity,
        repository,
        memory,
        pool,
        queue_wait_s=settings.queue_wait_s,
        on_call=metrics.tool_call,
    )
    mcp = SandboxMCPServer(
        "sandbox-mcp",
        version=service_version(),
        instructions=INSTRUCTIONS,
        log_level=settings.log_level,
    )
    register_tools(mcp, runner, pool)
    register_experiment_tools(mcp, runner, manager)
    register_file_tools(mcp, runner, manager)
    register_evidence_tools(mcp, runner, manager)
    register_resources(mcp, ResourceReader(identity, memory, pool), manager)
    if extra_tools is not None:
        extra_tools(mcp, runner)
    return Services(
        settings=settings,
        engine=engine,
        repository=repository,
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


def slots_base(settings: Settings) -> Path:
    """The folder every slot lies under: a workspace outside it is never mounted."""
    if settings.slot_backend == "dir":
        return settings.state_dir / "slots"
    assert settings.zfs_parent is not None
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            ["zfs", "get", "-H", "-o", "value", "mountpoint", settings.zfs_parent],  # noqa: S607
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigurationError(
            f"Cannot read the mountpoint of {settings.zfs_parent}; is ZFS running and the "
            "dataset provisioned (sandbox-mcp provision)?"
        ) from exc
    return Path(done.stdout.strip())


def build_backend(settings: Settings) -> DockerBackend:
    return DockerBackend(
        slots_base=slots_base(settings),
        allowed_images=settings.image_list,
        host_paths=(
            (settings.state_dir, settings.host_state_dir) if settings.host_state_dir else None
        ),
        default_image=settings.default_image,
        ceilings=Ceilings(
            cpus=settings.max_cpus,
            memory_mb=settings.max_memory_mb,
            pids=settings.max_pids,
            timeout_s=settings.max_command_timeout_s,
        ),
        max_containers=settings.max_containers,
        user=settings.sandbox_user,
        allow_egress=settings.allow_egress,
        allow_git_egress=settings.allow_git_egress,
        # DOCKER_HOST and friends are honoured, as by `docker` itself and `check`.
        client_factory=lambda: docker.from_env(timeout=60),
    )


def warn_if_sandboxes_cannot_write(settings: Settings) -> None:
    """Only root can hand a workspace to another uid: a server that is not root must run
    sandbox commands as its own uid, or they can read their workspace but not write it."""
    uid = int(settings.sandbox_user.split(":")[0])
    if os.geteuid() != 0 and uid != os.geteuid():
        log.warning(
            "config.sandbox_user_cannot_write",
            sandbox_user=settings.sandbox_user,
            server_uid=os.geteuid(),
            fix=f"set SANDBOX_MCP_SANDBOX_USER={os.geteuid()}:{os.getegid()} or run as root",
        )


def experiment_options(settings: Settings) -> ExperimentOptions:
    uid, gid = (int(part) for part in settings.sandbox_user.split(":"))
    return ExperimentOptions(
        hosted=settings.auth == "oauth",
        default_image=settings.default_image,
        max_experiments=settings.max_experiments,
        sync_wait_s=settings.sync_wait_s,
        max_timeout_s=settings.max_command_timeout_s,
        # Only root can hand files to the container's user; otherwise run the server
        # as that user (SANDBOX_MCP_SANDBOX_USER = the server's uid:gid).
        owner=Owner(uid, gid) if os.geteuid() == 0 else None,
        snapshot_excludes=settings.snapshot_exclude_list,
        strict_env=settings.strict_env_denylist,
        egress_allowed=settings.allow_egress,
        ceilings={
            "cpus": settings.max_cpus,
            "memory_mb": settings.max_memory_mb,
            "pids": settings.max_pids,
            "timeout_s": settings.max_command_timeout_s,
        },
        artifact_dir=settings.state_dir / "artifacts",
        artifact_ttl_s=settings.artifact_ttl_s,
    )


def smtp_options(settings: Settings) -> SmtpOptions | None:
    if not settings.smtp_host:
        return None
    return SmtpOptions(
        host=settings.smtp_host,
        port=settings.smtp_port,
        security=settings.smtp_security,
        sender=settings.smtp_sender,
        username=settings.smtp_user,
        password=settings.smtp_password.get_secret_value() if settings.smtp_password else None,
    )


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """Host and Origin allow-lists derived from PUBLIC_URL (DNS-rebinding protection)."""
    public = urlsplit(settings.effective_public_url)
    assert public.hostname is not None  # validated by Settings
    default_port = 443 if public.scheme == "https" else 80
    port = public.port or default_port
    host = f"[{public.hostname}]" if ":" in public.hostname else public.hostname
    hosts = {f"{host}:{port}"}
    origins = {f"{public.scheme}://{host}:{port}"}
    if port == default_port:
        hosts.add(host)
        origins.add(f"{public.scheme}://{host}")
    if is_loopback_host(settings.host) and is_loopback_host(public.hostname):
        # Local use: any loopback spelling of this server is the same server.
        for name in ("127.0.0.1", "localhost", "[::1]"):
            hosts.add(f"{name}:{settings.port}")
            origins.add(f"http://{name}:{settings.port}")
    return TransportSecuritySettings(allowed_hosts=sorted(hosts), allowed_origins=sorted(origins))


def build_app(settings: Settings, *, extra_tools: ToolRegistrar | None = None) -> Starlette:
    """The HTTP application: ``/mcp``, ``/health``, ``/metrics`` (and, with OAuth, the
    sign-in routes).

    ``extra_tools`` lets the test suite register a tool of its own (for example a
    slot-taking probe) on the same runner as the real ones.
    """
    services = build_services(settings, extra_tools)
    mcp_app = services.mcp.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=transport_security(settings),
        host=settings.host,
    )
    health = HealthEndpoint(
        version=service_version(),
        ping_database=services.repository.ping,
        pool_stats=services.pool_stats,
        probe_runtime=probe_docker,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await services.start()
        try:
            # A mounted app's own lifespan never runs: enter the SDK's session manager here.
            async with services.mcp.session_manager.run():
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
        )
        routes.append(Mount("/", app=BearerGate(mcp_app, auth.tokens, auth.config)))
    # Behind the TLS proxy every answer tells browsers to stay on https.
    middleware = (
        [Middleware(StrictTransportSecurity)]
        if settings.effective_public_url.startswith("https://")
        else []
    )
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


async def run_stdio(settings: Settings) -> None:
    """Serve one local user over stdin/stdout (logs stay on stderr)."""
    services = build_services(settings)
    await services.start()
    try:
        await services.mcp.run_stdio_async()
    finally:
        await services.stop()


async def preflight(settings: Settings) -> None:
    """Fail before listening if the state dir, the database or the slots are unusable.

    Raises:
        StateDirUnusable: the state dir cannot be written.
        DatabaseUnavailable: the database cannot be reached or migrated.
        SlotsMissing: slots of the pool were never provisioned.
        PoolError: the slot storage cannot be opened.
    """
    await prepare_storage(settings)
    store = await open_slot_store(settings)
    await store.close()


async def prepare_storage(settings: Settings) -> None:
    """Create the state dir and bring the schema up to date."""
    prepare_state_dir(settings)
    engine = create_engine(settings.effective_database_url)
    try:
        await upgrade_schema(engine)
    finally:
        await engine.dispose()


async def check(settings: Settings) -> dict[str, object]:
    """What `sandbox-mcp check` reports: can this configuration serve? (changes nothing)."""
    state: dict[str, object] = {"path": str(settings.state_dir), "ok": True}
    try:
        prepare_state_dir(settings)
    except StateDirUnusable as exc:
        state = {"path": str(settings.state_dir), "ok": False, "reason": exc.message}
    database: dict[str, object] = {"ok": True}
    engine = create_engine(settings.effective_database_url)
    try:
        await Repository(engine).ping()
    except DatabaseUnavailable as exc:
        database = {"ok": False, "reason": exc.details["reason"]}
    finally:
        await engine.dispose()
    runtime = await probe_docker()
    ok = bool(state["ok"] and database["ok"] and runtime.reachable)
    return {
        "version": service_version(),
        "state_dir": state,
        "database": database,
        "runtime": runtime.as_dict(),
        "ok": ok,
    }


async def provision(
    settings: Settings, slots: int, zfs_parent: str | None, quota: str | None, owner: str | None
) -> dict[str, object]:
    """Create or repair ``slots`` slots; the leased ones (from the database) are left alone.

    Raises:
        StateDirUnusable, DatabaseUnavailable: as for ``preflight``.
        PoolError: provisioning failed (no pool, unknown owner, bad quota, ...).
    """
    await prepare_storage(settings)
    engine = create_engine(settings.effective_database_url)
    try:
        snapshot = await SqlPoolState(engine).load()
    finally:
        await engine.dispose()
    leased = {record.index for record in snapshot.slots}
    if zfs_parent:
        report = await provision_zfs(zfs_parent, slots, quota=quota, owner=owner, leased=leased)
    else:
        report = await provision_dir(settings.state_dir, slots, owner=owner, leased=leased)
    return {"backend": "zfs" if zfs_parent else "dir", "slots": slots, **asdict(report)}
