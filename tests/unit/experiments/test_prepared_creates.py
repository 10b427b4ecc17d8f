"""A sandbox's second and later creates take the container prepared after the one
before (app.experiments.creation with app.runtime.warm.prepared), on a fake runtime and
the real database (SQLite); the real engine: tests/e2e/test_prepared_over_http.py."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from db_testkit import migrated_sqlite
from runtime_fakes import FakeBackend
from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.core.jobs import JobRegistry
from app.experiments.creation import CreateRequest
from app.experiments.evidence.shelf import fingerprint
from app.experiments.manager import ExperimentManager
from app.experiments.options import ExperimentOptions
from app.experiments.recovery.process_registry import ProcessRegistry
from app.runtime.backend import Container, ContainerSpec, ExecResult
from app.runtime.warm.prepared import PreparedContainers
from app.storage.experiment_store import SqlExperimentStore
from app.storage.process_store import SqlProcessRecords
from jail import CallContext, SandboxMemory, new_call_context
from pool.slots import Slot


class Backend(FakeBackend):
    async def create(self, spec: ContainerSpec, *, begun: asyncio.Event | None = None) -> Container:
        if begun is not None:
            begun.set()
        return await super().create(spec)

    async def running(self) -> set[str]:
        return set(self.containers)

    def claim(self, container_id: str, sandbox_label: str) -> None:
        pass

    async def hand_over(
        self, warm: Container, spec: ContainerSpec, *, admit: bool = False
    ) -> Container | None:
        return warm if spec.image == warm.isolation.image else None

    async def remove_prepared(self, sandbox_label: str | None = None) -> int:
        return 0


def slots_of(
    keys: str, tmp_path: Path
) -> tuple[dict[str, Slot], Callable[[str], Awaitable[Slot | None]]]:
    """A slot (its folder made) for each sandbox key of ``keys``, and the pool's
    ``holding`` that answers with them."""
    slots = {key: Slot(i, f"slot-00{i}", tmp_path / f"slot-00{i}") for i, key in enumerate(keys)}
    for slot in slots.values():
        slot.root.mkdir()

    async def holding(key: str) -> Slot | None:
        return slots[key]

    return slots, holding


async def a_manager(
    engine: AsyncEngine,
    backend: FakeBackend,
    holding: Callable[[str], Awaitable[Slot | None]],
    tmp_path: Path,
) -> tuple[ExperimentManager, PreparedContainers]:
    """A hosted manager on ``engine`` whose creates prepare the next container at once."""
    prepared = PreparedContainers(
        backend, holding=holding, spare=lambda: 4, per_address=4, delay_s=0
    )
    registry = ProcessRegistry(SqlProcessRecords(engine), stale_s=30)
    await registry.register()
    options = ExperimentOptions(hosted=True, default_image="img:1", artifact_dir=tmp_path / "a")
    manager = ExperimentManager(
        SqlExperimentStore(engine), backend, JobRegistry(), options, registry, prepared=prepared
    )
    return manager, prepared


async def test_each_next_create_takes_the_container_prepared_after_the_last(
    tmp_path: Path,
) -> None:
    engine = await migrated_sqlite(tmp_path)
    try:
        slot = Slot(0, "slot-000", tmp_path / "slot-000")
        slot.root.mkdir()
        backend = Backend()

        async def holding(key: str) -> Slot | None:
            return slot

        manager, prepared = await a_manager(engine, backend, holding, tmp_path)
        records = SqlExperimentStore(engine)  # the same rows the manager writes
        memory = SandboxMemory()
        paths = []
        for image in ("img:1", "img:1", "img:1", "img:2"):
            call = new_call_context(
                memory, "alice", request_id=uuid.uuid4().hex, slot_root=slot.root
            )
            made = await manager.create(call, CreateRequest(image=image, files={"a.py": "1\n"}))
            (_, _, reason), *_ = (await records.transitions(made.experiment_id))[1:]
            paths.append(reason)
            workspace = slot.root / f"exp-{made.experiment_id}" / "workspace"
            assert (workspace / "a.py").read_text() == "1\n"  # its files, in the folder it mounts
            for _ in range(500):  # the next one is made in the background
                if not prepared.being_made:
                    break
                await asyncio.sleep(0.01)
        assert paths == [
            "container started",  # the sandbox's first: nothing prepared yet
            "container started (prepared)",
            "container started (prepared)",
            "container started",  # another image: the prepared one removed, then cold
        ]
        # Four experiments, and the one prepared after the last create (for img:2)
        # waits until the lease ends (here: the server stops).
        assert len(backend.containers) == 5
        assert prepared.count() == 1
        assert prepared.handed_over == 2
        assert prepared.not_used == 1
        await prepared.stop()
        assert len(backend.containers) == 4
    finally:
        await engine.dispose()


class HeldBackend(Backend):
    """Holds the experiment containers of one sandbox at the "engine" until ``release``;
    records the prepared creations sent to it."""

    def __init__(self, held_label: str) -> None:
        super().__init__()
        self.held_label = held_label
        self.release = asyncio.Event()
        self.arrived = asyncio.Event()
        self.prepared_sent: list[str] = []

    async def create(self, spec: ContainerSpec, *, begun: asyncio.Event | None = None) -> Container:
        if spec.prepared:
            self.prepared_sent.append(spec.sandbox_label)
        elif spec.sandbox_label == self.held_label:
            self.arrived.set()
            await self.release.wait()
        return await super().create(spec, begun=begun)


async def test_no_prepared_container_is_made_while_another_create_is_in_flight(
    tmp_path: Path,
) -> None:
    """Issue 26's burst: each create's prepared container went to the engine 2 s after it,
    while the burst's other creates were still coming in."""
    engine = await migrated_sqlite(tmp_path)
    try:
        slots, holding = slots_of("ab", tmp_path)
        backend = HeldBackend(fingerprint("b"))

        manager, prepared = await a_manager(engine, backend, holding, tmp_path)
        memory = SandboxMemory()

        def create(key: str) -> Awaitable[object]:
            call = new_call_context(
                memory, key, request_id=uuid.uuid4().hex, slot_root=slots[key].root
            )
            return manager.create(call, CreateRequest(files={"a.py": "1\n"}))

        b = asyncio.create_task(create("b"))
        await backend.arrived.wait()  # b's container is at the engine
        await create("a")
        for _ in range(50):
            await asyncio.sleep(0)
        assert backend.prepared_sent == []  # a's waits for a lull: b is in flight
        backend.release.set()
        await b
        for _ in range(500):
            if len(backend.prepared_sent) == 2 and not prepared.being_made:
                break
            await asyncio.sleep(0.01)
        assert sorted(backend.prepared_sent) == sorted([fingerprint("a"), fingerprint("b")])
        await prepared.stop()
    finally:
        await engine.dispose()


