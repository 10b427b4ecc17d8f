"""``sandbox-mcp``: serve | check | provision.

Every failure a user can cause (a bad flag, a bad variable, a busy port, an
unwritable state dir, an unreachable database) ends in one line on stderr and
a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import sys
from collections.abc import Sequence
from typing import NoReturn

from sqlalchemy.engine import make_url

from app.errors import ServiceError
from app.observability import configure_logging
from app.settings import Settings, SettingsError, load_settings
from pool.errors import PoolError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox-mcp",
        description="A multi-tenant MCP server that gives AI agents disposable sandboxes.",
        epilog="Settings: SANDBOX_MCP_* environment variables (see docs/configuration.md).",
    )
    parser.add_argument(
        "--check", action="store_true", help="same as `sandbox-mcp check` (kept for old clients)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--transport", choices=["http", "stdio"], default="http")
    serve.add_argument("--host", help="bind address (overrides SANDBOX_MCP_HOST)")
    serve.add_argument("--port", type=_port, help="TCP port (overrides SANDBOX_MCP_PORT)")
    serve.add_argument(
        "--workers",
        type=_worker_count,
        help="server processes sharing the port (overrides SANDBOX_MCP_WORKERS; >1 needs "
        "PostgreSQL)",
    )
    # Internal: a child of `--workers` serves on the socket its parent bound.
    serve.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument(
        "--build-images",
        action="store_true",
        help="build the default sandbox image first if it is missing "
        "(deploy/build-base-image; needs root)",
    )
    commands.add_parser(
        "check", help="print the effective configuration and whether Docker and the database answer"
    )
    provision = commands.add_parser(
        "provision",
        help="create or repair the sandbox slots (idempotent; never touches a leased slot)",
    )
    provision.add_argument(
        "--slots", type=_slot_count, required=True, help="how many slots (slot-000 ...)"
    )
    provision.add_argument(
        "--zfs-parent", metavar="POOL/DATASET", help="create ZFS datasets below this one"
    )
    provision.add_argument("--quota", metavar="SIZE", help="ZFS quota per slot, e.g. 10G")
    provision.add_argument("--owner", metavar="USER", help="the user the server runs as")
    return parser


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def _worker_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (1-64)")
    return int(text)


def _slot_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a slot count (1-10000)")
    return int(text)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = _parser().parse_args(argv)
    if args.check or args.command == "check":
        sys.exit(_check())
    if args.command == "provision":
        if args.quota and not args.zfs_parent:
            _parser().error("--quota needs --zfs-parent (the dir backend has no quotas)")
        sys.exit(_provision(args.slots, args.zfs_parent, args.quota, args.owner))
    if args.command == "serve":
        sys.exit(
            _serve(
                args.transport,
                args.host,
                args.port,
                args.workers,
                args.listen_fd,
                args.build_images,
            )
        )
    _parser().print_help(sys.stderr)
    sys.exit(EXIT_USAGE)


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"sandbox-mcp: {message}", file=sys.stderr)
    return code


def _load(**overrides: object) -> Settings | None:
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        for line in exc.lines:
            _fail(line)
        return None
    # Logs go to stderr from the start, so stdout carries only a command's JSON.
    configure_logging(settings.server.log_level)
    return settings


def _serve(
    transport: str,
    host: str | None,
    port: int | None,
    workers: int | None = None,
    listen_fd: int | None = None,
    build_images: bool = False,
) -> int:
    # stdio has no network front door: it is local mode by definition.
    settings = _load(
        host=host, port=port, workers=workers, auth="none" if transport == "stdio" else None
    )
    if settings is None:
        return EXIT_USAGE
    from app.ops import workers as processes

    refused = processes.refusal(settings.server.workers, settings.storage.effective_database_url)
    if refused is not None:
        return _fail(refused, EXIT_USAGE)
    if settings.server.workers > 1 and transport == "stdio":
        return _fail("--workers serves HTTP only; stdio is one local user", EXIT_USAGE)
    from app.root.state_dir import prepare_state_dir
    from app.root.state_lock import hold_state_dir

    try:
        # Before anything reads the state: a second process on a SQLite state dir is
        # refused here, and this one keeps the lock to its end.
        prepare_state_dir(settings.storage)
        hold_state_dir(settings.storage)
    except ServiceError as exc:
        return _fail(exc.message)
    # Imported late: the heavy SDK imports only when serving.
    from app.ops import admin
    from app.ops.base_images import ensure_default_image
    from app.root import main as root

    try:
        if transport == "stdio":
            asyncio.run(ensure_default_image(settings.runtime, build=build_images))
            asyncio.run(root.run_stdio(settings))
            return EXIT_OK
        if settings.server.workers > 1 and listen_fd is None:
            asyncio.run(admin.preflight(settings))  # once: the schema, the state dir, the slots
            asyncio.run(ensure_default_image(settings.runtime, build=build_images))
            sock = _bind(settings.server.host, settings.server.port)
            argv = processes.child_argv(
                ["--host", settings.server.host, "--port", str(settings.server.port)]
            )
            return processes.Supervisor(sock, settings.server.workers, argv).run()
        app = root.build_app(settings)
        asyncio.run(admin.preflight(settings))
        if listen_fd is None:
            # Docker and the default image: logged with what to do, built only when asked.
            asyncio.run(ensure_default_image(settings.runtime, build=build_images))
        sock = (
            _bind(settings.server.host, settings.server.port)
            if listen_fd is None
            else _inherited(listen_fd)
        )
    except (ServiceError, PoolError) as exc:
        return _fail(exc.message)
    except OSError as exc:
        return _fail(
            f"cannot listen on {settings.server.host}:{settings.server.port} ({exc.strerror}); "
            "choose another with --port or SANDBOX_MCP_PORT"
        )
    except KeyboardInterrupt:
        return EXIT_OK
    import uvicorn

    from app.http.connection_guard import ACCEPT_BACKLOG, guard_for
    from app.http.graceful import GracefulServer

    config = uvicorn.Config(
        app,
        log_config=None,
        lifespan="on",
        proxy_headers=False,
        http=guard_for(
            max_connections=settings.server.max_connections,
            header_timeout_s=settings.server.header_timeout_s,
            body_timeout_s=settings.server.body_timeout_s,
        ),
        backlog=ACCEPT_BACKLOG,
    )
    server = GracefulServer(config, getattr(app.state, "begin_shutdown", None))
    # What start-up built (modules, schemas, the app: ~150,000 objects) lives as long as
    # the process. Frozen out of the collector's sight, a full collection scans only what
    # serving allocated; unfrozen, each one walked them all (100 ms measured here).
    gc.freeze()
    tune_collector()
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    # uvicorn leaves started False when the lifespan failed; its log says why.
    return EXIT_OK if server.started else EXIT_FAILED


# The young generation's collection threshold while serving (CPython's default: 700).
YOUNG_GC_THRESHOLD = 10_000


def tune_collector() -> None:
    """Collect the young generation every 10,000 net allocations, not every 700.

    The threshold counts container objects allocated and not yet freed. Sixteen light
    calls in flight hold more than 700 between them (coroutines, closures, the SDK's
    per-request models), so at the default a young collection ran every ~6 calls,
    walked those live objects, promoted them, and the next older generation followed:
    about 1 s of collections per 9,000 ``sandbox_status`` calls in-process against
    75 ms at 10,000 (bench_light_calls_wrk.py). What a higher threshold lets wait is
    cyclic garbage (the SDK leaves ~11 objects a call), at most 10,000 objects."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)


