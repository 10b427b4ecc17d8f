"""Which of several processes runs network "restricted"'s Squid: one at a time, elected
on PostgreSQL apart from the watchdog, and another once the first lets go (or dies)."""

from __future__ import annotations

import pytest
from db_testkit import fresh_postgres

from app.storage.db import create_engine
from app.storage.slots.pool_pg_store import EGRESS_LOCK, leadership_for

pytestmark = pytest.mark.integration


async def test_one_process_runs_squid_apart_from_the_watchdog_and_another_takes_over() -> None:
    async with fresh_postgres() as url:
        engines = [create_engine(url), create_engine(url)]  # two processes
        try:
            first, second = (leadership_for(e, EGRESS_LOCK, "egress") for e in engines)
            watchdog = leadership_for(engines[1])
            assert await first.is_leader() is True
            assert await second.is_leader() is False
            assert await first.is_leader() is True, "kept while its session lives"
            assert await watchdog.is_leader() is True, "the watchdog is another election"
            await first.close()  # its process stops (or dies: the session ends alike)
            assert await second.is_leader() is True
            await watchdog.close()
            await second.close()
        finally:
            for engine in engines:
                await engine.dispose()
