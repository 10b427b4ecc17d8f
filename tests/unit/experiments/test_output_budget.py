"""The daily budget of stored job output (app/experiments/output_budget.py): a job that
fits is kept whole, past the budget only its tails are kept, and the call that waits
for it still gets its result whole and is told. On a fake runtime and real SQLite."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from db_testkit import an_experiment, migrated_sqlite
from runtime_fakes import FakeBackend
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import ServiceError
from app.experiments.core.jobs import JobRegistry
from app.experiments.core.records import JobOutcome, JobRecord
from app.experiments.creation import CreateRequest
from app.experiments.manager import ExperimentManager
from app.experiments.options import ExperimentOptions
from app.experiments.output_budget import (
    CEILING,
    COMMAND_KEPT_CHARS,
    JOB_ROW_BYTES,
    TAIL_CHARS,
    cut,
    stored_bytes,
)
from app.experiments.recovery.process_registry import ProcessRegistry
from app.storage.experiment_store import SqlExperimentStore
from app.storage.process_store import SqlProcessRecords
from jail import CallContext, SandboxMemory, new_call_context

BUDGET = 250_000
LINE = 50_000  # echoed by the fake runtime after the job number: 100,008 bytes stored


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = await migrated_sqlite(tmp_path)
    yield engine
    await engine.dispose()


async def a_manager(engine: AsyncEngine, tmp_path: Path) -> ExperimentManager:
    options = ExperimentOptions(
        hosted=True,
        default_image="img:1",
        artifact_dir=tmp_path / "artifacts",
        job_output_bytes_per_day=BUDGET,
    )
    registry = ProcessRegistry(SqlProcessRecords(engine), stale_s=30)
    await registry.register()
    return ExperimentManager(
        SqlExperimentStore(engine), FakeBackend(), JobRegistry(), options, registry
    )


def a_call(memory: SandboxMemory, key: str, slot: Path) -> CallContext:
    slot.mkdir(exist_ok=True)
    return new_call_context(memory, key, request_id=uuid.uuid4().hex, slot_root=slot)


def test_bytes_are_counted_as_the_database_stores_them_and_cut_to_tails() -> None:
    assert stored_bytes("abc", None, "") == JOB_ROW_BYTES + 3
    # UTF-8 as stored; a lone surrogate is counted, not fatal.
    assert stored_bytes("é✓", "\ud800") == JOB_ROW_BYTES + 2 + 3 + 3
    outcome = JobOutcome(
        "completed", 0, "o" * 9000 + "END", "e" * 10, False, False, 1, 1, None, None
    )
    kept, command = cut(outcome, "c" * 5000)
    assert kept.stdout == ("o" * 9000 + "END")[-TAIL_CHARS:]
    assert kept.stdout.endswith("END")
    assert kept.stderr == "e" * 10
    assert command == "c" * COMMAND_KEPT_CHARS


async def test_past_the_budget_a_result_is_whole_but_only_its_tails_are_kept(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    manager = await a_manager(engine, tmp_path)
    records = SqlExperimentStore(engine)
    memory = SandboxMemory()
    alice = a_call(memory, "alice", tmp_path / "slot-a")
    exp = await manager.create(alice, CreateRequest())
    views = [
        await manager.execute(alice, exp.experiment_id, f"echo {n}" + "x" * LINE) for n in range(5)
    ]
    # Every result was made from the whole output, whatever was kept.
    assert [v.stdout_chars for v in views] == [LINE + 2] * 5
    assert all(v.stdout and v.stdout.endswith("x\n") for v in views)
    # Two jobs of 100,008 bytes fit in 250,000; the third would not.
    assert [v.output_not_kept for v in views] == [False, False, True, True, True]
    assert not any("storage budget" in " ".join(v.notes) for v in views[:2])
    assert all("daily storage budget" in " ".join(v.notes) for v in views[2:])
    later = await manager.job_result(alice, views[4].job_id, 0)
    assert (later.stdout_chars, later.output_not_kept) == (TAIL_CHARS, True)
    assert "daily storage budget" in " ".join(later.notes)
    kept = await manager.job_result(alice, views[0].job_id, 0)
    assert (kept.stdout_chars, kept.output_not_kept) == (LINE + 2, False)
    record = await records.load_job("alice", views[4].job_id)
    assert record is not None
    assert len(record.command) == COMMAND_KEPT_CHARS

    day = int(time.time() // 86_400)
    stored = await records.stored_output_of_day("alice", day)
    cut_job = JOB_ROW_BYTES + COMMAND_KEPT_CHARS + TAIL_CHARS
    assert stored == 2 * (JOB_ROW_BYTES + 2 * LINE + 8) + 3 * cut_job
    # Another sandbox has its own budget: its output is kept whole.
    bob = a_call(memory, "bob", tmp_path / "slot-b")
    other = await manager.create(bob, CreateRequest())
    honest = await manager.execute(bob, other.experiment_id, "echo " + "y" * LINE)
    assert not honest.output_not_kept
    assert await records.stored_output_of_day("bob", day) == JOB_ROW_BYTES + 2 * LINE + 6

    # Past the budget the tails and rows still add up: at CEILING times it, no new job
    # starts that day (bounded loop: each job adds one cut record).
    refused: ServiceError | None = None
    for _ in range(CEILING * BUDGET // cut_job + 2):
        try:
            await manager.execute(alice, exp.experiment_id, "echo " + "x" * LINE)
        except ServiceError as error:
            refused = error
            break
    assert refused is not None
    assert (refused.code, refused.details["limit"]) == ("LIMIT_REACHED", "job_output_per_day")
    assert "UTC day ends" in str(refused)
    stored = await records.stored_output_of_day("alice", day)
    assert CEILING * BUDGET <= stored < CEILING * BUDGET + cut_job
    assert not (await manager.execute(bob, other.experiment_id, "echo still")).output_not_kept
    # Setup commands too: a creation that would run some is refused before anything is
    # recorded (one without any still makes its experiment).
    before = await records.of_sandbox("alice")
    with pytest.raises(ServiceError) as setup_refused:
        await manager.create(alice, CreateRequest(setup_commands=("echo setup",)))
    assert setup_refused.value.details["limit"] == "job_output_per_day"
    assert await records.of_sandbox("alice") == before
    assert (await manager.create(alice, CreateRequest())).state == "READY"


async def test_a_job_s_output_is_charged_to_the_day_it_ended(engine: AsyncEngine) -> None:
    records = SqlExperimentStore(engine)
    await records.add(an_experiment("e1"), "created")
    for n, finished_at in enumerate((86_400.0 * 3 + 5, 86_400.0 * 4 + 5)):
        job_id = f"job_{n}"
        await records.add_job(
            JobRecord(job_id, "e1", "k", "command", "c", "running", False, 30, finished_at - 1)
        )
        outcome = JobOutcome(
            "completed", 0, "o" * 100, "", False, False, finished_at, 1, None, None
        )
        assert await records.finish_job_within(
            job_id, outcome, sandbox_key="k", command="c", day_budget=JOB_ROW_BYTES + 101
        )
    assert await records.stored_output_of_day("k", 3) == JOB_ROW_BYTES + 101
    assert await records.stored_output_of_day("k", 4) == JOB_ROW_BYTES + 101
    assert await records.forget_output_days_before(86_400.0 * 4) == 1
    assert await records.stored_output_of_day("k", 3) == 0