def _inherited(fd: int) -> socket.socket:
    """The listening socket a ``--workers`` parent bound and passed down."""
    return socket.socket(fileno=fd)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and accepted sockets inherit it. With proto 0 every response waited out the
    # client's delayed ACK (Nagle): about 40 ms added to every request, seen in
    # bench_light_calls (48 ms per sequential call against 0.8 ms for the bare SDK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _check() -> int:
    settings = _load()
    if settings is None:
        return EXIT_USAGE
    from app.ops import admin

    report = asyncio.run(admin.check(settings))
    report = {"config": public_config(settings), **report}
    print(json.dumps(report, indent=2, default=str))
    return EXIT_OK if report["ok"] else EXIT_FAILED


def _provision(slots: int, zfs_parent: str | None, quota: str | None, owner: str | None) -> int:
    settings = _load()
    if settings is None:
        return EXIT_USAGE
    from app.ops import admin

    try:
        report = asyncio.run(admin.provision(settings, slots, zfs_parent, quota, owner))
    except (ServiceError, PoolError) as exc:
        return _fail(exc.message)
    print(json.dumps(report, indent=2))
    return EXIT_OK


def public_config(settings: Settings) -> dict[str, object]:
    """The effective configuration with every secret value masked."""
    config = settings.by_variable(mode="json")
    config["database_url"] = make_url(settings.storage.effective_database_url).render_as_string(
        hide_password=True
    )
    config["public_url"] = settings.server.effective_public_url
    return config
