"""Fair shares on the real Docker engine: containers by sandbox label, output readers.

Every container carries a label prefix unique to this module and run, and is
removed by the fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest
from docker_testkit import RUN, backend_on_engine, docker_client, labelled, new_workspace

from app.errors import ServiceError
from app.runtime.backend import Container, ContainerSpec, Limits
from app.runtime.backends.docker import DockerBackend, output_streams
from app.runtime.exec.protocol import ExecPath

pytestmark = pytest.mark.integration

IMAGE = "sandbox-mcp/python:3"
PREFIX = f"io.sandbox-mcp-capacity-test-{RUN}"
SMALL = Limits(cpus=0.5, memory_mb=256, pids=64, tmp_mb=16)


@pytest.fixture
def slots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture
def cleanup(engine: docker.DockerClient) -> Iterator[None]:
    yield
    for container_id in labelled(engine, f"{PREFIX}.managed=1"):
        engine.api.remove_container(container_id, force=True)


def make_backend(slots: Path, exec_path: ExecPath = "auto", **options: int) -> DockerBackend:
    return backend_on_engine(
        slots,
        PREFIX,
        (IMAGE,),
        kill_grace_s=5,
        exec_path=exec_path,
        **options,
    )


@pytest.fixture
async def shared(slots: Path, cleanup: None) -> AsyncIterator[DockerBackend]:
    """A pool of 3 slots and 4 containers: one spare beyond a first for every slot."""
    backend = make_backend(slots, max_containers=4, pool_size=3, max_containers_per_sandbox=3)
    yield backend
    await backend.aclose()


async def create(backend: DockerBackend, slots: Path, sandbox: str) -> Container:
    spec = ContainerSpec(
        experiment_id=f"exp-{uuid.uuid4().hex[:8]}",
        sandbox_label=sandbox,
        image=IMAGE,
        workspace=new_workspace(slots),
        limits=SMALL,
    )
    return await backend.create(spec)


async def test_a_greedy_sandbox_racing_the_others_cannot_take_their_first(
    shared: DockerBackend, slots: Path, engine: docker.DockerClient
) -> None:
    attempts = ["fp-greedy"] * 5 + ["fp-bob", "fp-carol"]
    results = await asyncio.gather(
        *(create(shared, slots, sandbox) for sandbox in attempts), return_exceptions=True
    )
    got = [
        sandbox for sandbox, r in zip(attempts, results, strict=True) if isinstance(r, Container)
    ]
    refused = [r for r in results if isinstance(r, ServiceError)]
    assert sorted(got) == ["fp-bob", "fp-carol", "fp-greedy", "fp-greedy"]
    assert {(r.code, r.details["reason"]) for r in refused} == {
        ("CAPACITY_EXCEEDED", "spare_in_use")
    }
    assert len(labelled(engine, f"{PREFIX}.managed=1")) == 4
    # The engine's count is the truth: after a restart (a new backend) the shares hold.
    fresh = make_backend(slots, max_containers=4, pool_size=3)
    try:
        with pytest.raises(ServiceError) as caught:
            await create(fresh, slots, "fp-bob")  # bob's second: the spare is greedy's
        assert caught.value.details["reason"] == "spare_in_use"
    finally:
        await fresh.aclose()


async def silent_jobs(
    backend: DockerBackend, box: Container, count: int
) -> list[asyncio.Task[object]]:
    """``count`` commands that print nothing for minutes: each holds an output reader."""
    tasks: list[asyncio.Task[object]] = [
        asyncio.create_task(
            backend.run(box.container_id, "sleep 300", timeout_s=300, job_id=f"quiet-{i}")
        )
        for i in range(count)
    ]
    # Their streams are open once their commands run (exec start attaches first): seen
    # from the host (docker top), not by a command that would take a stream itself.
    deadline = asyncio.get_running_loop().time() + 60
    while await asyncio.to_thread(_sleeping, box.container_id) < count:
        assert not any(task.done() for task in tasks), [t for t in tasks if t.done()]
        assert asyncio.get_running_loop().time() < deadline, "the silent jobs never all ran"
        await asyncio.sleep(0.2)
    assert not any(task.done() for task in tasks)
    return tasks


def _sleeping(container_id: str) -> int:
    """How many ``sleep 300`` run in the container."""
    with contextlib.closing(docker_client()) as engine:
        top = engine.api.top(container_id, ps_args="-eo pid,args")
    return sum(1 for proc in top["Processes"] if proc[-1] == "sleep 300")


async def stop(backend: DockerBackend, box: Container, tasks: list[asyncio.Task[object]]) -> None:
    for i in range(len(tasks)):
        await backend.cancel(box.container_id, f"quiet-{i}")
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_sandboxes_at_their_caps_leave_output_readers_for_everyone(
    slots: Path, cleanup: None
) -> None:
    # Readers sized as the server sizes them: 3 slots, 2 jobs and 1 creation each.
    # (Output readers are the docker exec path's: the fallback of the fast one.)
    jobs, experiments = 2, 1
    backend = make_backend(
        slots,
        "docker-exec",
        max_containers=10,
        max_streams=output_streams(3, jobs, experiments),
    )
    try:
        hostile = [await create(backend, slots, f"fp-hostile-{i}") for i in range(2)]
        victim = await create(backend, slots, "fp-victim")
        held = [await silent_jobs(backend, box, jobs + experiments) for box in hostile]
        result = await asyncio.wait_for(
            backend.run(victim.container_id, "echo read", timeout_s=30, job_id="victim"), 20
        )
        assert (result.exit_code, result.stdout) == (0, "read\n")
        for box, tasks in zip(hostile, held, strict=True):
            await stop(backend, box, tasks)
    finally:
        await backend.aclose()


async def test_without_a_jobs_cap_one_sandbox_can_hold_every_reader(
    slots: Path, cleanup: None
) -> None:
    """What the caps prevent: one tenant's silent jobs, as many as there are readers,
    leave another tenant's output unread (the server before the caps)."""
    backend = make_backend(slots, "docker-exec", max_containers=10, max_streams=4)
    try:
        hostile = await create(backend, slots, "fp-hostile")
        victim = await create(backend, slots, "fp-victim")
        tasks = await silent_jobs(backend, hostile, 4)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                backend.run(victim.container_id, "echo read", timeout_s=30, job_id="victim"), 5
            )
        await stop(backend, hostile, tasks)
    finally:
        await backend.aclose()


async def test_on_the_fast_path_silent_jobs_hold_no_reader(slots: Path, cleanup: None) -> None:
    """The same tenants on the fast path: a job's output comes back on its container's
    executor stream, so silent jobs hold no reader thread and the victim reads at once."""
    backend = make_backend(slots, max_containers=10, max_streams=4)
    try:
        hostile = await create(backend, slots, "fp-hostile")
        victim = await create(backend, slots, "fp-victim")
        for box in (hostile, victim):
            assert await backend.fast_exec_ready(box.container_id)
        tasks = await silent_jobs(backend, hostile, 8)
        result = await asyncio.wait_for(
            backend.run(victim.container_id, "echo read", timeout_s=30, job_id="victim"), 20
        )
        assert (result.exit_code, result.stdout) == (0, "read\n")
        await stop(backend, hostile, tasks)
        assert backend.exec_runs == {"fast": 9}
    finally:
        await backend.aclose()
