"""The experiment records on the real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from db_testkit import an_experiment
from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.core.errors import ExperimentNotFound, InvalidTransition
from app.experiments.core.records import (
    ArtifactRecord,
    DiskHoldings,
    JobOutcome,
    JobRecord,
    Move,
)
from app.experiments.core.states import State
from app.storage.experiment_store import SqlExperimentStore

pytestmark = pytest.mark.integration


@pytest.fixture
def records(engine: AsyncEngine) -> SqlExperimentStore:
    return SqlExperimentStore(engine)


def a_job(job_id: str, experiment_id: str, started_at: float, key: str = "k") -> JobRecord:
    return JobRecord(
        job_id, experiment_id, key, "command", "echo hi", "running", False, 30, started_at
    )


def an_artifact(artifact_id: str, experiment_id: str, size: int, key: str = "k") -> ArtifactRecord:
    return ArtifactRecord(
        artifact_id, experiment_id, key, f"out/{artifact_id}", size, "0" * 64, artifact_id, 1.0
    )


async def test_experiments_are_scoped_to_their_sandbox_and_move_by_the_machine(
    records: SqlExperimentStore,
) -> None:
    await records.add(an_experiment("e1"), "created")
    await records.add(an_experiment("e2", sandbox_key="other"), "created")
    with pytest.raises(ExperimentNotFound):
        await records.get("k", "e2")  # another sandbox's id reads like none at all
    assert (
        await records.transition(
            "e1",
            State.READY,
            "started",
            2.0,
            container_id="c1",
            isolation={"cpus": 1.5, "caps": ["CHOWN"]},
            warnings=["clamped"],
        )
        is State.CREATING
    )
    ready = await records.get("k", "e1")
    assert (ready.state, ready.container_id, ready.updated_at) == (State.READY, "c1", 2.0)
    assert (ready.isolation, ready.warnings) == ({"cpus": 1.5, "caps": ["CHOWN"]}, ["clamped"])
    with pytest.raises(InvalidTransition):
        await records.transition("e1", State.CREATING, "back", 3.0)
    await records.transition("e1", State.DESTROYED, "destroyed", 4.0)
    assert await records.transitions("e1") == [
        (None, "CREATING", "created"),
        ("CREATING", "READY", "started"),
        ("READY", "DESTROYED", "destroyed"),
    ]
    assert [e.experiment_id for e in await records.of_sandbox("k")] == ["e1"]
    assert await records.of_sandbox("k", include_destroyed=False) == []
    assert [e.experiment_id for e in await records.live()] == ["e2"]


async def test_jobs_round_trip_and_the_running_ones_are_marked_lost(
    records: SqlExperimentStore,
) -> None:
    await records.add(an_experiment("e1"), "created")
    await records.add_job(a_job("j2", "e1", 2.0))
    await records.add_job(a_job("j1", "e1", 1.0))
    summary = {"passed": 3, "failed": 1, "names": ["test_a"]}
    outcome = JobOutcome("failed", 1, "out ✓", "err", True, False, 5.0, 4.0, None, summary)
    await records.finish_job("j1", outcome)
    done = await records.load_job("k", "j1")
    assert done is not None
    assert (done.status, done.exit_code, done.stdout, done.stdout_truncated) == (
        "failed",
        1,
        "out ✓",
        True,
    )
    assert done.test_summary == summary
    assert await records.load_job("other", "j1") is None
    assert [j.job_id for j in await records.jobs_of("e1")] == ["j1", "j2"]
    marked = await records.mark_lost_jobs(9.0, live_processes=set(), reason="its process died")
    assert [job.job_id for job in marked] == ["j2"]  # j1 has finished
    lost = await records.load_job("k", "j2")
    assert lost is not None
    assert (lost.status, lost.finished_at, lost.reason) == ("lost", 9.0, "its process died")


async def test_a_job_and_its_experiment_s_move_are_one_write(
    records: SqlExperimentStore,
) -> None:
    """A command's start records its job and moves its experiment to RUNNING together;
    a move the machine refuses leaves no job behind."""
    await records.add(an_experiment("e1"), "created")
    await records.transition("e1", State.READY, "started", 2.0, container_id="c1")
    running = Move("e1", State.RUNNING, "command j1 started")
    await records.add_job(a_job("j1", "e1", 3.0), then=running)
    running = await records.get("k", "e1")
    assert (running.state, running.updated_at) == (State.RUNNING, 3.0)
    assert (await records.transitions("e1"))[-1] == ("READY", "RUNNING", "command j1 started")
    assert [j.job_id for j in await records.jobs_of("e1")] == ["j1"]
    await records.transition("e1", State.COMPLETED, "j1 completed", 4.0)
    await records.transition("e1", State.DESTROYED, "destroyed", 4.5)
    with pytest.raises(InvalidTransition):
        await records.add_job(a_job("j2", "e1", 5.0), then=Move("e1", State.RUNNING, "j2"))
    assert [j.job_id for j in await records.jobs_of("e1")] == ["j1"]  # j2: not written
    assert (await records.get("k", "e1")).state is State.DESTROYED


async def test_a_job_s_end_and_its_experiment_s_move_are_one_write(
    records: SqlExperimentStore,
) -> None:
    """A command's end records its outcome and moves its experiment on together (both
    ways of finishing); an experiment destroyed meanwhile keeps its state, and the job
    its outcome."""
    outcome = JobOutcome("completed", 0, "hi", "", False, False, 6.0, 1.0, None, None)
    for experiment_id, job_id in (("e1", "j1"), ("e2", "j2"), ("e3", "j3")):
        await records.add(an_experiment(experiment_id), "created")
        await records.transition(experiment_id, State.READY, "started", 2.0, container_id="c")
        running = Move(experiment_id, State.RUNNING, f"command {job_id} started")
        await records.add_job(a_job(job_id, experiment_id, 3.0), then=running)
    # e3 stopped running and was destroyed before its job's end was written (a RUNNING
    # experiment cannot be destroyed as such).
    await records.transition("e3", State.CANCELLED, "j3 cancelled", 4.0)
    await records.finish_job("j1", outcome, then=Move("e1", State.COMPLETED, "j1 completed"))
    kept = await records.finish_job_within(
        "j2",
        outcome,
        sandbox_key="k",
        command="echo hi",
        day_budget=1_000_000,
        then=Move("e2", State.FAILED, "j2 failed"),
    )
    assert kept
    await records.transition("e3", State.DESTROYED, "destroyed", 5.0)
    await records.finish_job("j3", outcome, then=Move("e3", State.COMPLETED, "j3 completed"))
    ended = {e.experiment_id: (e.state, e.updated_at) for e in await records.of_sandbox("k")}
    assert ended == {
        "e1": (State.COMPLETED, 6.0),
        "e2": (State.FAILED, 6.0),
        "e3": (State.DESTROYED, 5.0),
    }
    for job_id in ("j1", "j2", "j3"):
        job = await records.load_job("k", job_id)
        assert job is not None
        assert (job.status, job.stdout, job.finished_at) == ("completed", "hi", 6.0)


async def test_a_job_s_end_leaves_its_experiment_running_while_another_job_runs(
    records: SqlExperimentStore,
) -> None:
    """Two jobs of one experiment: the second's start leaves RUNNING as it is (no second
    transition), the first's end does not move it while the second is recorded running,
    and the second's end does."""
    await records.add(an_experiment("e1"), "created")
    await records.transition("e1", State.READY, "started", 2.0, container_id="c1")
    await records.add_job(a_job("j1", "e1", 3.0), then=Move("e1", State.RUNNING, "j1 started"))
    await records.add_job(a_job("j2", "e1", 3.5), then=Move("e1", State.RUNNING, "j2 started"))
    outcome = JobOutcome("completed", 0, "", "", False, False, 4.0, 1.0, None, None)
    await records.finish_job("j1", outcome, then=Move("e1", State.COMPLETED, "j1 completed"))
    assert (await records.get("k", "e1")).state is State.RUNNING
    later = replace(outcome, finished_at=5.0)
    await records.finish_job("j2", later, then=Move("e1", State.COMPLETED, "j2 completed"))
    assert (await records.get("k", "e1")).state is State.COMPLETED
    assert [t[1:] for t in await records.transitions("e1")][2:] == [
        ("RUNNING", "j1 started"),
        ("COMPLETED", "j2 completed"),
    ]


