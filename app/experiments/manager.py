"""The experiment lifecycle: create, run commands (sync or background), inspect, destroy.

Every operation is scoped to the caller's sandbox key, read from the per-call
context; another key's experiment or job answers NOT_FOUND, exactly as an id
that never existed. Every command, its exit code, output and duration, and
every state transition, is recorded before the caller gets an answer.

It is the domain's one façade, every operation a tool can ask for in one place:
each method is a few lines that check ownership and state, then hand over to the
part that does the work (creation, execution, changes, testing, the shelf, compare).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import structlog

from app.errors import ServiceError
from app.experiments.commands import CommandRunner, with_whole_output
from app.experiments.core.errors import (
    ExperimentNotFound,
    InvalidTransition,
    ProjectSourceError,
)
from app.experiments.core.jobs import JobRegistry, stop_job
from app.experiments.core.records import ArtifactRecord, Experiment, JobEnds, JobRecord, JobSummary
from app.experiments.core.states import State
from app.experiments.core.store import ExperimentStore
from app.experiments.creation import (
    CreateRequest,
    ExperimentCreator,
    PreparedSource,
    WarmSource,
)
from app.experiments.evidence import evidence
from app.experiments.evidence.artifacts import ArtifactList
from app.experiments.evidence.compare import Comparison, ExperimentEvidence, recommend
from app.experiments.evidence.shelf import ArtifactShelf, fingerprint
from app.experiments.execution import Execution
from app.experiments.options import ExperimentOptions
from app.experiments.recovery.process_registry import ProcessRegistry
from app.experiments.recovery.recovery import Recovery
from app.experiments.recovery.remote_jobs import RemoteJobs
from app.experiments.recovery.slot_mounts import check_workspace
from app.experiments.removals import DeferredRemovals
from app.experiments.views import (
    EXCERPT_HEAD_CHARS,
    EXCERPT_TAIL_CHARS,
    MAX_LISTED_COMMAND_CHARS,
    MAX_LISTED_JOBS,
    ChangesView,
    CreatedExperiment,
    DestroyReport,
    ExperimentView,
    JobView,
    RuntimeView,
    Stream,
)
from app.experiments.workspace.dirs import ExperimentDirs
from app.experiments.workspace.trash import Trash
from app.runtime.backend import SandboxBackend
from app.tenancy.job_limits import JobLimits
from jail import CallContext, JailError
from jail.context import InThread

OutputPageRequest = tuple[Stream, int, int]  # stream, offset, max characters

log = structlog.get_logger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# get_job_result waits at most this long: MCP clients give up after about a minute.
MAX_RESULT_WAIT_S = 45.0


class ExperimentManager:
    def __init__(
        self,
        records: ExperimentStore,
        backend: SandboxBackend,
        jobs: JobRegistry,
        options: ExperimentOptions,
        registry: ProcessRegistry,
        clock: Callable[[], float] = time.time,
        warm: WarmSource | None = None,
        trash: Trash | None = None,
        prepared: PreparedSource | None = None,
    ) -> None:
        self._records = records
        # Destroyed experiments' folders, deleted after the caller has its answer.
        self.trash = trash or Trash()
        # Destroyed experiments' containers, removed after the caller has its answer.
        self.removals = DeferredRemovals(lambda container_id: self._backend.remove(container_id))
        self._backend = backend
        self._jobs = jobs
        self._options = options
        self._clock = clock
        self.shelf = ArtifactShelf(
            records,
            options.artifact_dir,
            options.artifact_ttl_s,
            clock,
            max_bytes=options.max_artifact_bytes,
        )
        limits = JobLimits(options.max_jobs_per_sandbox, options.max_jobs_per_experiment)
        self._commands = CommandRunner(
            records,
            backend,
            jobs,
            options.max_output_bytes,
            limits,
            clock,
            registry.process_id,
            output_bytes_per_day=options.job_output_bytes_per_day,
        )
        # Jobs and containers of the other server processes on this database.
        self.recovery = Recovery(
            records, backend, registry, jobs, self._commands.kill, clock, self.trash.discard
        )
        self._remote = RemoteJobs(records, backend, registry, clock)
        self._creator = ExperimentCreator(
            records,
            backend,
            self._commands,
            options,
            clock,
            warm=warm,
            prepared=prepared,
            process_id=registry.process_id,
        )
        # Running a command or the tests is Execution's (its state check, the one timeout
        # clamp, the waits): the tools call these two as the manager's own.
        execution = Execution(records, self._commands, options, self.workspace)
        self.execute = in_the_way_of(prepared, execution.execute)
        self.run_tests = in_the_way_of(prepared, execution.run_tests)

    def is_busy(self, sandbox_key: str) -> bool:
        """A job runs for the sandbox, in this process or (as of the last heartbeat) any,
        or one of its experiments is being created here."""
        return (
            self._jobs.is_busy(sandbox_key)
            or sandbox_key in self.recovery.busy
            or self._creator.is_creating(sandbox_key)
        )

    # -- create ------------------------------------------------------------------

    async def create(self, call: CallContext, request: CreateRequest) -> CreatedExperiment:
        # A container the sandbox just destroyed still counts in its share until it is gone.
        await self.removals.settled(call.sandbox_key)
        return await self._creator.create(call, request)

    async def stop_creations(self) -> None:
        """At shutdown: creations still preparing are undone (their records DESTROYED)."""
        await self._creator.close()

    # -- run -----------------------------------------------------------------------

    async def runtime(self) -> RuntimeView:
        return RuntimeView.of(await self._backend.info(), self._options)

    # -- jobs ------------------------------------------------------------------

    async def _job(self, call: CallContext, job_id: str) -> JobRecord:
        row = await self._records.load_job(call.sandbox_key, job_id)
        if row is None:
            raise ExperimentNotFound("job", job_id)
        return row

    async def _job_summary(self, call: CallContext, job_id: str) -> JobSummary:
        """The job without its output (up to 2 MB), for what shows none of it."""
        row = await self._records.load_job_summary(call.sandbox_key, job_id)
        if row is None:
            raise ExperimentNotFound("job", job_id)
        return row

    async def job_status(self, call: CallContext, job_id: str) -> JobView:
        return JobView.summary(await self._job_summary(call, job_id))

    async def job_result(
        self, call: CallContext, job_id: str, wait_s: float, page: OutputPageRequest | None = None
    ) -> JobView:
        """The job's result, waiting up to ``wait_s``; with ``page``, one page of an output
        stream instead of the excerpts."""
        await self._job_summary(call, job_id)  # it exists, and is the caller's
        running = self._jobs.get(job_id)
        wait = max(0.0, min(wait_s, MAX_RESULT_WAIT_S))
        if running is not None:
            await self._jobs.wait(running, wait)
        else:  # maybe another server process runs it: its record says when it ends
            await self._remote.wait(call.sandbox_key, job_id, wait)
        row = await self._job(call, job_id)
        if running is not None and page is None:
            row = with_whole_output(row, running)  # it ended here while this call waited
        view = JobView.of(row) if page is None else JobView.paged(row, *page)
        if view.status == "running":
            view.notes.append("Still running; call get_job_result again to keep waiting.")
        return view

    async def job_record(self, call: CallContext, job_id: str) -> JobRecord:
        """The job as recorded, its whole output included."""
        return await self._job(call, job_id)

    async def job_ends(self, call: CallContext, job_id: str) -> JobEnds:
        """The job as the logs resource shows it: its command cut as the listings cut
        it, and the excerpts' ends of its output (never the whole, up to 2 MB)."""
        ends = await self._records.load_job_ends(
            call.sandbox_key,
            job_id,
            head=EXCERPT_HEAD_CHARS,
            tail=EXCERPT_TAIL_CHARS,
            command_chars=MAX_LISTED_COMMAND_CHARS,
        )
        if ends is None:
            raise ExperimentNotFound("job", job_id)
        return ends

    async def cancel_job(self, call: CallContext, job_id: str) -> JobView:
        row = await self._job(call, job_id)
        running = self._jobs.get(job_id)
        if running is not None and row.status == "running":
            await self._commands.kill(running)
        elif row.status == "running":  # another server process runs it
            await self._remote.cancel(row)
        view = JobView.of(await self._job(call, job_id))
        if running is None and row.status != "running":
            view.notes.append(f"The job had already ended ({view.status}); nothing to cancel.")
        return view

    # -- look ------------------------------------------------------------------------

    async def _get(self, call: CallContext, experiment_id: str) -> Experiment:
        return await self._records.get(call.sandbox_key, experiment_id)

    async def _evidence(
        self, experiment: Experiment, dirs: ExperimentDirs | None, in_thread: InThread
    ) -> ExperimentEvidence:
        """Its evidence, with the exit codes of the jobs its view lists."""
        return await evidence.gather(
            self._records,
            experiment,
            dirs,
            in_thread,
            listed_jobs=MAX_LISTED_JOBS,
            listed_command_chars=MAX_LISTED_COMMAND_CHARS,
        )

    async def get(
        self, call: CallContext, experiment_id: str, jobs_skip: int = 0
    ) -> ExperimentView:
        """The experiment and its newest ``MAX_LISTED_JOBS`` jobs after ``jobs_skip``."""
        experiment = await self._get(call, experiment_id)
        page, total = await self._records.newest_jobs(
            experiment_id, MAX_LISTED_JOBS, jobs_skip, MAX_LISTED_COMMAND_CHARS
        )
        return ExperimentView.listing(experiment, page, total, jobs_skip)

    async def list_all(self, call: CallContext) -> list[ExperimentView]:
        return [ExperimentView.of(e) for e in await self._records.of_sandbox(call.sandbox_key)]

    async def workspace(self, call: CallContext, experiment_id: str) -> Path:
        """The host folder of a live experiment's workspace (for the file tools)."""
        experiment = await self._get(call, experiment_id)
        if experiment.state is State.DESTROYED or call.slot_root is None:
            raise InvalidTransition(
                "That experiment was destroyed, and its files with it; its record remains "
                "(get_experiment).",
                state=State.DESTROYED.value,
            )
        workspace = ExperimentDirs.of(call.slot_root, experiment_id).workspace
        if experiment.container_id is None:
            return workspace  # being created, or refused before it had a workspace
        # One that got a container has its workspace: missing, its storage went away.
        return await check_workspace(workspace)

    # -- changes, comparison, artifacts ----------------------------------------------

    async def inspect_changes(
        self,
        call: CallContext,
        experiment_id: str,
        include_diff: bool,
        max_files_with_diff: int | None = None,
    ) -> ChangesView:
        workspace_dir = await self.workspace(call, experiment_id)
        dirs = ExperimentDirs(
            workspace_dir.parent, workspace_dir, workspace_dir.parent / "baseline"
        )
        report = await evidence.inspect(
            call.in_thread, dirs, include_diff=include_diff, max_files_with_diff=max_files_with_diff
        )
        return ChangesView.of(experiment_id, report)

    async def compare(
        self,
        call: CallContext,
        experiment_ids: list[str],
        labels: Mapping[str, str] | None = None,
    ) -> Comparison:
        """Gather each experiment's evidence and recommend one; ``labels`` name them."""
        if not 2 <= len(set(experiment_ids)) <= 10:
            raise ProjectSourceError("Compare between 2 and 10 different experiments.")
        labels = labels or {}
        # A destroyed experiment's change size is measured just after its destroy answered.
        await self.removals.settled(call.sandbox_key)
        found = []
        for experiment_id in dict.fromkeys(experiment_ids):
            experiment = await self._get(call, experiment_id)
            dirs = (
                ExperimentDirs.of(call.slot_root, experiment_id)
                if call.slot_root is not None and experiment.state is not State.DESTROYED
                else None
            )
            gathered = await self._evidence(experiment, dirs, call.in_thread)
            found.append(gathered.model_copy(update={"label": labels.get(experiment_id)}))
        recommended, reason = recommend(found)
        return Comparison(experiments=found, recommended=recommended, reason=reason)

    async def collect_artifacts(
        self, call: CallContext, experiment_id: str, patterns: list[str]
    ) -> ArtifactList:
        workspace_dir = await self.workspace(call, experiment_id)
        return await self.shelf.collect(
            call.sandbox_key, experiment_id, workspace_dir, patterns, call.in_thread
        )

    async def list_artifacts(self, call: CallContext, experiment_id: str) -> ArtifactList:
        await self._get(call, experiment_id)
        return await self.shelf.listing(call.sandbox_key, experiment_id)

    async def read_artifact(
        self, call: CallContext, experiment_id: str, artifact_id: str, part: int | None = None
    ) -> tuple[ArtifactRecord, bytes]:
        """The artifact whole, or its ``part`` (``shelf.read_part``)."""
        await self._get(call, experiment_id)
        return await self.shelf.read_part(
            call.sandbox_key, experiment_id, artifact_id, part, call.in_thread
        )

    # -- destroy -------------------------------------------------------------------

    async def destroy(self, call: CallContext, experiment_id: str) -> DestroyReport:
        experiment = await self._get(call, experiment_id)
        already = experiment.state is State.DESTROYED
        if not already:
            assert call.slot_root is not None
            dirs = ExperimentDirs.of(call.slot_root, experiment_id)
            await self._teardown(
                experiment, dirs, "destroy_experiment", call.in_thread, remove_later=True
            )
        view = await self.get(call, experiment_id)
        return DestroyReport(**view.model_dump(exclude={"notes"}), already_destroyed=already)

    async def _teardown(
        self,
        experiment: Experiment,
        dirs: ExperimentDirs | None,
        reason: str,
        in_thread: InThread,  # walks dirs, if any: the caller's thread share
        *,
        remove_later: bool = False,
    ) -> None:
        """Stop the experiment's jobs, record its findings, remove its container and
        trash its folder (``dirs``).

        ``remove_later`` (``destroy_experiment``): the container's removal, the measure
        of the workspace's changes and the folder's deletion go on after the return
        (app/experiments/removals.py). On a 5,000-file project the removal took 50 to
        140 ms and the walk 50 (dir) to 75 ms (zfs-fuse: a round trip to a daemon in
        user space for every file's stat), and the destroy 170 ms with the walk alone
        on the caller's time; the findings first recorded say ``changes_pending`` until
        the walk has added the change size.
        """
        for job in self._jobs.running_in(experiment.experiment_id):
            await stop_job(self._backend, job)
            await self._jobs.wait(job, 10)
        for row in await self._records.running_jobs(experiment.experiment_id):
            if self._jobs.get(row.job_id) is None:  # another server process runs it
                await self._remote.cancel(row)
        # Recorded before the folder goes, so destroyed experiments stay comparable.
        # One still being created has no baseline yet, so no changes to report: its
        # creation, finding it DESTROYED, removes what it made.
        walked = None if experiment.state is State.CREATING else dirs
        later = remove_later and dirs is not None and experiment.container_id is not None
        if later:
            await self.removals.turn(experiment.sandbox_key)
            found = await self._evidence(experiment, None, in_thread)
        else:
            # The walk (a thread) overlaps the container's removal (the engine): on a
            # 5,000-file workspace each took about 100 ms of the caller's time (issue 13).
            found, _ = await asyncio.gather(
                self._evidence(experiment, walked, in_thread),
                self._remove_container(experiment),
            )
        findings: dict[str, Any] = {
            "state_before": experiment.state.value,
            "commands": found.jobs_total,
            "last_exit_code": found.last_exit_code,
            "failed_commands": found.jobs_failed,
            "duration_s": found.duration_s,
            "reason": reason,
            "evidence": found.model_dump(),
        }
        if later and walked is not None:
            findings["changes_pending"] = True
        ended: asyncio.Future[bool] | None = None
        kept = None
        if dirs is not None:
            ended = asyncio.get_running_loop().create_future() if later else None
            kept = await self.trash.discard(dirs.root, after=ended)
        fresh = await self._records.load(experiment.sandbox_key, experiment.experiment_id)
        assert fresh is not None
        if fresh.state is State.RUNNING:
            # A job's settlement raced the teardown: close the RUNNING state first.
            await self._records.transition(
                experiment.experiment_id, State.CANCELLED, "torn down while running", self._clock()
            )
        await self._records.transition(
            experiment.experiment_id, State.DESTROYED, reason, self._clock(), findings=findings
        )
        log.info("experiment.destroyed", experiment_id=experiment.experiment_id, reason=reason)
        if ended is not None:
            assert experiment.container_id is not None
            measure = (
                functools.partial(
                    self._complete_findings, experiment.experiment_id, findings, kept, in_thread
                )
                if kept is not None and walked is not None
                else None
            )
            teardown = self.removals.begin(
                experiment.sandbox_key, experiment.container_id, then=measure
            )
            teardown.add_done_callback(
                lambda done: ended.set_result(not done.cancelled() and done.result())
            )

    async def _complete_findings(
        self,
        experiment_id: str,
        findings: dict[str, Any],
        folder: Path,
        in_thread: InThread,
        _container_gone: bool,
    ) -> None:
        """After the answer: the change size of a destroyed experiment, measured on its
        folder in the trash, added to its findings."""
        moved = ExperimentDirs(folder, folder / "workspace", folder / "baseline")
        try:
            report = await evidence.inspect(in_thread, moved, include_diff=False)
        except (JailError, OSError) as exc:
            log.warning("experiment.changes_unmeasured", experiment_id=experiment_id, error=exc)
            report = None
        done = {**findings, "evidence": dict(findings["evidence"])}
        done.pop("changes_pending", None)
        if report is not None:
            done["evidence"]["files_changed"] = report.files_changed
            done["evidence"]["lines_changed"] = report.insertions + report.deletions
        await self._records.complete_findings(experiment_id, done)

    async def _remove_container(self, experiment: Experiment) -> None:
        if experiment.container_id:
            await self._backend.remove(experiment.container_id)

    async def teardown_sandbox(self, sandbox_key: str, reason: str) -> int:
        """Destroy every live experiment of a sandbox (its slot is about to be emptied)."""
        await self.shelf.start_clock(sandbox_key)
        live = await self._records.of_sandbox(sandbox_key, include_destroyed=False)
        for experiment in live:
            # The folders go with the slot reset itself.
            await self._teardown(experiment, None, reason, asyncio.to_thread)  # no walk
        # Containers it destroyed just before still mount its slot's folders.
        await self.removals.settled(sandbox_key)
        return len(live)

    async def live_containers(self) -> dict[str, str]:
        """The container of every live experiment, and its sandbox's label."""
        return {
            e.container_id: fingerprint(e.sandbox_key)
            for e in await self._records.live()
            if e.container_id
        }

    async def recover(self, leased_keys: set[str]) -> dict[str, int]:
        """At start-up: jobs of dead processes, experiments whose sandbox is gone, stopped
        and orphan containers. What live server processes run is left alone."""
        lost = await self.recovery.take_over_dead()
        retired = await self.recovery.retire_refused_creations()
        gone = 0
        live_containers: set[str] = set()
        for experiment in await self._records.live():
            if experiment.sandbox_key not in leased_keys:
                reason = "the sandbox was emptied while the server was down"
                await self._teardown(experiment, None, reason, asyncio.to_thread)  # no walk
                gone += 1
                continue
            if experiment.state is State.RUNNING and not await self._records.running_jobs(
                experiment.experiment_id
            ):
                with contextlib.suppress(InvalidTransition):  # settled by another process
                    await self._records.transition(
                        experiment.experiment_id,
                        State.FAILED,
                        "the server restarted mid-command",
                        self._clock(),
                    )
            if experiment.container_id:
                live_containers.add(experiment.container_id)
        try:
            swept = await self._backend.sweep(
                live_containers, frozenset(await self.recovery.registry.live())
            )
        except ServiceError as exc:
            # Without Docker the service still starts (degraded, as /health says); the
            # sweep runs at the next start with the engine up.
            log.warning("experiments.sweep_skipped", code=exc.code, reason=exc.message)
            swept = 0
        revived = await self.recovery.revive_containers()
        return {
            "lost_jobs": len(lost),
            "experiments_gone": gone,
            "orphans_swept": swept,
            "refused_creations_retired": retired,
            "containers_revived": revived,
        }


def in_the_way_of(
    prepared: PreparedSource | None, call: Callable[P, Awaitable[T]]
) -> Callable[P, Awaitable[T]]:
    """``call``, holding off the containers made ahead while it waits: a burst's first
    commands ran beside a hundred prepared creations at the engine, whose daemons' CPU
    their own runs waited for."""
    if prepared is None:
        return call

    @functools.wraps(call)
    async def held(*args: P.args, **kwargs: P.kwargs) -> T:
        prepared.work_began()
        try:
            return await call(*args, **kwargs)
        finally:
            prepared.work_ended()

    return held
