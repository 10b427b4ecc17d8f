"""Shared fixtures: every test gets its own state dir and a clean SANDBOX_MCP_* environment."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from db_testkit import migrated_sqlite
from dns_testkit import SlowNameserver
from docker_testkit import engine_present, remove_containers_mounting
from e2e_server import Servers, started_below
from mounts_testkit import unmount_below
from sqlalchemy.ext.asyncio import AsyncEngine


@pytest.fixture(scope="session", autouse=True)
def no_mount_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Also what module- and session-scoped fixtures mounted, once they are done."""
    yield
    unmount_below(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session", autouse=True)
def no_container_left_behind(
    tmp_path_factory: pytest.TempPathFactory, no_mount_left_behind: None
) -> Iterator[None]:
    """Removes, when the session ends, every container that mounts anything below this
    session's basetemp: what the servers that tests started and stopped in their own
    bodies (``start_server``) left running for a restart that never came. Under
    pytest-xdist the basetemp is this worker's own (``.../popen-gwN``), so a worker
    never removes another worker's or another session's containers. Before the mounts
    are undone (``no_mount_left_behind`` is torn down after it)."""
    yield
    if engine_present():  # else nothing can have been made (a unit-only run, no Docker)
        remove_containers_mounting(tmp_path_factory.getbasetemp())


def logs_through_logging() -> None:
    """structlog's events handed to the standard library's logging, as the server hands
    them, with no handler of ours: pytest captures each test's records (shown when it
    fails), and nothing is printed. structlog's defaults print console lines on stdout
    instead ("[info] slot.trash_deleted"), and a background thread that logs after its
    test (a slot's trash deleted late) wrote them straight into the test output."""
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.stdlib.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(default=str),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: a test that configures logging its own way must reach every logger.
        cache_logger_on_first_use=False,
    )


@pytest.fixture(scope="session", autouse=True)
def quiet_logs() -> Iterator[None]:
    """Also: no logger is ever cached in the test process. The server's configure_logging
    caches each logger on first use (for speed); in a process that configures logging
    again and again, a logger cached under one configuration keeps that configuration's
    processor list, and ``capture_logs`` (which edits the current list) no longer sees its
    events: a test's verdict then depended on which tests ran before it in its process."""
    configure = structlog.configure

    def configure_uncached(**settings: Any) -> None:
        configure(**{**settings, "cache_logger_on_first_use": False})

    structlog.configure = configure_uncached  # type: ignore[assignment]
    logs_through_logging()
    yield
    structlog.configure = configure  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("SANDBOX_MCP_") and not name.startswith("SANDBOX_MCP_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SANDBOX_MCP_STATE_DIR", str(tmp_path / "state"))
    yield
    # The containers of the servers this test started in its own folder (a stopped
    # server keeps them for a restart): gone now, not when the session ends, so that
    # a run's hundred do not pile up meanwhile. Only tests that started a server ask
    # the engine.
    if started := started_below(tmp_path):
        remove_containers_mounting(*started)
    unmount_below(tmp_path)
    # A test that configured logging onto its captured stream must not leave the
    # next test writing to a closed one.
    logging.getLogger().handlers.clear()
    logs_through_logging()


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A migrated SQLite database of this test's own."""
    engine = await migrated_sqlite(tmp_path)
    yield engine
    await engine.dispose()


@pytest.fixture
def slow_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowNameserver]:
    """getaddrinfo as a nameserver that never answers for ``*.slow.example`` makes it
    (see ``dns_testkit.SlowNameserver``); released when the test ends, so no lookup
    thread outlives it by long."""
    nameserver = SlowNameserver().install(monkeypatch)
    yield nameserver
    nameserver.release.set()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Servers]:
    """Starts servers for one test (``serve(**options)``); stops them when it ends and
    removes their containers."""
    servers = Servers(tmp_path)
    yield servers
    servers.close()


@pytest.fixture(scope="module")
def serve_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Starts servers for one module's tests; stops them when the module is done and
    removes their containers."""
    servers = Servers(tmp_path_factory.mktemp("servers"))
    yield servers
    servers.close()