async def test_artifacts_weigh_expire_and_keep_their_experiment(
    records: SqlExperimentStore,
) -> None:
    for experiment_id in ("e1", "e2"):
        await records.add(replace(an_experiment(experiment_id), updated_at=1.0), "created")
    await records.add_artifacts([an_artifact("a1", "e1", 100), an_artifact("a2", "e1", 50)])
    assert await records.artifact_bytes_of("k") == 150
    assert await records.artifact_bytes_of("nobody") == 0
    assert [a.artifact_id for a in await records.artifacts_of("k", "e1")] == ["a1", "a2"]
    for experiment_id in ("e1", "e2"):
        await records.transition(experiment_id, State.DESTROYED, "gone", 2.0)
    # Destroyed long ago: e2 is forgotten, e1 stays while it keeps artifacts.
    assert await records.forget_destroyed_before(10.0) == 1
    assert [e.experiment_id for e in await records.of_sandbox("k")] == ["e1"]
    await records.start_artifact_clock("k", expires_at=20.0)
    assert await records.expired_artifacts(19.0) == []
    assert sorted(a.artifact_id for a in await records.expired_artifacts(21.0)) == ["a1", "a2"]
    await records.delete_artifacts(["a1", "a2"])
    assert await records.artifact_bytes_of("k") == 0
    assert await records.forget_destroyed_before(10.0) == 1


