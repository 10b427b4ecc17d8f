"""A sandbox's prepared container (app.runtime.warm.prepared): one per lessee, made after
its create for its next one, within what the warm budget leaves beside the warm pool,
and gone with the lease; on a fake backend (the real engine:
tests/e2e/test_prepared_over_http.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from runtime_fakes import FakeBackend

from app.runtime.backend import Container, ContainerSpec, Limits
from app.runtime.warm import prepared as prepared_module
from app.runtime.warm.demand import WarmBudget, WarmDemand
from app.runtime.warm.pool import WarmPool
from app.runtime.warm.prepared import PREFIX, PreparedContainers
from pool.slots import Slot, name_of


class Backend(FakeBackend):
    """A fake backend with prepared containers: counts the creations, can hold them at
    the "engine" (``gate``), and refuses a hand-over to another image."""

    def __init__(self) -> None:
        super().__init__()
        self.creations: list[ContainerSpec] = []
        self.gate: asyncio.Event | None = None
        self.admitted: list[bool] = []
        self.removed_by_label: list[str | None] = []

    async def create(self, spec: ContainerSpec, *, begun: asyncio.Event | None = None) -> Container:
        self.creations.append(spec)
        if self.gate is not None:
            await self.gate.wait()  # its turn at the engine has not come
        if begun is not None:
            begun.set()
        await asyncio.sleep(0.01)
        return await super().create(spec)

    async def running(self) -> set[str]:
        return set(self.containers)

    def claim(self, container_id: str, sandbox_label: str) -> None:
        pass

    async def hand_over(
        self, warm: Container, spec: ContainerSpec, *, admit: bool = False
    ) -> Container | None:
        self.admitted.append(admit)
        return warm if spec.image == warm.isolation.image else None

    async def remove_prepared(self, sandbox_label: str | None = None) -> int:
        self.removed_by_label.append(sandbox_label)
        gone = [
            cid
            for cid, spec in self.containers.items()
            if spec.prepared and sandbox_label in (None, spec.sandbox_label)
        ]
        for cid in gone:
            await self.remove(cid)
        return len(gone)


class Leases:
    """Which slot each sandbox key holds."""

    def __init__(self, tmp_path: Path, n: int) -> None:
        self.slots = []
        for index in range(n):
            root = tmp_path / name_of(index)
            root.mkdir()
            self.slots.append(Slot(index, name_of(index), root))
        self.held: dict[str, Slot] = {}

    async def holding(self, key: str) -> Slot | None:
        return self.held.get(key)

    def lease(self, key: str, index: int) -> Path:
        self.held[key] = self.slots[index]
        return self.slots[index].root


def spec_for(
    slot_root: Path, experiment: str, *, image: str = "img:1", address: str = ""
) -> ContainerSpec:
    return ContainerSpec(
        experiment,
        f"fp-{slot_root.name}",
        image,
        slot_root / f"exp-{experiment}" / "workspace",
        limits=Limits(cpus=1, memory_mb=512),
        signin_label=address,
    )


def prepared_for(
    backend: Backend, leases: Leases, *, spare: int = 10, per_address: int = 10
) -> PreparedContainers:
    return PreparedContainers(
        backend,
        holding=leases.holding,
        spare=lambda: spare,
        per_address=per_address,
        delay_s=0,
    )


async def made(prepared: PreparedContainers) -> None:
    """Wait until no prepared container is being made."""
    for _ in range(500):
        if prepared.being_made == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("still being made after 5 s")


async def test_the_next_create_gets_the_container_made_after_the_last(tmp_path: Path) -> None:
    backend, leases = Backend(), Leases(tmp_path, 2)
    prepared = prepared_for(backend, leases)
    slot = leases.lease("alice", 0)
    prepared.after_create("alice", slot, spec_for(slot, "exp-1"))
    await made(prepared)
    assert prepared.holds("alice")
    (spec,) = backend.creations
    assert spec.prepared
    assert spec.image == "img:1"
    assert spec.limits == Limits(cpus=1, memory_mb=512)
    assert spec.workspace.parent.parent == slot
    assert spec.workspace.parent.name.startswith(PREFIX)
    target = slot / "exp-exp-2"
    container = await prepared.take("alice", slot, spec_for(slot, "exp-2"), target)
    assert container is not None
    assert container.container_id in backend.containers
    assert (target / "workspace").is_dir()  # the folder it mounts, renamed to the experiment's
    assert backend.admitted == [True]  # admitted to the shares as a cold create would be
    assert not prepared.holds("alice")
    assert prepared.handed_over == 1
    # Taken: nobody else gets it, and Alice's next create finds none until one is made.
    assert await prepared.take("alice", slot, spec_for(slot, "exp-3"), slot / "x") is None
    await prepared.stop()


async def test_a_create_arriving_while_its_container_is_at_the_engine_waits_for_it(
    tmp_path: Path,
) -> None:
    backend, leases = Backend(), Leases(tmp_path, 1)
    prepared = prepared_for(backend, leases)
    slot = leases.lease("alice", 0)
    prepared.after_create("alice", slot, spec_for(slot, "exp-1"))
    for _ in range(500):  # until its creation has left the gate for the engine
        if backend.creations:
            break
        await asyncio.sleep(0.001)
    assert prepared.being_made == 1
    container = await prepared.take("alice", slot, spec_for(slot, "exp-2"), slot / "exp-exp-2")
    assert container is not None
    assert prepared.handed_over == 1
    # One still waiting for its turn (real creations first) is not waited for.
    backend.gate = asyncio.Event()
    prepared.after_create("alice", slot, spec_for(slot, "exp-2"))
    await asyncio.sleep(0.01)
    assert await prepared.take("alice", slot, spec_for(slot, "exp-3"), slot / "exp-exp-3") is None
    backend.gate.set()
    await made(prepared)
    assert prepared.holds("alice")  # left for the next create
    await prepared.stop()


async def test_one_that_does_not_fit_is_removed_and_the_create_goes_cold(tmp_path: Path) -> None:
    backend, leases = Backend(), Leases(tmp_path, 1)
    prepared = prepared_for(backend, leases)
    slot = leases.lease("alice", 0)
    prepared.after_create("alice", slot, spec_for(slot, "exp-1"))
    await made(prepared)
    other = spec_for(slot, "exp-2", image="img:2")
    assert await prepared.take("alice", slot, other, slot / "exp-exp-2") is None
    assert backend.containers == {}
    assert prepared.not_used == 1
    assert not any(p.name.startswith(PREFIX) for p in slot.iterdir())
    # That create's container is the one prepared next.
    prepared.after_create("alice", slot, other)
    await made(prepared)
    assert [s.image for s in backend.creations] == ["img:1", "img:2"]
    await prepared.stop()
    assert backend.containers == {}


async def test_a_create_and_destroy_loop_makes_at_most_one_creation_per_create(
    tmp_path: Path,
) -> None:
    backend, leases = Backend(), Leases(tmp_path, 1)
    prepared = prepared_for(backend, leases)
    slot = leases.lease("alice", 0)
    backend.gate = asyncio.Event()  # the engine is slow: creates arrive while one is made
    for i in range(20):
        await prepared.take("alice", slot, spec_for(slot, f"e{i}"), slot / f"exp-e{i}")
        prepared.after_create("alice", slot, spec_for(slot, f"e{i}"))
        prepared.after_create("alice", slot, spec_for(slot, f"e{i}"))  # and twice at once
        await asyncio.sleep(0.01)
    assert len(backend.creations) == 1  # one at a time per sandbox, never more
    backend.gate.set()
    await made(prepared)
    for i in range(20, 40):
        await prepared.take("alice", slot, spec_for(slot, f"e{i}"), slot / f"exp-e{i}")
        prepared.after_create("alice", slot, spec_for(slot, f"e{i}"))
        await made(prepared)
    assert len(backend.creations) == 21  # one per create that found none being made
    assert prepared.count() == 1
    await prepared.stop()
    assert not [c for c, s in backend.containers.items() if s.prepared]


async def test_nothing_is_made_beyond_the_budget_or_an_address_share(tmp_path: Path) -> None:
    backend, leases = Backend(), Leases(tmp_path, 4)
    roots = [leases.lease(key, i) for i, key in enumerate(("alice", "bob", "carol", "dave"))]
    prepared = prepared_for(backend, leases, spare=2, per_address=1)
    prepared.after_create("alice", roots[0], spec_for(roots[0], "a", address="addr-1"))
    prepared.after_create("bob", roots[1], spec_for(roots[1], "b", address="addr-1"))
    prepared.after_create("carol", roots[2], spec_for(roots[2], "c", address="addr-2"))
    prepared.after_create("dave", roots[3], spec_for(roots[3], "d", address="addr-3"))
    await made(prepared)
    # Bob's address holds its share already (Alice's); Dave's finds the budget spent.
    assert sorted(s.sandbox_label for s in backend.creations) == ["fp-slot-000", "fp-slot-002"]
    assert prepared.holds("alice")
    assert prepared.holds("carol")
    await prepared.stop()


async def test_a_network_or_an_environment_of_its_own_is_not_made_ahead(tmp_path: Path) -> None:
    backend, leases = Backend(), Leases(tmp_path, 1)
    prepared = prepared_for(backend, leases)
    slot = leases.lease("alice", 0)
    base = spec_for(slot, "e")
    for spec in (
        ContainerSpec(base.experiment_id, base.sandbox_label, "img:1", base.workspace, "egress"),
        ContainerSpec(
            base.experiment_id, base.sandbox_label, "img:1", base.workspace, env={"A": "1"}
        ),
    ):
        prepared.after_create("alice", slot, spec)
    assert backend.creations == []
    assert prepared.count() == 0
    await prepared.stop()


async def test_the_lease_end_removes_it_and_one_still_being_made(tmp_path: Path) -> None:
    backend, leases = Backend(), Leases(tmp_path, 2)
    prepared = prepared_for(backend, leases)
    alice, bob = leases.lease("alice", 0), leases.lease("bob", 1)
    prepared.after_create("alice", alice, spec_for(alice, "a"))
    await made(prepared)
    backend.gate = asyncio.Event()  # Bob's is still at the engine when his lease ends
    prepared.after_create("bob", bob, spec_for(bob, "b"))
    await asyncio.sleep(0.01)
    del leases.held["alice"]
    await prepared.drop("alice", "fp-slot-000")
    assert not prepared.holds("alice")
    assert not any(p.name.startswith(PREFIX) for p in alice.iterdir())
    del leases.held["bob"]
    backend.gate.set()
    await prepared.drop("bob", "fp-slot-001")
    assert backend.containers == {}
    assert prepared.count() == 0
    assert not any(p.name.startswith(PREFIX) for p in bob.iterdir())
    # Every process's goes too: by the sandbox's label at the engine.
    assert backend.removed_by_label == ["fp-slot-000", "fp-slot-001"]
    await prepared.stop()


async def test_a_lease_that_ends_while_it_is_made_leaves_nothing(tmp_path: Path) -> None:
    backend, leases = Backend(), Leases(tmp_path, 1)
    prepared = prepared_for(backend, leases)
    slot = leases.lease("alice", 0)
    backend.gate = asyncio.Event()
    prepared.after_create("alice", slot, spec_for(slot, "a"))
    await asyncio.sleep(0.01)
    del leases.held["alice"]  # emptied through another process: no drop here
    backend.gate.set()
    await made(prepared)
    assert backend.containers == {}
    assert prepared.count() == 0
    assert not any(p.name.startswith(PREFIX) for p in slot.iterdir())
    await prepared.stop()


async def test_the_check_removes_one_whose_lease_ended_elsewhere(tmp_path: Path) -> None:
    backend, leases = Backend(), Leases(tmp_path, 2)
    prepared = prepared_for(backend, leases)
    alice, bob = leases.lease("alice", 0), leases.lease("bob", 1)
    prepared.after_create("alice", alice, spec_for(alice, "a"))
    prepared.after_create("bob", bob, spec_for(bob, "b"))
    await made(prepared)
    del leases.held["alice"]
    assert await prepared.check() == 1
    assert not prepared.holds("alice")
    assert prepared.holds("bob")
    assert len(backend.containers) == 1
    await prepared.stop()


async def test_stop_removes_every_one_being_made_included(tmp_path: Path) -> None:
    backend, leases = Backend(), Leases(tmp_path, 2)
    prepared = prepared_for(backend, leases)
    alice, bob = leases.lease("alice", 0), leases.lease("bob", 1)
    prepared.after_create("alice", alice, spec_for(alice, "a"))
    await made(prepared)
    backend.gate = asyncio.Event()  # Bob's waits for its turn at the engine
    prepared.after_create("bob", bob, spec_for(bob, "b"))
    await asyncio.sleep(0.01)
    await prepared.stop()
    assert backend.containers == {}
    assert prepared.count() == 0
    assert backend.removed_by_label == [None]  # this process's, by label, last
    prepared.after_create("alice", alice, spec_for(alice, "c"))
    assert prepared.count() == 0  # stopped: nothing new


async def test_the_warm_pool_and_the_prepared_containers_share_one_budget(
    tmp_path: Path,
) -> None:
    held = [0]
    demand = WarmDemand(WarmBudget(2, 5, 10_000), prepared=lambda: held[0])
    free = Leases(tmp_path, 8).slots
    pool = WarmPool(Backend(), lambda n: free[:n], count=2, image="img:1", demand=demand)
    assert pool.target() == 2
    assert pool.spare() == 3
    held[0] = 3  # they hold all of it: a fourth is refused (count + 1 > spare)
    for i in range(10):  # sign-ins want more than the budget: the floor, and what is left
        demand.signed_in(f"key-{i}", f"10.0.0.{i}")
    assert pool.target() == 2
    assert pool.spare() == 3
    held[0] = 1  # one went: the pool's wants come first
    assert pool.target() == 4
    assert pool.spare() == 1
    await pool.stop()
    # ...as far as the free slots can hold them: with every slot but one leased, the
    # pool holds its floor at most, and the floor stays its own.
    crowded = WarmPool(Backend(), lambda n: free[:1], count=2, image="img:1", demand=demand)
    assert crowded.target() == 4
    assert crowded.spare() == 3
    await crowded.stop()


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_prepared_creation_waits_while_any_create_is_in_flight(tmp_path: Path) -> None:
    """Issue 26's burst: prepared containers were made 2 s after each create, at the
    engine beside the burst's own creates and first commands. Now they wait for a lull."""
    backend, leases = Backend(), Leases(tmp_path, 2)
    prepared = prepared_for(backend, leases)
    slot = leases.lease("alice", 0)
    prepared.work_began()  # alice's create
    prepared.after_create("alice", slot, spec_for(slot, "exp-1"))
    prepared.work_began()  # bob's, in flight
    prepared.work_ended()  # alice's is over
    await settle()
    assert backend.creations == []  # bob's create is still in flight
    assert prepared.being_made == 1  # it waits, counted in the budget
    prepared.work_ended()
    await made(prepared)
    assert prepared.holds("alice")
    assert len(backend.creations) == 1
    await prepared.stop()


async def test_creates_that_never_pause_hold_a_prepared_creation_back_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepared_module, "HOLD_MAX_S", 0.05)
    backend, leases = Backend(), Leases(tmp_path, 2)
    prepared = prepared_for(backend, leases)
    slot = leases.lease("alice", 0)
    prepared.work_began()  # never ends
    prepared.after_create("alice", slot, spec_for(slot, "exp-1"))
    await made(prepared)
    assert prepared.holds("alice")
    await prepared.stop()
