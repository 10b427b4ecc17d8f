"""The engine's creation gate (app.runtime.docker.creates): real requests in arrival
order, background ones (prepared containers) only when no real one waits."""

from __future__ import annotations

import asyncio

import pytest

from app.runtime.docker.creates import CreateGate


class Engine:
    """Records the order creations reach the engine; each holds its place until released."""

    def __init__(self, gate: CreateGate) -> None:
        self.gate = gate
        self.order: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    async def create(self, name: str, *, background: bool = False) -> None:
        self.release[name] = asyncio.Event()
        async with self.gate.place(background=background):
            self.order.append(name)
            await self.release[name].wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_real_requests_go_in_arrival_order_within_the_limit() -> None:
    engine = Engine(CreateGate(2))
    tasks = [asyncio.create_task(engine.create(f"r{i}")) for i in range(5)]
    await settle()
    assert engine.order == ["r0", "r1"]
    for i in range(5):
        engine.release[f"r{i}"].set()
        await settle()
    await asyncio.gather(*tasks)
    assert engine.order == ["r0", "r1", "r2", "r3", "r4"]
    assert engine.gate.in_use == 0


async def test_a_background_creation_yields_to_every_real_request_that_waits() -> None:
    engine = Engine(CreateGate(1))
    first = asyncio.create_task(engine.create("r0"))
    await settle()
    prepared = asyncio.create_task(engine.create("p0", background=True))
    await settle()
    later = [asyncio.create_task(engine.create(f"r{i}")) for i in (1, 2)]
    await settle()
    assert engine.gate.waiting == (2, 1)
    for name in ("r0", "r1", "r2"):
        engine.release[name].set()
        await settle()
    assert engine.order == ["r0", "r1", "r2", "p0"]  # arrived before r1 and r2, served after
    engine.release["p0"].set()
    await asyncio.gather(first, prepared, *later)


async def test_background_creations_leave_places_for_real_requests() -> None:
    engine = Engine(CreateGate(4))  # half of the places at most for background ones
    background = [asyncio.create_task(engine.create(f"p{i}", background=True)) for i in range(4)]
    await settle()
    assert engine.order == ["p0", "p1"]
    real = [asyncio.create_task(engine.create(f"r{i}")) for i in range(2)]
    await settle()
    assert engine.order == ["p0", "p1", "r0", "r1"]  # at once: two places were kept free
    for name in ("p0", "p1", "r0", "r1", "p2", "p3"):
        engine.release[name].set()
        await settle()
    await asyncio.gather(*background, *real)
    assert engine.gate.in_use == 0


async def test_a_cancelled_waiter_gives_its_turn_on() -> None:
    engine = Engine(CreateGate(1))
    first = asyncio.create_task(engine.create("r0"))
    await settle()
    prepared = asyncio.create_task(engine.create("p0", background=True))
    real = asyncio.create_task(engine.create("r1"))
    await settle()
    prepared.cancel()  # its owner gave it up while it waited: nothing reached the engine
    with pytest.raises(asyncio.CancelledError):
        await prepared
    engine.release["r0"].set()
    await settle()
    assert engine.order == ["r0", "r1"]
    engine.release["r1"].set()
    await asyncio.gather(first, real)
    assert engine.gate.in_use == 0
    assert engine.gate.waiting == (0, 0)


async def test_a_waiter_cancelled_just_after_its_turn_came_passes_the_place_on() -> None:
    engine = Engine(CreateGate(1))
    first = asyncio.create_task(engine.create("r0"))
    await settle()
    second = asyncio.create_task(engine.create("r1"))
    third = asyncio.create_task(engine.create("r2"))
    await settle()
    engine.release["r0"].set()
    await asyncio.sleep(0)  # r0 leaves and hands its place to r1, not yet resumed
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    await settle()
    assert engine.order == ["r0", "r2"]
    engine.release["r2"].set()
    await asyncio.gather(first, third)
    assert engine.gate.in_use == 0
