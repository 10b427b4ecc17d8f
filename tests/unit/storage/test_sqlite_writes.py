"""SQLite's writers take turns in order, the sign-in's first (issue 25: under the
fairness bench's attack a token grant's first write waited up to 2.8 s for SQLite's
lock, passed over by the tenants' writers while it polled)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.db import create_engine
from app.storage.signin.front_door import front_door_engine
from app.storage.sqlite_writes import WriteTurns, take_turns


async def test_turns_are_given_in_order_the_front_door_s_first() -> None:
    turns = WriteTurns()
    assert await turns.take(first=False)
    order: list[str] = []

    async def writer(name: str, first: bool) -> None:
        assert await turns.take(first)
        order.append(name)
        turns.give_back()

    waiting = [asyncio.create_task(writer(f"tenant-{n}", False)) for n in range(3)]
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(writer("sign-in", True)))
    await asyncio.sleep(0)
    turns.give_back()
    await asyncio.gather(*waiting)
    assert order == ["sign-in", "tenant-0", "tenant-1", "tenant-2"]
    assert await turns.take(first=False)  # free again


async def test_a_writer_cancelled_while_waiting_passes_its_turn_on() -> None:
    turns = WriteTurns()
    assert await turns.take(first=False)
    cancelled = asyncio.create_task(turns.take(first=True))
    after = asyncio.create_task(turns.take(first=False))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    turns.give_back()
    assert await after


@dataclass
class Engines:
    service: AsyncEngine
    front_door: AsyncEngine
    turns: WriteTurns


async def until_waiting(turns: WriteTurns, count: int) -> None:
    """Until ``count`` writers wait; bounded by a generous time, not the machine's speed."""
    deadline = time.monotonic() + 60
    while turns.waiting < count and time.monotonic() < deadline:  # noqa: ASYNC110 - a count
        await asyncio.sleep(0.01)
    assert turns.waiting == count


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[Engines]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"
    service, front_door = create_engine(url), front_door_engine(url)
    turns = WriteTurns()  # as in_turns joins them, with the turns at hand
    take_turns(service, turns, first=False)
    take_turns(front_door, turns, first=True)
    async with service.begin() as connection:
        await connection.execute(
            sa.text("CREATE TABLE writes (id INTEGER PRIMARY KEY AUTOINCREMENT, who TEXT)")
        )
    yield Engines(service, front_door, turns)
    await service.dispose()
    await front_door.dispose()


async def test_the_sign_in_writes_before_tenants_who_asked_earlier(engines: Engines) -> None:
    service, front_door = engines.service, engines.front_door
    insert = sa.text("INSERT INTO writes (who) VALUES (:who)")
    holding = await service.connect()
    await holding.begin()
    await holding.execute(insert, {"who": "holder"})  # holds SQLite's write lock

    async def write(engine: AsyncEngine, who: str) -> None:
        async with engine.begin() as connection:
            await connection.execute(insert, {"who": who})

    tenants = [asyncio.create_task(write(service, f"tenant-{n}")) for n in range(8)]
    await until_waiting(engines.turns, 8)
    sign_in = asyncio.create_task(write(front_door, "sign-in"))
    await until_waiting(engines.turns, 9)
    await holding.commit()
    await holding.close()
    await asyncio.gather(*tenants, sign_in)
    async with service.connect() as connection:
        order = list(
            (await connection.execute(sa.text("SELECT who FROM writes ORDER BY id"))).scalars()
        )
    assert order[:2] == ["holder", "sign-in"]
    assert sorted(order[2:]) == [f"tenant-{n}" for n in range(8)]
