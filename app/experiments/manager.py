"""The experiment lifecycle: create, run commands (sync or background), inspect, destroy.

Every operation is scoped to the caller's sandbox key, read from the per-call
context; another key's experiment or job answers NOT_FOUND, exactly as an id
that never existed. Every command, its exit code, output and duration, and
every state transition, is recorded before the caller gets an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import structlog

from app.errors import ServiceError
from app.experiments import evidence, project, testing, workspace
from app.experiments.artifacts import ArtifactList
from app.experiments.commands import Command, CommandRunner, TestContext
from app.experiments.compare import Comparison, recommend
from app.experiments.errors import (
    ExperimentNotFound,
    InvalidTransition,
    ModeRefused,
    ProjectSourceError,
    TestsNotDetected,
    TooManyExperiments,
)
from app.experiments.jobs import JobRegistry
from app.experiments.records import ArtifactRow, Experiment, ExperimentRecords, JobRow
from app.experiments.shelf import ArtifactShelf, fingerprint
from app.experiments.states import RUNNABLE, State
from app.experiments.testing import TestPlan
from app.experiments.views import (
    ChangesView,
    CreatedExperiment,
    DestroyReport,
    ExperimentView,
    JobView,
    RuntimeView,
)
from app.experiments.workspace import ExperimentDirs, Owner
from app.runtime.backend import (
    ContainerSpec,
    GitSource,
    Limits,
    NetworkMode,
    SandboxBackend,
)
from jail import CallContext, resolve_env

log = structlog.get_logger(__name__)

# get_job_result waits at most this long: MCP clients give up after about a minute.
MAX_RESULT_WAIT_S = 45.0


@dataclass(frozen=True)
class ExperimentOptions:
    hosted: bool
    default_image: str
    max_experiments: int = 3
    sync_wait_s: float = 45.0
    default_timeout_s: float = 600.0
    max_timeout_s: float = 1800.0
    max_output_bytes: int = 1_048_576
    owner: Owner | None = None
    snapshot_excludes: tuple[str, ...] = ()
    strict_env: bool = True
    egress_allowed: bool = False
    ceilings: Mapping[str, float] = field(default_factory=dict)
    artifact_dir: Path = Path("/nonexistent")
    artifact_ttl_s: float = 86_400


@dataclass(frozen=True)
class CreateRequest:
    name: str = ""
    goal: str = ""
    image: str | None = None
    files: Mapping[str, str] | None = None
    project_path: str | None = None
    from_experiment: str | None = None
    git_url: str | None = None
    git_ref: str | None = None
    setup_commands: Sequence[str] = ()
    network: NetworkMode = "none"
    limits: Limits = field(default_factory=Limits)
    env: Sequence[str] = ()


class ExperimentManager:
    def __init__(
        self,
        records: ExperimentRecords,
        backend: SandboxBackend,
        jobs: JobRegistry,
        options: ExperimentOptions,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self._backend = backend
        self._jobs = jobs
        self._options = options
        self._clock = clock
        self._creating: dict[str, int] = {}
        self.shelf = ArtifactShelf(records, options.artifact_dir, options.artifact_ttl_s, clock)
        self._commands = CommandRunner(records, backend, jobs, options.max_output_bytes, clock)

    def is_busy(self, sandbox_key: str) -> bool:
        return self._jobs.is_busy(sandbox_key)

    # -- create ------------------------------------------------------------------

    async def create(self, call: CallContext, request: CreateRequest) -> CreatedExperiment:
        key = call.sandbox_key
        assert call.slot_root is not None, "create_experiment takes a slot"
        given = (request.files, request.project_path, request.from_experiment, request.git_url)
        if len([source for source in given if source]) > 1:
            raise ProjectSourceError(
                "Give at most one project source: files, project_path, from_experiment or git."
            )
        if request.git_url and request.git_url.startswith("/") and self._options.hosted:
            raise ModeRefused(
                "A git repository on the server's own disk is refused on a hosted server; "
                "give an https URL."
            )
        if request.project_path and self._options.hosted:
            raise ModeRefused(
                "project_path reads the server's own disk and is refused on a hosted server; "
                "send the project as files instead."
            )
        copy_from = None
        if request.from_experiment:
            source = await self._get(call, request.from_experiment)
            if source.state is State.DESTROYED:
                raise InvalidTransition(
                    "That experiment was destroyed; its files are gone.", state=source.state.value
                )
            copy_from = ExperimentDirs.of(call.slot_root, source.experiment_id)
        env = self._env(request.env)
        live = len(await self._records.of_sandbox(key, include_destroyed=False))
        if live + self._creating.get(key, 0) >= self._options.max_experiments:
            raise TooManyExperiments(
                f"Your sandbox already has {self._options.max_experiments} live experiments; "
                "destroy one with destroy_experiment first.",
                limit=self._options.max_experiments,
            )
        self._creating[key] = self._creating.get(key, 0) + 1
        try:
            return await self._create(call, request, copy_from, env)
        finally:
            self._creating[key] -= 1

    async def _create(
        self,
        call: CallContext,
        request: CreateRequest,
        copy_from: ExperimentDirs | None,
        env: dict[str, str],
    ) -> CreatedExperiment:
        assert call.slot_root is not None
        now = self._clock()
        experiment_id = "exp_" + uuid.uuid4().hex[:12]
        image = request.image or self._options.default_image
        record = Experiment(
            experiment_id=experiment_id,
            sandbox_key=call.sandbox_key,
            name=(request.name or experiment_id)[:200],
            goal=request.goal[:4000],
            state=State.CREATING,
            image=image,
            container_id=None,
            isolation={},
            warnings=[],
            source="empty",
            created_at=now,
            updated_at=now,
            findings=None,
        )
        await self._records.add(record, "create_experiment called")
        dirs = ExperimentDirs.of(call.slot_root, experiment_id)
        try:
            prepared = await workspace.prepare(
                dirs,
                files=request.files,
                project_path=Path(request.project_path) if request.project_path else None,
                copy_from=copy_from,
                excludes=self._options.snapshot_excludes,
                owner=self._options.owner,
                clone=self._cloner(request) if request.git_url else None,
            )
            container = await self._backend.create(
                ContainerSpec(
                    experiment_id=experiment_id,
                    sandbox_label=fingerprint(call.sandbox_key),
                    image=image,
                    workspace=dirs.workspace,
                    network=request.network,
                    limits=request.limits,
                    env=env,
                )
            )
        except Exception as exc:
            await self._records.transition(
                experiment_id, State.FAILED, f"creation failed: {type(exc).__name__}", self._clock()
            )
            await workspace.remove(dirs)
            raise
        await self._records.transition(
            experiment_id,
            State.READY,
            "container started",
            self._clock(),
            container_id=container.container_id,
            isolation=asdict(container.isolation),
            warnings=list(container.warnings),
            source=prepared.source,
        )
        setup: list[JobView] = []
        for command in request.setup_commands:
            job = await self._run_and_record(
                call.sandbox_key,
                experiment_id,
                container.container_id,
                command,
                "setup",
                self._options.default_timeout_s,
                env,
            )
            setup.append(job)
            if job.status != "completed":
                break
        view = await self.get(call, experiment_id)
        return CreatedExperiment(
            **view.model_dump(exclude={"notes", "idle_expiry_s"}),
            setup=setup,
            files_copied=prepared.files,
            secrets_skipped=prepared.secrets_skipped,
        )

    def _cloner(self, request: CreateRequest) -> workspace.Cloner:
        assert request.git_url is not None
        url = request.git_url
        # Local mode may clone a repository on this machine; it is mounted read-only.
        source = (
            GitSource(url="", ref=request.git_ref, local_path=Path(url))
            if url.startswith("/")
            else GitSource(url=url, ref=request.git_ref)
        )

        async def clone(target: Path) -> int:
            result = await self._backend.clone(source, target)
            if result.exit_code != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
                raise ProjectSourceError(
                    "git could not clone the repository"
                    + (" (it timed out)" if result.timed_out else "")
                    + (f": {' / '.join(tail)}" if tail else "")
                    + "; check the URL and the ref.",
                )
            return await asyncio.to_thread(_count_files, target)

        return clone

    def _env(self, requests: Sequence[str]) -> dict[str, str]:
        # A hosted server forwards nothing of its own environment: even the error for
        # an unset name would tell a tenant which names the server has.
        host_env: Mapping[str, str] = {} if self._options.hosted else os.environ
        return resolve_env(list(requests), host_env, strict=self._options.strict_env)

    # -- run -----------------------------------------------------------------------

    def _timeout(self, requested: float | None, warnings: list[str]) -> float:
        timeout = requested or self._options.default_timeout_s
        if timeout > self._options.max_timeout_s:
            warnings.append(
                f"timeout_s {timeout:g} is above the ceiling; clamped to "
                f"{self._options.max_timeout_s:g}"
            )
            timeout = self._options.max_timeout_s
        return max(1.0, timeout)

    async def execute(
        self,
        call: CallContext,
        experiment_id: str,
        command: str,
        *,
        background: bool = False,
        timeout_s: float | None = None,
        env: Sequence[str] = (),
    ) -> JobView:
        return await self._execute(
            call, experiment_id, command, background=background, timeout_s=timeout_s, env=env
        )

    async def run_tests(
        self,
        call: CallContext,
        experiment_id: str,
        command: str | None = None,
        *,
        timeout_s: float | None = None,
    ) -> JobView:
        """Detect the runner (unless ``command`` says), run it, and parse its results."""
        workspace_dir = await self.workspace(call, experiment_id)
        plan: TestPlan | None = None
        if not command:
            facts = await asyncio.to_thread(project.facts, workspace_dir)
            plan = testing.detect(facts)
            if plan is None:
                reasons = testing.explain(facts)
                raise TestsNotDetected(
                    "Could not tell how to run this project's tests"
                    + (f" ({'; '.join(reasons)})" if reasons else "")
                    + "; pass `command` (for example `python3 -m pytest`).",
                )
        view = await self._execute(
            call,
            experiment_id,
            command or (plan.command if plan else ""),
            kind="tests",
            timeout_s=timeout_s,
            tests=(workspace_dir, plan),
        )
        if plan is not None:
            view.notes[:0] = plan.notes
        return view

    async def _execute(
        self,
        call: CallContext,
        experiment_id: str,
        command: str,
        *,
        kind: str = "command",
        background: bool = False,
        timeout_s: float | None = None,
        env: Sequence[str] = (),
        tests: TestContext | None = None,
    ) -> JobView:
        experiment = await self._get(call, experiment_id)
        if experiment.state not in RUNNABLE or experiment.container_id is None:
            raise InvalidTransition(
                f"The experiment is {experiment.state.value}; commands run only in a live "
                "experiment (create a new one).",
                state=experiment.state.value,
            )
        if not command.strip():
            raise ProjectSourceError("The command is empty.")
        call.project_map.invalidate()  # a command may change any file
        warnings: list[str] = []
        timeout = self._timeout(timeout_s, warnings)
        running = await self._commands.start(
            Command(
                call.sandbox_key, experiment, command, kind, timeout, self._env(env), background
            ),
            tests,
        )
        job_id = running.job_id
        wait = 0.0 if background else self._options.sync_wait_s
        finished = await self._jobs.wait(running, wait) if wait else False
        row = await self._records.load_job(call.sandbox_key, job_id)
        assert row is not None
        view = JobView.of(row)
        view.notes.extend(warnings)
        if not finished and not background:
            view.notes.append(
                f"The command is still running after {wait:g} s, so it continues in the "
                f"background (to its own timeout of {timeout:g} s). Poll get_job_status or "
                f"wait with get_job_result using job_id {job_id}."
            )
        return view

    async def _run_and_record(
        self,
        sandbox_key: str,
        experiment_id: str,
        container_id: str,
        command: str,
        kind: str,
        timeout_s: float,
        env: dict[str, str],
    ) -> JobView:
        experiment = await self._records.load(sandbox_key, experiment_id)
        assert experiment is not None
        running = await self._commands.start(
            Command(sandbox_key, experiment, command, kind, timeout_s, env, background=False)
        )
        with contextlib.suppress(Exception):
            await running.task
        row = await self._records.load_job(sandbox_key, running.job_id)
        assert row is not None
        return JobView.of(row)

    async def runtime(self) -> RuntimeView:
        info = await self._backend.info()
        return RuntimeView(
            reachable=info.reachable,
            version=info.version,
            images=list(info.images),
            missing_images=list(info.missing_images),
            default_image=self._options.default_image,
            network_default="none",
            egress_allowed=self._options.egress_allowed,
            max_experiments=self._options.max_experiments,
            ceilings=dict(self._options.ceilings),
        )

    # -- jobs ------------------------------------------------------------------

    async def _job(self, call: CallContext, job_id: str) -> JobRow:
        row = await self._records.load_job(call.sandbox_key, job_id)
        if row is None:
            raise ExperimentNotFound("job", job_id)
        return row

    async def job_status(self, call: CallContext, job_id: str) -> JobView:
        return JobView.of(await self._job(call, job_id), with_output=False)

    async def job_result(self, call: CallContext, job_id: str, wait_s: float) -> JobView:
        await self._job(call, job_id)
        running = self._jobs.get(job_id)
        if running is not None:
            await self._jobs.wait(running, max(0.0, min(wait_s, MAX_RESULT_WAIT_S)))
        view = JobView.of(await self._job(call, job_id))
        if view.status == "running":
            view.notes.append("Still running; call get_job_result again to keep waiting.")
        return view

    async def cancel_job(self, call: CallContext, job_id: str) -> JobView:
        row = await self._job(call, job_id)
        running = self._jobs.get(job_id)
        if running is not None and row.status == "running":
            await self._backend.cancel(running.container_id, job_id)
            await self._jobs.wait(running, 10)
        view = JobView.of(await self._job(call, job_id))
        if running is None:
            view.notes.append(f"The job had already ended ({view.status}); nothing to cancel.")
        return view

    # -- look ------------------------------------------------------------------------

    async def _get(self, call: CallContext, experiment_id: str) -> Experiment:
        experiment = await self._records.load(call.sandbox_key, experiment_id)
        if experiment is None:
            raise ExperimentNotFound("experiment", experiment_id)
        return experiment

    async def get(self, call: CallContext, experiment_id: str) -> ExperimentView:
        experiment = await self._get(call, experiment_id)
        return ExperimentView.of(experiment, await self._records.jobs_of(experiment_id))

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
        return ExperimentDirs.of(call.slot_root, experiment_id).workspace

    # -- changes, comparison, artifacts ----------------------------------------------

    async def inspect_changes(
        self, call: CallContext, experiment_id: str, include_diff: bool
    ) -> ChangesView:
        workspace_dir = await self.workspace(call, experiment_id)
        dirs = ExperimentDirs(
            workspace_dir.parent, workspace_dir, workspace_dir.parent / "baseline"
        )
        report = await evidence.inspect(dirs, include_diff=include_diff)
        return ChangesView(experiment_id=experiment_id, **report.model_dump())

    async def compare(self, call: CallContext, experiment_ids: list[str]) -> Comparison:
        if not 2 <= len(set(experiment_ids)) <= 10:
            raise ProjectSourceError("Compare between 2 and 10 different experiments.")
        found = []
        for experiment_id in dict.fromkeys(experiment_ids):
            experiment = await self._get(call, experiment_id)
            dirs = (
                ExperimentDirs.of(call.slot_root, experiment_id)
                if call.slot_root is not None and experiment.state is not State.DESTROYED
                else None
            )
            found.append(await evidence.gather(self._records, experiment, dirs))
        recommended, reason = recommend(found)
        return Comparison(experiments=found, recommended=recommended, reason=reason)

    async def collect_artifacts(
        self, call: CallContext, experiment_id: str, patterns: list[str]
    ) -> ArtifactList:
        workspace_dir = await self.workspace(call, experiment_id)
        return await self.shelf.collect(call.sandbox_key, experiment_id, workspace_dir, patterns)

    async def list_artifacts(self, call: CallContext, experiment_id: str) -> ArtifactList:
        await self._get(call, experiment_id)
        return await self.shelf.listing(call.sandbox_key, experiment_id)

    async def read_artifact(
        self, call: CallContext, experiment_id: str, artifact_id: str
    ) -> tuple[ArtifactRow, bytes]:
        await self._get(call, experiment_id)
        return await self.shelf.read(call.sandbox_key, experiment_id, artifact_id)

    # -- destroy -------------------------------------------------------------------

    async def destroy(self, call: CallContext, experiment_id: str) -> DestroyReport:
        experiment = await self._get(call, experiment_id)
        already = experiment.state is State.DESTROYED
        if not already:
            assert call.slot_root is not None
            await self._teardown(
                experiment, ExperimentDirs.of(call.slot_root, experiment_id), "destroy_experiment"
            )
        view = await self.get(call, experiment_id)
        return DestroyReport(
            **view.model_dump(exclude={"notes", "idle_expiry_s"}), already_destroyed=already
        )

    async def _teardown(
        self, experiment: Experiment, dirs: ExperimentDirs | None, reason: str
    ) -> None:
        for job in self._jobs.running_in(experiment.experiment_id):
            await self._backend.cancel(job.container_id, job.job_id)
            await self._jobs.wait(job, 10)
        jobs = await self._records.jobs_of(experiment.experiment_id)
        # Recorded before teardown, so destroyed experiments stay comparable.
        found = await evidence.gather(self._records, experiment, dirs)
        findings = {
            "state_before": experiment.state.value,
            "commands": len(jobs),
            "last_exit_code": jobs[-1].exit_code if jobs else None,
            "failed_commands": sum(1 for j in jobs if j.status != "completed"),
            "duration_s": round(sum(j.duration_s or 0 for j in jobs), 3),
            "reason": reason,
            "evidence": found.model_dump(),
        }
        if experiment.container_id:
            await self._backend.remove(experiment.container_id)
        if dirs is not None:
            await workspace.remove(dirs)
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

    async def teardown_sandbox(self, sandbox_key: str, reason: str) -> int:
        """Destroy every live experiment of a sandbox (its slot is about to be emptied)."""
        await self.shelf.start_clock(sandbox_key)
        live = await self._records.of_sandbox(sandbox_key, include_destroyed=False)
        for experiment in live:
            # The folders go with the slot reset itself.
            await self._teardown(experiment, None, reason)
        return len(live)

    async def recover(self, leased_keys: set[str]) -> dict[str, int]:
        """At start-up: lost jobs, experiments whose sandbox is gone, orphan containers."""
        lost = await self._records.mark_lost_jobs(self._clock())
        gone = 0
        live_containers: set[str] = set()
        for experiment in await self._records.live():
            if experiment.sandbox_key not in leased_keys:
                await self._teardown(
                    experiment, None, "the sandbox was emptied while the server was down"
                )
                gone += 1
                continue
            if experiment.state is State.RUNNING:
                await self._records.transition(
                    experiment.experiment_id,
                    State.FAILED,
                    "the server restarted mid-command",
                    self._clock(),
                )
            if experiment.container_id:
                live_containers.add(experiment.container_id)
        try:
            swept = await self._backend.sweep(live_containers)
        except ServiceError as exc:
            # Without Docker the service still starts (degraded, as /health says); the
            # sweep runs at the next start with the engine up.
            log.warning("experiments.sweep_skipped", code=exc.code, reason=exc.message)
            swept = 0
        return {"lost_jobs": lost, "experiments_gone": gone, "orphans_swept": swept}


def _count_files(root: Path) -> int:
    return sum(1 for path in root.rglob("*") if ".git" not in path.relative_to(root).parts)