async def test_disk_holdings_are_the_live_containers_and_the_artifacts_bytes(
    records: SqlExperimentStore,
) -> None:
    """What the disk budget reads before and after each writing call, in one statement:
    the containers of live experiments only, and every artifact's bytes, of one sandbox."""
    assert await records.disk_holdings("k") == DiskHoldings((), 0)
    for experiment_id, key in (("e1", "k"), ("e2", "k"), ("e3", "k"), ("e4", "other")):
        await records.add(an_experiment(experiment_id, sandbox_key=key), "created")
    await records.transition("e1", State.READY, "started", 2.0, container_id="c-live")
    await records.transition("e3", State.READY, "started", 2.0, container_id="c-gone")
    await records.transition("e3", State.DESTROYED, "destroyed", 3.0)
    await records.transition("e4", State.READY, "started", 2.0, container_id="c-other")
    assert await records.disk_holdings("k") == DiskHoldings(("c-live",), 0)  # e2: none yet
    await records.add_artifacts([an_artifact("a1", "e1", 100), an_artifact("a2", "e3", 50)])
    await records.add_artifacts([an_artifact("a3", "e4", 7, key="other")])
    assert await records.disk_holdings("k") == DiskHoldings(("c-live",), 150)
    assert await records.disk_holdings("other") == DiskHoldings(("c-other",), 7)
    assert await records.disk_holdings("nobody") == DiskHoldings((), 0)


async def test_the_ends_of_a_job_s_output_are_cut_alike_on_both_databases(
    records: SqlExperimentStore,
) -> None:
    """``load_job_ends`` (the logs resource) counts and cuts in characters on SQLite and
    PostgreSQL alike, as Python does: multi-byte scripts, around both boundaries."""
    await records.add(an_experiment("e1"), "created")
    outputs = ["", "ok\n", "a" * 30, "a" * 31, "é" * 10 + "🙂" * 25 + "z", "🙂" * 31]
    for n, out in enumerate(outputs):
        job_id = f"j{n}"
        await records.add_job(a_job(job_id, "e1", float(n)))
        await records.finish_job(
            job_id, JobOutcome("completed", 0, out, out[::-1], False, False, 9.0, 1.0, None, None)
        )
        ends = await records.load_job_ends("k", job_id, head=10, tail=20, command_chars=3)
        assert ends is not None
        assert (ends.command, ends.command_length) == ("ech", len("echo hi"))
        for stream, text in ((ends.stdout, out), (ends.stderr, out[::-1])):
            assert stream.length == len(text)
            if len(text) <= 30:
                assert (stream.head, stream.tail) == (text, "")
            else:
                assert (stream.head, stream.tail) == (text[:10], text[-20:])


async def test_a_job_that_printed_a_nul_is_finished_on_both_databases(
    records: SqlExperimentStore,
) -> None:
    """``printf '\\0'`` is a command like any: PostgreSQL's text refused the NUL, the
    whole update failed and the job stayed running for ever (its sandbox busy, never
    emptied). Each NUL is kept as U+FFFD, on both databases alike."""
    await records.add(an_experiment("e1"), "created")
    for job_id, within in (("plain", False), ("budgeted", True)):
        await records.add_job(a_job(job_id, "e1", 1.0))
        outcome = JobOutcome("completed", 0, "a\x00b", "\x00", False, False, 9.0, 1.0, None, None)
        if within:
            kept = await records.finish_job_within(
                job_id, outcome, sandbox_key="k", command="printf", day_budget=1_000_000
            )
            assert kept
        else:
            await records.finish_job(job_id, outcome)
        job = await records.load_job("k", job_id)
        assert job is not None
        assert (job.status, job.stdout, job.stderr) == ("completed", "a\ufffdb", "\ufffd")
        ends = await records.load_job_ends("k", job_id, head=1, tail=1, command_chars=9)
        assert ends is not None
        assert (ends.stdout.head, ends.stdout.tail, ends.stdout.length) == ("a", "b", 3)