class HeldRunBackend(Backend):
    """Holds every command at the "engine" until ``release``; records the prepared
    creations sent to it."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.running = asyncio.Event()
        self.prepared_sent: list[str] = []

    async def create(self, spec: ContainerSpec, *, begun: asyncio.Event | None = None) -> Container:
        if spec.prepared:
            self.prepared_sent.append(spec.sandbox_label)
        return await super().create(spec, begun=begun)

    async def run(self, container_id: str, command: str, **kwargs: Any) -> ExecResult:  # type: ignore[override]
        self.running.set()
        await self.release.wait()
        return await super().run(container_id, command, **kwargs)


async def test_no_prepared_container_is_made_while_a_call_waits_for_its_command(
    tmp_path: Path,
) -> None:
    """Issue 26's burst: the prepared creations began once the creates were over, while
    the first commands still ran, and the engine's daemons took the CPU those commands
    waited for."""
    engine = await migrated_sqlite(tmp_path)
    try:
        slots, holding = slots_of("ab", tmp_path)
        backend = HeldRunBackend()

        manager, prepared = await a_manager(engine, backend, holding, tmp_path)
        prepared._delay = 30.0  # b's own prepared container waits: a's is the one watched
        memory = SandboxMemory()

        def call(key: str) -> CallContext:
            return new_call_context(
                memory, key, request_id=uuid.uuid4().hex, slot_root=slots[key].root
            )

        made = await manager.create(call("b"), CreateRequest(files={"a.py": "1\n"}))
        command = asyncio.create_task(manager.execute(call("b"), made.experiment_id, "sleep 1"))
        await backend.running.wait()
        prepared._delay = 0.0
        await manager.create(call("a"), CreateRequest(files={"a.py": "1\n"}))
        for _ in range(50):
            await asyncio.sleep(0)
        assert backend.prepared_sent == []  # a's waits for a lull: b's command runs
        backend.release.set()
        await command
        for _ in range(500):
            if fingerprint("a") in backend.prepared_sent:
                break
            await asyncio.sleep(0.01)
        assert fingerprint("a") in backend.prepared_sent
        await prepared.stop()
    finally:
        await engine.dispose()
