"""Warm containers on the real Docker engine: hardened like cold ones, one key each,
replaced after use, counted in their sandbox's share once handed over.

Every container carries a label prefix unique to this module and run, and is
removed by the fixtures.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import docker
import pytest
from docker_testkit import GID, RUN, UID, backend_on_engine, labelled

from app.errors import ServiceError
from app.runtime.backend import ContainerSpec, Limits
from app.runtime.backends.docker import DockerBackend
from app.runtime.warm.pool import WarmPool
from pool.slots import Slot, name_of

pytestmark = pytest.mark.integration

IMAGE = "sandbox-mcp/python:3"
PREFIX = f"io.sandbox-mcp-warm-test-{RUN}"


@pytest.fixture
def slots(tmp_path_factory: pytest.TempPathFactory) -> list[Slot]:
    base = tmp_path_factory.mktemp("slots")
    made = []
    for index in range(3):
        root = base / name_of(index)
        root.mkdir(mode=0o700)
        made.append(Slot(index, name_of(index), root))
    return made


@pytest.fixture
def cleanup(engine: docker.DockerClient) -> Iterator[None]:
    yield
    for container_id in labelled(engine, f"{PREFIX}.managed=1"):
        engine.api.remove_container(container_id, force=True)


def a_server_process(slots: list[Slot]) -> DockerBackend:
    """The backend one server process has on these slots (one container per sandbox)."""
    return backend_on_engine(
        slots[0].root.parent,
        PREFIX,
        (IMAGE,),
        max_containers=6,
        pool_size=3,
        max_containers_per_sandbox=1,
        kill_grace_s=5,
    )


@pytest.fixture
async def backend(slots: list[Slot], cleanup: None) -> AsyncIterator[DockerBackend]:
    made = a_server_process(slots)
    yield made
    await made.aclose()


@pytest.fixture
async def warm(backend: DockerBackend, slots: list[Slot]) -> AsyncIterator[WarmPool]:
    free = list(slots)  # the test "leases" a slot by removing it from here
    pool = WarmPool(backend, lambda n: free[:n], count=2, image=IMAGE, owner=(UID, GID))
    pool.free = free  # type: ignore[attr-defined]
    yield pool
    await pool.stop()


def spec(slot: Slot, sandbox: str, **given: Any) -> ContainerSpec:
    experiment_id = f"exp-{uuid.uuid4().hex[:8]}"
    return ContainerSpec(
        experiment_id=experiment_id,
        sandbox_label=sandbox,
        image=IMAGE,
        workspace=slot.root / f"exp-{experiment_id}" / "workspace",
        **given,
    )


async def test_a_warm_container_goes_to_its_slot_once_and_is_replaced(
    warm: WarmPool, slots: list[Slot], backend: DockerBackend, engine: docker.DockerClient
) -> None:
    assert await warm.fill() == 2
    assert sorted(warm.ready_slots()) == [slots[0].root, slots[1].root]
    alice = spec(slots[0], "fp-alice")
    target = alice.workspace.parent
    got = await warm.take(slots[0].root, alice, target)
    assert got is not None
    # Born with its executor (the fast exec path), which survives the hand-over.
    assert await backend.fast_exec_ready(got.container_id)
    # The mount followed the rename: what the container writes lands in the experiment's folder.
    result = await backend.run(
        got.container_id, "echo hi > /workspace/made", timeout_s=30, job_id="j1"
    )
    assert result.exit_code == 0
    assert backend.exec_runs == {"fast": 1}
    assert (target / "workspace" / "made").read_text() == "hi\n"
    assert target.stat().st_mode & 0o777 == 0o700
    assert (target / "workspace").stat().st_uid == UID
    # Taken: nobody else gets it, not even a second create in the same slot.
    assert await warm.take(slots[0].root, spec(slots[0], "fp-alice"), target.parent / "x") is None
    # Another sandbox's slot gives another container.
    bob = spec(slots[1], "fp-bob")
    other = await warm.take(slots[1].root, bob, bob.workspace.parent)
    assert other is not None
    assert other.container_id != got.container_id
    # Replaced, not reused: the next pass starts new ones on the free slots left.
    warm.free.remove(slots[0])  # type: ignore[attr-defined]
    warm.free.remove(slots[1])  # type: ignore[attr-defined]
    await backend.remove(got.container_id)
    assert await warm.fill() == 1
    assert warm.ready_slots() == [slots[2].root]
    fresh = labelled(engine, f"{PREFIX}.sandbox=warm-{slots[2].name}")
    assert len(fresh) == 1
    assert fresh[0] not in (got.container_id, other.container_id)


@pytest.mark.parametrize("creator", ["this process", "another process"])
async def test_a_handed_over_container_counts_in_its_sandbox_share(
    warm: WarmPool, slots: list[Slot], backend: DockerBackend, creator: str
) -> None:
    # Another server process on the same engine never saw the hand-over: it reads the
    # container's new name (its label, fixed at creation, still says warm-slot-000).
    other = a_server_process(slots) if creator == "another process" else None
    try:
        await warm.fill()
        alice = spec(slots[0], "sbx-0123456789ab")
        assert await warm.take(slots[0].root, alice, alice.workspace.parent) is not None
        # One container per sandbox here: Alice holds hers.
        second = spec(slots[0], "sbx-0123456789ab")
        second.workspace.mkdir(parents=True)
        with pytest.raises(ServiceError) as caught:
            await (other or backend).create(second)
        assert caught.value.code == "LIMIT_REACHED"
    finally:
        if other is not None:
            await other.aclose()


def _inspect(engine: docker.DockerClient, container_id: str) -> dict[str, Any]:
    return engine.api.inspect_container(container_id)


async def test_warm_containers_are_hardened_exactly_like_cold_ones(
    warm: WarmPool, slots: list[Slot], backend: DockerBackend, engine: docker.DockerClient
) -> None:
    await warm.fill()
    asked = Limits(cpus=0.5, memory_mb=512, pids=128)  # updated at hand-over
    alice = spec(slots[0], "fp-alice", limits=asked)
    handed = await warm.take(slots[0].root, alice, alice.workspace.parent)
    assert handed is not None
    cold_spec = spec(slots[2], "fp-carol", limits=asked)
    cold_spec.workspace.mkdir(parents=True)
    cold = await backend.create(cold_spec)
    warm_seen, cold_seen = (
        _inspect(engine, handed.container_id),
        _inspect(engine, cold.container_id),
    )

    def host(seen: dict[str, Any]) -> dict[str, Any]:
        config = dict(seen["HostConfig"])
        mounts = [{k: v for k, v in m.items() if k != "Source"} for m in config.pop("Mounts")]
        return {**config, "Mounts": mounts}

    def config(seen: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in seen["Config"].items() if k != "Labels"}

    assert host(warm_seen) == host(cold_seen)
    assert config(warm_seen) == config(cold_seen)
    assert warm_seen["HostConfig"]["NanoCpus"] == 500_000_000
    assert warm_seen["HostConfig"]["Memory"] == 512 * 1024 * 1024
    assert warm_seen["HostConfig"]["PidsLimit"] == 128
    assert handed.isolation == cold.isolation


async def test_a_request_it_cannot_serve_removes_it_and_goes_cold(
    warm: WarmPool, slots: list[Slot], engine: docker.DockerClient
) -> None:
    await warm.fill()
    (first,) = labelled(engine, f"{PREFIX}.sandbox=warm-{slots[0].name}")
    asked = spec(slots[0], "fp-alice", env={"A": "1"})  # env is fixed at creation
    assert await warm.take(slots[0].root, asked, asked.workspace.parent) is None
    assert first not in labelled(engine, f"{PREFIX}.managed=1")
    assert not any(p.name.startswith(".warm-") for p in slots[0].root.iterdir())


async def test_a_slot_emptied_under_its_warm_container_gets_a_new_one(
    warm: WarmPool, slots: list[Slot], engine: docker.DockerClient
) -> None:
    await warm.fill()
    (stale,) = labelled(engine, f"{PREFIX}.sandbox=warm-{slots[0].name}")
    # What a dir reset does: the slot's tree goes aside, an empty folder takes its place.
    os.rename(slots[0].root, slots[0].root.with_name("aside"))
    slots[0].root.mkdir(mode=0o700)
    alice = spec(slots[0], "fp-alice")
    assert await warm.take(slots[0].root, alice, alice.workspace.parent) is None
    assert stale not in labelled(engine, f"{PREFIX}.managed=1")
    assert await warm.fill() == 1
    assert slots[0].root in warm.ready_slots()


async def test_a_warm_container_that_stopped_is_replaced(
    warm: WarmPool, slots: list[Slot], engine: docker.DockerClient
) -> None:
    await warm.fill()
    (stopped,) = labelled(engine, f"{PREFIX}.sandbox=warm-{slots[0].name}")
    engine.api.kill(stopped)  # as an engine restart leaves it
    assert await warm.fill() == 1
    (fresh,) = labelled(engine, f"{PREFIX}.sandbox=warm-{slots[0].name}")
    assert fresh != stopped
    assert slots[0].root in warm.ready_slots()


async def test_a_start_deletes_the_folders_of_the_last_runs_warm_containers(
    warm: WarmPool, slots: list[Slot]
) -> None:
    (slots[2].root / ".warm-0123456789ab" / "workspace").mkdir(parents=True)
    (slots[2].root / "exp-exp_kept" / "workspace").mkdir(parents=True)
    warm.start([s.root for s in slots])
    await asyncio.wait_for(warm.filled.wait(), 120)
    names = sorted(p.name for p in slots[2].root.iterdir())
    assert names == ["exp-exp_kept"]  # slot-002 is not among the next two free
    assert warm.ready == 2
