"""Shared fixtures: every test gets its own state dir and a clean SANDBOX_MCP_* environment."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
from db_testkit import migrated_sqlite
from mounts_testkit import unmount_below
from sqlalchemy.ext.asyncio import AsyncEngine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that restart a daemon the machine shares run last (stable otherwise): while
    it is down every other test that uses it would fail, and no test after them meets a
    daemon they restarted."""
    items.sort(key=lambda item: item.get_closest_marker("restarts_shared_daemon") is not None)


@pytest.fixture(scope="session", autouse=True)
def no_mount_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Also what module- and session-scoped fixtures mounted, once they are done."""
    yield
    unmount_below(tmp_path_factory.getbasetemp())


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("SANDBOX_MCP_") and not name.startswith("SANDBOX_MCP_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SANDBOX_MCP_STATE_DIR", str(tmp_path / "state"))
    yield
    unmount_below(tmp_path)
    # A test that configured logging onto its captured stream must not leave the
    # next test writing to a closed one.
    logging.getLogger().handlers.clear()
    structlog.reset_defaults()


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A migrated SQLite database of this test's own."""
    engine = await migrated_sqlite(tmp_path)
    yield engine
    await engine.dispose()
