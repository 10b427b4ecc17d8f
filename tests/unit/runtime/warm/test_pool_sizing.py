"""The warm pool follows its demand (app.runtime.warm.pool with app.runtime.warm.demand):
it grows to the target, starts several at once, and shrinks back to its floor; on a fake
backend and a fake clock (the real engine: tests/e2e/test_warm_burst.py)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from runtime_fakes import FakeBackend

from app.runtime.backend import Container, ContainerSpec
from app.runtime.warm.demand import WarmBudget, WarmDemand
from app.runtime.warm.pool import WarmPool
from pool.slots import Slot, name_of


class Backend(FakeBackend):
    """A fake warm backend that counts the creates under way at once. Each create waits
    (5 s at most) until ``overlap`` are under way: a pool that starts them one by one
    is seen doing so however fast the machine is, and one that starts several at once
    is seen doing so however slowly its folders are made (a 10 ms create overlapped
    only 2 of 3 on a loaded machine)."""

    def __init__(self, overlap: int = 1) -> None:
        super().__init__()
        self.at_once = 0
        self.most_at_once = 0
        self._overlapped = asyncio.Event()
        self._overlap = overlap

    def expect_overlap(self, overlap: int) -> None:
        """From now on each create waits until ``overlap`` are under way: set before the
        pass that must start them together, not before one that makes fewer (the floor's
        two), whose creates would each wait the whole 5 s for a third that never comes."""
        self._overlap = overlap
        self._overlapped.clear()

    async def create(self, spec: ContainerSpec) -> Container:
        self.at_once += 1
        self.most_at_once = max(self.most_at_once, self.at_once)
        if self.at_once >= self._overlap:
            self._overlapped.set()
        try:
            await asyncio.sleep(0.01)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._overlapped.wait(), 5)
            return await super().create(spec)
        finally:
            self.at_once -= 1

    async def running(self) -> set[str]:
        return set(self.containers)

    def claim(self, container_id: str, sandbox_label: str) -> None:
        pass

    async def hand_over(self, warm: Container, spec: ContainerSpec) -> Container | None:
        return warm


def slots(base: Path, n: int) -> list[Slot]:
    made = []
    for index in range(n):
        root = base / name_of(index)
        root.mkdir()
        made.append(Slot(index, name_of(index), root))
    return made


async def test_the_pool_grows_with_sign_ins_and_shrinks_to_its_floor(tmp_path: Path) -> None:
    now = [0.0]
    policy = WarmDemand(WarmBudget(2, 6, 10_000), clock=lambda: now[0])
    free = slots(tmp_path, 10)
    backend = Backend()
    pool = WarmPool(
        backend, lambda n: free[:n], count=2, image="img:1", demand=policy, concurrent_makes=3
    )
    assert await pool.fill() == 2
    for i in range(10):  # ten sign-ins: past the budget of 6
        policy.signed_in(f"key-{i}", f"10.0.0.{i}")
    backend.expect_overlap(3)
    assert await pool.fill() == 4
    assert pool.ready == 6 == len(backend.containers)
    assert backend.most_at_once == 3  # several at once, within concurrent_makes
    now[0] += 300  # the sign-ins never called: their signal faded
    assert await pool.fill() == 0
    assert pool.ready == 2 == len(backend.containers)
    # The slots handed out last lost theirs; the next ones to go out keep them.
    assert sorted(pool.ready_slots()) == [free[0].root, free[1].root]
    assert not any(p.name.startswith(".warm-") for s in free[2:] for p in s.root.iterdir())
    await pool.stop()
    assert backend.containers == {}


async def test_without_demand_the_pool_keeps_its_count(tmp_path: Path) -> None:
    free = slots(tmp_path, 4)
    pool = WarmPool(Backend(), lambda n: free[:n], count=2, image="img:1")
    assert await pool.fill() == 2
    assert await pool.fill() == 0
    assert pool.ready == 2
    await pool.stop()


async def test_a_lessee_whose_make_has_not_begun_goes_cold_at_once(tmp_path: Path) -> None:
    # One make at a time: slot-002's waits behind slot-000's and slot-001's. Its lessee
    # must not wait for both; its make is dropped when its turn comes.
    free = slots(tmp_path, 3)
    backend = Backend()
    pool = WarmPool(backend, lambda n: free[:n], count=3, image="img:1", concurrent_makes=1)
    filling = asyncio.create_task(pool.fill())
    await asyncio.sleep(0)  # the pass marked all three and began the first
    spec = ContainerSpec("exp-1", "fp-lessee", "img:1", free[2].root / "exp-1" / "workspace")
    assert await pool.take(free[2].root, spec, free[2].root / "exp-1") is None
    assert await filling == 2
    assert sorted(pool.ready_slots()) == [free[0].root, free[1].root]
    await pool.stop()


async def test_a_fall_in_demand_never_removes_the_containers_of_leased_slots(
    tmp_path: Path,
) -> None:
    """Issue 26's burst, once its first leases were written together: the leases ended
    the sign-ins' signal, and the pool shrank by the containers of the slots just leased,
    before their lessees' creates took them (59 of 100 creates went cold)."""
    now = [0.0]
    policy = WarmDemand(WarmBudget(2, 6, 10_000), clock=lambda: now[0])
    every = slots(tmp_path, 8)
    leased: set[Path] = set()

    def next_free(n: int) -> list[Slot]:
        return [slot for slot in every if slot.root not in leased][:n]

    pool = WarmPool(Backend(), next_free, count=2, image="img:1", demand=policy)
    for i in range(4):
        policy.signed_in(f"key-{i}", f"10.0.0.{i}")
    await pool.fill()
    assert sorted(pool.ready_slots()) == [slot.root for slot in every[:6]]
    leased.update(slot.root for slot in every[:4])  # the four sign-ins' first calls
    now[0] += 300  # their signal is gone: the target falls to the floor
    assert await pool.fill() == 0
    # The floor's two stay in the free slots; the leased slots keep theirs for their lessee.
    assert sorted(pool.ready_slots()) == [slot.root for slot in every[:6]]
    for slot in every[:4]:
        spec = ContainerSpec("exp-1", "fp", "img:1", slot.root / "exp-1" / "workspace")
        assert await pool.take(slot.root, spec, slot.root / "exp-1") is not None
    assert sorted(pool.ready_slots()) == [every[4].root, every[5].root]
    await pool.stop()


async def test_the_containers_of_leased_slots_count_in_the_budget(tmp_path: Path) -> None:
    """Not stock (their lessees' creates come for them), but containers all the same: a
    pool whose target stays at its ceiling while some of its slots are leased makes no
    more than the ceiling allows (the e2e burst saw 7 waiting with a budget of 6)."""
    policy = WarmDemand(WarmBudget(2, 6, 10_000), clock=lambda: 0.0)
    every = slots(tmp_path, 12)
    leased: set[Path] = set()

    def next_free(n: int) -> list[Slot]:
        return [slot for slot in every if slot.root not in leased][:n]

    pool = WarmPool(Backend(), next_free, count=2, image="img:1", demand=policy)
    for i in range(8):  # eight sign-ins without a first call: the target is the ceiling
        policy.signed_in(f"key-{i}", f"10.0.0.{i}")
    await pool.fill()
    assert pool.ready == 6
    leased.update(slot.root for slot in every[:2])  # two first calls lease their slots
    await pool.fill()  # the target is still the ceiling: the six are all it may hold
    assert pool.ready == 6
    assert sorted(pool.ready_slots()) == [slot.root for slot in every[:6]]
    await pool.stop()
