"""Running one command in an experiment: its job record, its run, its outcome.

The experiment moves to RUNNING when its first job starts and to the outcome of
its last job when that one ends; every job's command, exit code, output and
duration are recorded before anyone is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from app.errors import InvalidArgument
from app.experiments.core.errors import InvalidTransition
from app.experiments.core.jobs import JobRegistry, RunningJob, stop_job
from app.experiments.core.records import Experiment, JobOutcome, JobRecord, Move
from app.experiments.core.states import State, outcome_state
from app.experiments.core.store import ExperimentStore
from app.experiments.evidence import project, testing
from app.experiments.evidence.testing import TestPlan
from app.experiments.output_budget import CEILING, ceiling_refusal, day_of
from app.runtime.backend import ExecResult, SandboxBackend
from app.runtime.errors import ExecutorStopped, RuntimeFailure
from app.tenancy.job_limits import JobLimits
from jail.context import InThread

log = structlog.get_logger(__name__)

# run_tests: the workspace to read the report from, and the plan detection chose.
# The workspace, the detected runner, and the caller's thread share (reads its report).
TestContext = tuple[Path, TestPlan | None, InThread]


@dataclass(frozen=True)
class Command:
    sandbox_key: str
    experiment: Experiment
    text: str
    kind: str  # setup | command | tests
    timeout_s: float
    env: dict[str, str]
    background: bool


def refuse_nul(command: Command) -> None:
    """No process can be given a NUL byte (C strings end there): refused before anything
    is recorded, whichever exec path would run it (the environment's values are checked
    by ``jail.env_policy``)."""
    if "\x00" in command.text:
        raise InvalidArgument(
            "The command contains a NUL byte (\\x00), which no program can receive; remove it."
        )


class CommandRunner:
    def __init__(
        self,
        records: ExperimentStore,
        backend: SandboxBackend,
        jobs: JobRegistry,
        max_output_bytes: int,
        limits: JobLimits,
        clock: Callable[[], float] = time.time,
        process_id: str | None = None,
        output_bytes_per_day: int | None = None,
    ) -> None:
        self._records = records
        # Stored job bytes per sandbox and UTC day (None: no budget); see output_budget.
        self._output_bytes_per_day = output_bytes_per_day
        self._process_id = process_id
        self._backend = backend
        self._jobs = jobs
        self._limits = limits
        self._max_output_bytes = max_output_bytes
        self._clock = clock
        # Jobs' pids being written (held: a task nobody references may be collected).
        self._pids_writes: set[asyncio.Task[None]] = set()

    async def run(
        self, command: Command, *, wait_s: float | None, tests: TestContext | None = None
    ) -> tuple[JobRecord, bool]:
        """Start ``command`` and wait up to ``wait_s`` seconds without cancelling it; the
        job as recorded then, and whether it had finished. ``wait_s=None``: the caller
        owns the command (a setup command, an MCP task): it waits to the end, and if the
        call is cancelled the command is killed (``run_to_end``).

        The one way a caller runs a command and reads its outcome (a command, a test run,
        a setup command).

        Raises:
            LimitReached: as for ``start``.
            RuntimeFailure: the runtime failed while this call waited (the job records it).
        """
        if wait_s is None:
            running = await self.start_owned(command, tests)
            await self.run_to_end(running)
            finished = True
        else:
            running = await self.start(command, tests)
            finished = await self._jobs.wait(running, wait_s) if wait_s > 0 else False
        record = await self._records.load_job(command.sandbox_key, running.job_id)
        assert record is not None  # written by start, never deleted while it runs
        return with_whole_output(record, running), finished

    async def start(self, command: Command, tests: TestContext | None = None) -> RunningJob:
        """Record the job, move the experiment to RUNNING (if idle) and start the command.

        Raises:
            LimitReached: the experiment or the sandbox runs its maximum of jobs at once
                (setup commands are not counted: see ``app.tenancy.job_limits``).
        """
        refuse_nul(command)
        if command.kind != "setup":  # create_experiment checks before its setup commands
            await self.refuse_past_ceiling(command.sandbox_key)
        release = _nothing
        if command.kind != "setup":
            release = self._limits.claim(command.sandbox_key, command.experiment.experiment_id)
        try:
            running = await self._start(command, tests, release)
        except BaseException:
            release()
            raise
        # Released when the run ends (in _finish); this covers a task cancelled unstarted.
        running.task.add_done_callback(lambda _: release())
        return running

    async def refuse_past_ceiling(self, sandbox_key: str) -> None:
        """Past ``CEILING`` times its daily budget of stored job output a sandbox starts
        no job until the UTC day ends: the cut records past the budget still add rows,
        and this bounds them (app/experiments/output_budget.py).

        Raises:
            LimitReached: the sandbox's day is at its ceiling.
        """
        budget = self._output_bytes_per_day
        if budget is None:
            return
        now = self._clock()
        stored = await self._records.stored_output_of_day(sandbox_key, day_of(now))
        if stored >= CEILING * budget:
            raise ceiling_refusal(stored, budget, now)

    async def start_owned(self, command: Command, tests: TestContext | None = None) -> RunningJob:
        """``start``, for a caller that owns its command (see ``run_to_end``): if the call
        is cancelled while the command is being recorded and started, the start still
        completes, and the command is killed, so no record is left saying "running"."""
        starting = asyncio.ensure_future(self.start(command, tests))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # a refused start has nothing to kill
                await asyncio.shield(self._kill_once_started(starting))
            raise

    async def _kill_once_started(self, starting: asyncio.Future[RunningJob]) -> None:
        await self.kill(await starting)

    async def run_to_end(self, running: RunningJob) -> None:
        """Wait for the command to end, however long it runs; if the waiting call is
        cancelled first, kill the command (as ``cancel_job`` does) before giving up.

        For callers that own their command: a setup command, or a call served as an
        MCP task, whose cancellation (``tasks/cancel``) means "stop this work". The
        command's own errors reach the caller.
        """
        try:
            await asyncio.shield(running.task)
        except asyncio.CancelledError:
            if not running.task.done():
                # The call was cancelled, not the command (at shutdown the registry
                # cancels the command itself, and its container is kept).
                await asyncio.shield(self.kill(running))
            raise

    async def kill(self, running: RunningJob) -> None:
        """Kill the command's process tree and wait (10 s at most) for its record."""
        await stop_job(self._backend, running)
        await self._jobs.wait(running, 10)

    async def _record_pids(self, job_id: str, pids: tuple[int, int]) -> None:
        try:
            await self._records.record_job_pids(job_id, pids)
        except Exception:
            log.warning("job.pids_not_recorded", job_id=job_id, exc_info=True)

    async def _start(
        self, command: Command, tests: TestContext | None, release: Callable[[], None]
    ) -> RunningJob:
        sandbox_key, experiment = command.sandbox_key, command.experiment
        kind, timeout_s, background = command.kind, command.timeout_s, command.background
        job_id = "job_" + uuid.uuid4().hex[:12]
        now = self._clock()
        job = JobRecord(
            job_id=job_id,
            experiment_id=experiment.experiment_id,
            sandbox_key=sandbox_key,
            kind=kind,
            command=command.text,
            status="running",
            background=background,
            timeout_s=timeout_s,
            started_at=now,
            owner_process=self._process_id,
        )
        try:
            # The job and the experiment's move to RUNNING (where it is not already), in
            # one write, whatever the other jobs do: one whose end is being written
            # leaves it alone once this is recorded (store: a job's end moves only the
            # experiment with no other job running).
            running = Move(job.experiment_id, State.RUNNING, f"{kind} {job_id} started")
            await self._records.add_job(job, then=running)
        except InvalidTransition:
            # It cannot run (destroyed meanwhile): this job is refused, and its record
            # says so.
            await self._records.add_job(job)
            await self._records.finish_job(job_id, _never_started(self._clock()))
            raise
        assert experiment.container_id is not None
        stopping = asyncio.Event()
        work = self._finish(
            sandbox_key,
            experiment.experiment_id,
            experiment.container_id,
            job_id,
            command.text,
            timeout_s,
            command.env,
            tests,
            release,
            stopping,
        )
        return self._jobs.start(
            job_id,
            sandbox_key,
            experiment.experiment_id,
            experiment.container_id,
            work,
            stopping,
            command.text,
        )

    async def _finish(
        self,
        sandbox_key: str,
        experiment_id: str,
        container_id: str,
        job_id: str,
        command: str,
        timeout_s: float,
        env: dict[str, str],
        tests: TestContext | None,
        release: Callable[[], None],
        stopping: asyncio.Event,
    ) -> ExecResult:
        started = self._clock()
        announced = False

        async def record_pids(pids: tuple[int, int]) -> None:
            # With them any process can kill this job's tree (a cancel through another
            # server process). Written beside the run, not before its end is read: a
            # short command's answer waited for this write (a burst's first commands,
            # each behind a hundred others' writes). A failed write only costs that.
            nonlocal announced
            announced = True
            writing = asyncio.create_task(self._record_pids(job_id, pids))
            self._pids_writes.add(writing)
            writing.add_done_callback(self._pids_writes.discard)

        try:
            if stopping.is_set():  # stopped before it reached the runtime: never started
                result = ExecResult(None, "", "", False, False, 0.0, cancelled=True)
            else:
                result = await self._backend.run(
                    container_id,
                    command,
                    timeout_s=timeout_s,
                    job_id=job_id,
                    max_output_bytes=self._max_output_bytes,
                    env=env,
                    on_start=record_pids,
                )
        except RuntimeFailure as exc:
            release()
            await self._runtime_failed(experiment_id, job_id, exc, announced, started)
            raise
        except Exception as exc:
            release()
            result = ExecResult(None, "", "", False, False, self._clock() - started)
            await self._settle(experiment_id, job_id, result, reason=f"the runtime failed: {exc}")
            raise
        finally:
            # The run (and its output stream) is over before anyone can see the outcome.
            release()
        if result.exit_code not in (0, None) and not result.timed_out:
            control = await self._records.job_control(job_id)
            if control is not None and control.cancel_requested:
                # Killed through another server process (cancel_job there).
                result = dataclasses.replace(result, exit_code=None, cancelled=True)
        summary = await self._summarize(tests, result) if tests is not None else None
        await self._settle(
            experiment_id, job_id, result, test_summary=summary, stored=(sandbox_key, command)
        )
        return result

    async def _runtime_failed(
        self,
        experiment_id: str,
        job_id: str,
        exc: RuntimeFailure,
        started_running: bool,
        started_at: float,
    ) -> None:
        """The engine failed under the job (it stopped, restarted, lost the container):
        a job that ran is lost with the reason, one that never started failed; the
        experiment itself is not at fault, so it goes back to READY (its container is
        started again once the engine is back: ``app.experiments.recovery.recovery``)."""
        now = self._clock()
        if isinstance(exc, ExecutorStopped):
            # Not the engine: the sandbox's executor, and the message says why. The
            # command was handed to the executor, so it may have run whether or not its
            # start was announced (a command that floods the executor's stdout can
            # overtake the announcement): its result is lost either way.
            status = "lost"
            reason = exc.message
        elif started_running:
            status = "lost"
            reason = (
                f"The Docker engine failed under it ({exc.code}: its container stopped or the "
                "engine became unreachable, as when the engine restarts); its process tree "
                "died with it and its result is lost. The experiment's container is started "
                "again once the engine is back (its workspace is kept): run the command again."
            )
        else:
            status = "failed"
            reason = f"The Docker engine could not start it ({exc.code}: {exc.message})."
        await self._records.finish_job(
            job_id,
            JobOutcome.without_output(
                status, finished_at=now, duration_s=round(now - started_at, 3), reason=reason
            ),
        )
        others = [job for job in self._jobs.running_in(experiment_id) if job.job_id != job_id]
        if not others:
            with contextlib.suppress(InvalidTransition):  # destroyed meanwhile
                await self._records.transition(
                    experiment_id, State.READY, f"{job_id} {status}: {exc.code}", now
                )

    @staticmethod
    async def _summarize(tests: TestContext, result: ExecResult) -> dict[str, Any]:
        workspace_dir, plan, in_thread = tests
        # The report (up to 20 MB) and the output are the tenant's: parsed in its thread
        # share, never on the loop (a 16 MB JUnit report took 0.4 s there).
        if plan is None:
            summary = await in_thread(
                testing.parse_any, result.stdout, result.stderr, result.exit_code
            )
        else:
            report = await in_thread(project.read_report, workspace_dir, plan.report_path)
            summary = await in_thread(
                testing.parse, plan.runner, result.stdout, result.stderr, report, result.exit_code
            )
        return asdict(summary)

    async def _settle(
        self,
        experiment_id: str,
        job_id: str,
        result: ExecResult,
        reason: str | None = None,
        test_summary: dict[str, Any] | None = None,
        stored: tuple[str, str] | None = None,
    ) -> None:
        """Record how the job ended and move the experiment on. ``stored``: the job's
        sandbox key and command, to charge with its output to the sandbox's daily
        budget of stored job output (none: a job that failed to run, with no output)."""
        state = outcome_state(
            result.exit_code, timed_out=result.timed_out, cancelled=result.cancelled
        )
        if reason is not None:
            state = State.FAILED
        status = {
            State.COMPLETED: "completed",
            State.FAILED: "failed",
            State.TIMEOUT: "timeout",
            State.CANCELLED: "cancelled",
        }[state]
        if result.timed_out:
            reason = "It ran past its timeout; its whole process tree was killed."
        elif result.cancelled:
            reason = "Cancelled; its whole process tree was killed."
        now = self._clock()
        outcome = JobOutcome(
            status=status,
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            stdout_truncated=result.stdout_truncated,
            stderr_truncated=result.stderr_truncated,
            finished_at=now,
            duration_s=round(result.duration_s, 3),
            reason=reason,
            test_summary=test_summary,
        )
        # The experiment moves on with its last job's end, in the same write (unless it
        # was destroyed meanwhile).
        others = [job for job in self._jobs.running_in(experiment_id) if job.job_id != job_id]
        then = None if others else Move(experiment_id, state, f"{job_id} {status}")
        if self._output_bytes_per_day is None or stored is None:
            await self._records.finish_job(job_id, outcome, then=then)
        else:
            kept = await self._records.finish_job_within(
                job_id,
                outcome,
                sandbox_key=stored[0],
                command=stored[1],
                day_budget=self._output_bytes_per_day,
                then=then,
            )
            if not kept:
                log.info("job.output_not_kept", job_id=job_id, experiment_id=experiment_id)


def with_whole_output(record: JobRecord, running: RunningJob) -> JobRecord:
    """``record`` with the whole output its run returned, when the budget kept only its
    tails (app/experiments/output_budget.py) and the run ended in this process: the
    call that waited for the job gets its result whole, as any other job's."""
    if not record.output_not_kept or not running.task.done() or running.task.cancelled():
        return record
    if running.task.exception() is not None:
        return record
    result = running.task.result()
    return dataclasses.replace(
        record, stdout=result.stdout, stderr=result.stderr, command=running.command
    )


def _nothing() -> None:
    """The release of a job that was not counted (a setup command)."""


def _never_started(at: float) -> JobOutcome:
    return JobOutcome.without_output(
        "failed",
        finished_at=at,
        duration_s=0.0,
        reason="The experiment stopped being live before the command could start.",
    )
