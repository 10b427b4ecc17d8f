"""A job stopped before its run reaches the real runtime never starts its command.

The command runner's side of the window (tests/unit/experiments/test_manager.py has
the same with the fake backend): the job's task is created but has not had its first
step, so the engine's side knows no such job and a cancel there kills nothing."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from db_testkit import an_experiment, migrated_sqlite
from docker_testkit import BACKEND_PREFIX, backend_on_engine, new_workspace

from app.experiments.commands import Command, CommandRunner
from app.experiments.core.jobs import JobRegistry
from app.experiments.core.states import State
from app.runtime.backend import ContainerSpec, Limits
from app.runtime.backends.docker import DockerBackend
from app.storage.experiment_store import SqlExperimentStore
from app.tenancy.job_limits import JobLimits

pytestmark = pytest.mark.integration

IMAGE = "sandbox-mcp/python:3"


@pytest.fixture(params=["docker-exec", "auto"], ids=["docker-exec", "fast"])
async def backend(
    engine: docker.DockerClient, slots: Path, request: pytest.FixtureRequest
) -> AsyncIterator[DockerBackend]:
    backend = backend_on_engine(slots, BACKEND_PREFIX, (IMAGE,), exec_path=request.param)
    yield backend
    await backend.aclose()


async def test_a_job_stopped_before_it_reaches_the_engine_never_runs(
    backend: DockerBackend, slots: Path, tmp_path: Path
) -> None:
    workspace = new_workspace(slots)
    experiment_id = f"exp-{uuid.uuid4().hex[:8]}"
    container = await backend.create(
        ContainerSpec(experiment_id, "fp-test", IMAGE, workspace, limits=Limits())
    )
    db = await migrated_sqlite(tmp_path)
    try:
        assert await backend.fast_exec_ready(container.container_id) == (
            backend.exec_path == "auto"
        )
        records = SqlExperimentStore(db)
        experiment = dataclasses.replace(
            an_experiment(experiment_id, "alice"),
            state=State.READY,
            container_id=container.container_id,
        )
        await records.add(experiment, "created")
        runner = CommandRunner(records, backend, JobRegistry(), 1024, JobLimits(8, 8))
        text = "touch /workspace/ran; sleep 30"
        running = await runner.start(Command("alice", experiment, text, "command", 60, {}, False))
        await runner.kill(running)  # before the job's task had its first step
        assert running.task.done()
        record = await records.load_job("alice", running.job_id)
        assert record is not None
        assert record.status == "cancelled"
        # The command never ran, then or later.
        check = await backend.run(
            container.container_id, "sleep 1; ls -A /workspace", timeout_s=30, job_id="check"
        )
        assert check.exit_code == 0
        assert check.stdout == ""
    finally:
        await backend.remove(container.container_id)
        await db.dispose()
