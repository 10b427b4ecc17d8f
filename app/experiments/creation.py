"""Creating an experiment: check the request, prepare its workspace, start its
container, run its setup commands; every step recorded before the caller hears of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from app.errors import ServiceError
from app.experiments.commands import Command, CommandRunner
from app.experiments.core.errors import (
    InvalidTransition,
    ModeRefused,
    ProjectSourceError,
    TooManyExperiments,
)
from app.experiments.core.records import Experiment
from app.experiments.core.states import State
from app.experiments.core.store import ExperimentStore
from app.experiments.evidence.shelf import fingerprint
from app.experiments.options import ExperimentOptions
from app.experiments.views import CreatedExperiment, ExperimentView, JobView
from app.experiments.workspace import dirs as workspace
from app.experiments.workspace.dirs import ExperimentDirs, WorkspaceReport
from app.runtime.backend import (
    Container,
    ContainerSpec,
    GitSource,
    Limits,
    NetworkMode,
    SandboxBackend,
)
from jail import CallContext, resolve_env

log = structlog.get_logger(__name__)

# Where an experiment's default command timeout is kept: beside the limits it was given.
COMMAND_TIMEOUT_KEY = "command_timeout_s"


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
    egress_allowlist: tuple[str, ...] | None = None  # network "restricted" only
    limits: Limits = field(default_factory=Limits)
    env: Sequence[str] = ()
    # The wall clock of each of its commands (setup ones too) unless a command says.
    timeout_s: float | None = None
    # Served as an MCP task (nobody holds the line): the setup commands run to their end
    # rather than for at most the synchronous wait.
    until_done: bool = False


class WarmSource(Protocol):
    """Containers started before they were asked for (app/runtime/warm/pool.py)."""

    async def take(
        self, slot_root: Path, spec: ContainerSpec, target: Path
    ) -> Container | None: ...


class PreparedSource(Protocol):
    """A sandbox's own container made ahead for its next create
    (app/runtime/warm/prepared.py)."""

    async def take(
        self, key: str, slot_root: Path, spec: ContainerSpec, target: Path
    ) -> Container | None: ...

    def after_create(self, key: str, slot_root: Path, spec: ContainerSpec) -> None: ...

    def work_began(self) -> None:
        """A create, or a call waiting for a command, began: made ahead only in a lull."""
        ...

    def work_ended(self) -> None: ...


def forwarded_env(options: ExperimentOptions, requests: Sequence[str]) -> dict[str, str]:
    """The environment a command asked for, after the credential policy."""
    # A hosted server forwards nothing of its own environment: even the error for
    # an unset name would tell a tenant which names the server has.
    host_env: Mapping[str, str] = {} if options.hosted else os.environ
    return resolve_env(list(requests), host_env, strict=options.strict_env)


class ExperimentCreator:
    def __init__(
        self,
        records: ExperimentStore,
        backend: SandboxBackend,
        commands: CommandRunner,
        options: ExperimentOptions,
        clock: Callable[[], float] = time.time,
        warm: WarmSource | None = None,
        prepared: PreparedSource | None = None,
        process_id: str | None = None,
    ) -> None:
        self._records = records
        # Recorded on each experiment it creates: if this process dies mid-way, recovery
        # in another (or the next) retires what it left CREATING.
        self._process_id = process_id
        self._backend = backend
        self._commands = commands
        self._options = options
        self._clock = clock
        self._warm = warm
        self._prepared = prepared
        # Creations in flight per sandbox key: they count against max_experiments too.
        self._creating: dict[str, int] = {}
        # Their tasks (a creation goes on when its call stops waiting): stopped at shutdown.
        self._preparing: set[asyncio.Task[tuple[WorkspaceReport, float]]] = set()

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
            source = await self._records.get(call.sandbox_key, request.from_experiment)
            if source.state is State.DESTROYED:
                raise InvalidTransition(
                    "That experiment was destroyed; its files are gone.", state=source.state.value
                )
            copy_from = ExperimentDirs.of(call.slot_root, source.experiment_id)
        env = forwarded_env(self._options, request.env)
        live = len(await self._records.of_sandbox(key, include_destroyed=False))
        if live + self._creating.get(key, 0) >= self._options.max_experiments:
            raise TooManyExperiments(
                f"Your sandbox already has {self._options.max_experiments} live experiments; "
                "destroy one with destroy_experiment first.",
                limit=self._options.max_experiments,
            )
        if request.setup_commands:
            # Setup commands skip the check at their start (a refusal halfway would leave
            # a live experiment behind): a sandbox past its ceiling is refused here, before
            # anything is recorded, and one creation adds at most its 50 setup jobs.
            await self._commands.refuse_past_ceiling(key)
        self._creating[key] = self._creating.get(key, 0) + 1
        # The whole call waits ``sync_wait_s``, preparation and setup together: a client
        # such as claude.ai shows a spinner and no progress, and gives up on a call that
        # never answers (a slow clone may take minutes).
        deadline = None if request.until_done else time.monotonic() + self._options.sync_wait_s
        experiment_id = "exp_" + uuid.uuid4().hex[:12]
        detached = asyncio.Event()  # set when the call stops waiting for the preparation
        recorded = asyncio.Event()  # set once its record is written (CREATING)
        task = asyncio.create_task(
            self._prepare_then_set_up(
                call, request, experiment_id, copy_from, env, detached, recorded
            ),
            name=f"create {experiment_id}",
        )
        self._preparing.add(task)
        if self._prepared is not None:
            # Prepared containers wait for a lull in the creates: a burst goes first.
            self._prepared.work_began()
        task.add_done_callback(lambda done: self._ended(key, done))
        # Only a clone or a copy of a project may take long (a clone up to its 300 s):
        # anything else is a container start and a bounded write, waited for whole.
        slow = bool(request.git_url or request.from_experiment or request.project_path)
        if deadline is None or not slow:
            # A call that waits to the end owns its creation: cancelling it cancels that.
            _, timeout_s = await task
        else:
            try:
                await asyncio.wait({task}, timeout=max(deadline - time.monotonic(), 0.0))
            except asyncio.CancelledError:
                detached.set()  # the caller went away: it goes on, setup included, as past
                raise  # the wait (a client that hung up keeps its experiment)
            if not task.done():
                detached.set()  # no await since the wait: the task sees it when it goes on
                return await self._still_preparing(call, request, experiment_id, task, recorded)
            _, timeout_s = task.result()
        setup, notes = await self._set_up(call, request, experiment_id, timeout_s, env, deadline)
        created = await self._records.get(call.sandbox_key, experiment_id)
        # Its only jobs are setup commands: without any, there is nothing to read back.
        jobs = await self._records.jobs_of(experiment_id) if setup else []
        view = ExperimentView.of(created, jobs)
        # Its record holds what the preparation copied (files_copied, secrets_skipped).
        return CreatedExperiment(**view.model_dump(exclude={"notes"}), notes=notes, setup=setup)

    def is_creating(self, sandbox_key: str) -> bool:
        """An experiment of the sandbox is being created (perhaps after its call ended)."""
        return self._creating.get(sandbox_key, 0) > 0

    async def close(self) -> None:
        """At shutdown: stop the creations still preparing; each one undoes itself."""
        for task in list(self._preparing):
            task.cancel()
        for task in list(self._preparing):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _ended(self, key: str, task: asyncio.Task[tuple[WorkspaceReport, float]]) -> None:
        self._preparing.discard(task)
        if self._prepared is not None:
            self._prepared.work_ended()
        self._creating[key] -= 1
        if not self._creating[key]:
            del self._creating[key]
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here, or asyncio would report it unretrieved when nobody waited
            # (the call had stopped waiting); the record keeps why (its warnings).
            log.info("experiment.create_failed", code=getattr(task.exception(), "code", None))

    async def _still_preparing(
        self,
        call: CallContext,
        request: CreateRequest,
        experiment_id: str,
        task: asyncio.Task[tuple[WorkspaceReport, float]],
        recorded: asyncio.Event,
    ) -> CreatedExperiment:
        # A short SYNC_WAIT_S may end before the task has written the record: the answer
        # reads it once written (or once the task ended, written or not).
        written = asyncio.ensure_future(recorded.wait())
        try:
            await asyncio.wait({task, written}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            written.cancel()
        record = await self._records.get(call.sandbox_key, experiment_id)
        doing = "cloning the repository" if request.git_url else "copying the project"
        then = (
            f" Its {len(request.setup_commands)} setup command(s) run after that, recorded "
            "as its jobs."
            if request.setup_commands
            else ""
        )
        note = (
            f"The experiment is still being prepared ({doing}) after "
            f"{self._options.sync_wait_s:g} s, so the preparation continues in the "
            f"background.{then} Call get_experiment(experiment_id={experiment_id!r}) until "
            "its state leaves CREATING: it is usable from then on, unless it ends DESTROYED "
            "(its warnings say why)."
        )
        return CreatedExperiment(
            **ExperimentView.of(record).model_dump(exclude={"notes"}), notes=[note]
        )

    async def _prepare_then_set_up(
        self,
        call: CallContext,
        request: CreateRequest,
        experiment_id: str,
        copy_from: ExperimentDirs | None,
        env: dict[str, str],
        detached: asyncio.Event,
        recorded: asyncio.Event,
    ) -> tuple[WorkspaceReport, float]:
        """Prepare the experiment; once nobody waits for it, run its setup commands here
        too, each to its end (the call that would have run them has answered)."""
        prepared, timeout_s = await self._prepare(
            call, request, experiment_id, copy_from, env, recorded
        )
        if detached.is_set() and request.setup_commands:
            await self._set_up(call, request, experiment_id, timeout_s, env, None)
        return prepared, timeout_s

    async def _prepare(
        self,
        call: CallContext,
        request: CreateRequest,
        experiment_id: str,
        copy_from: ExperimentDirs | None,
        env: dict[str, str],
        recorded: asyncio.Event,
    ) -> tuple[WorkspaceReport, float]:
        """Record the experiment, fill its workspace and start its container: READY, and
        its command timeout; or, on any failure (a cancel too), nothing left but a record
        DESTROYED with why."""
        assert call.slot_root is not None
        now = self._clock()
        timeout_s, clamped = self._options.command_timeout(request.timeout_s)
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
            creator_process=self._process_id,
        )
        await self._records.add(record, "create_experiment called")
        recorded.set()
        dirs = ExperimentDirs.of(call.slot_root, experiment_id)
        spec = ContainerSpec(
            experiment_id=experiment_id,
            sandbox_label=fingerprint(call.sandbox_key),
            image=image,
            workspace=dirs.workspace,
            network=request.network,
            egress_allowlist=request.egress_allowlist,
            limits=request.limits,
            env=env,
            signin_label=fingerprint(call.signin_address) if call.signin_address else "",
        )
        started: list[Container] = []  # the container, once there is one
        starting: asyncio.Future[Container] | None = None  # a cold one, while it starts
        path = "cold"  # how it came: recorded with the transition to READY
        try:
            if self._warm is not None:
                # The caller's own slot's warm container, its folder renamed to dirs.root.
                warm = await self._warm.take(call.slot_root, spec, dirs.root)
                started += [warm] if warm is not None else []
                path = "warm" if started else path
            if not started and self._prepared is not None:
                # The container made for this sandbox after its last create.
                mine = await self._prepared.take(call.sandbox_key, call.slot_root, spec, dirs.root)
                started += [mine] if mine is not None else []
                path = "prepared" if started else path
            if not started:
                await workspace.make_dirs(dirs, self._options.owner, call.in_thread)
            fill = workspace.prepare(
                dirs,
                files=request.files,
                project_path=Path(request.project_path) if request.project_path else None,
                copy_from=copy_from,
                excludes=self._options.snapshot_excludes,
                owner=self._options.owner,
                clone=self._cloner(request, call) if request.git_url else None,
                made=True,
                in_thread=call.in_thread,
            )
            if started:
                prepared = await fill
            else:
                # The container starts while the workspace fills: nothing runs in it until
                # both are done, and the mount needs only the (existing) folder.
                starting = asyncio.ensure_future(self._backend.create(spec))
                filled, cold = await asyncio.gather(fill, starting, return_exceptions=True)
                started += [cold] if isinstance(cold, Container) else []
                for outcome in (filled, cold):
                    if isinstance(outcome, BaseException):
                        raise outcome
                assert isinstance(filled, workspace.WorkspaceReport)
                prepared = filled
            container = started[0]
            if self._prepared is not None:
                # The next create's container, made in the background while this one is used.
                self._prepared.after_create(call.sandbox_key, call.slot_root, spec)
            # Inside the try: a destroy_experiment that came while it was being prepared
            # (CREATING -> DESTROYED) refuses this, and the container goes.
            await self._records.transition(
                experiment_id,
                State.READY,
                "container started" if path == "cold" else f"container started ({path})",
                self._clock(),
                container_id=container.container_id,
                # The command wall clock is a limit like the others; commands read it here.
                isolation={**asdict(container.isolation), COMMAND_TIMEOUT_KEY: timeout_s},
                warnings=[*container.warnings, *([clamped] if clamped else [])],
                source=prepared.source,
                files_copied=prepared.files,
                secrets_skipped=prepared.secrets_skipped,
            )
        except (Exception, asyncio.CancelledError) as exc:
            made = _started(starting) if starting is not None else None
            if made is not None and made not in started:
                started.append(made)  # cancelled after the container started
            # Shielded: a cancel (the server stopping) must not leave a half-made experiment.
            await asyncio.shield(self._undo(call, experiment_id, dirs, started, exc))
            raise
        return prepared, timeout_s

    async def _undo(
        self,
        call: CallContext,
        experiment_id: str,
        dirs: ExperimentDirs,
        started: list[Container],
        exc: BaseException,
    ) -> None:
        """Nothing is left (the container removed, the workspace too): the record ends
        DESTROYED, so a refused request never counts toward MAX_EXPERIMENTS; its
        transition keeps why, and its warnings the sentence for the agent (who may read
        it with get_experiment when the call had stopped waiting)."""
        for begun in started:  # the workspace failed after the container started
            with contextlib.suppress(ServiceError):
                await self._backend.remove(begun.container_id)
        why = (
            exc.message
            if isinstance(exc, ServiceError)
            else "The server stopped while it was being created; create it again with "
            "create_experiment."
            if isinstance(exc, asyncio.CancelledError)
            else "It could not be created."
        )
        with contextlib.suppress(InvalidTransition):  # destroyed meanwhile: already so
            await self._records.transition(
                experiment_id,
                State.DESTROYED,
                _refusal(exc),
                self._clock(),
                warnings=[f"Creation failed: {why}"[:2000]],
            )
        await workspace.remove(dirs, call.in_thread)

    async def _set_up(
        self,
        call: CallContext,
        request: CreateRequest,
        experiment_id: str,
        timeout_s: float,
        env: dict[str, str],
        deadline: float | None,
    ) -> tuple[list[JobView], list[str]]:
        """Run the setup commands in order, stopping at the first that does not complete.

        A call on the line waits for them until ``deadline`` (its ``sync_wait_s`` in all,
        preparation included), as for any command: a
        client such as claude.ai shows a spinner and no progress, and gives up on a call
        that never answers. A command still running then goes on in the background as
        its job (one at a time per experiment, as the output readers' bound counts), the
        ones after it are not started, and the result says so, naming the job.
        """
        commands = request.setup_commands
        setup: list[JobView] = []
        for index, command in enumerate(commands):
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if wait is not None and wait <= 0 and setup:
                return setup, [_setup_not_started(commands, index, None, self._options)]
            job, finished = await self._run_and_record(
                call.sandbox_key, experiment_id, command, timeout_s, env, wait
            )
            setup.append(job)
            if not finished:
                note = (
                    f"Setup command {index + 1} of {len(commands)} is still running after "
                    f"{self._options.sync_wait_s:g} s, so it continues in the background as "
                    f"job {job.job_id} (to its own timeout of {timeout_s:g} s); the "
                    "experiment is usable meanwhile."
                )
                rest = _setup_not_started(commands, index + 1, job, self._options)
                return setup, [note + (" " + rest if index + 1 < len(commands) else "")]
            if job.status != "completed":
                break
        return setup, []

    def _cloner(self, request: CreateRequest, call: CallContext) -> workspace.Cloner:
        assert request.git_url is not None
        url = request.git_url
        # Local mode may clone a repository on this machine; it is mounted read-only.
        source = (
            GitSource(url="", ref=request.git_ref, local_path=Path(url))
            if url.startswith("/")
            else GitSource(url=url, ref=request.git_ref)
        )

        async def clone(target: Path) -> int:
            result = await self._backend.clone(
                source,
                target,
                sandbox_label=fingerprint(call.sandbox_key),
                signin_label=fingerprint(call.signin_address) if call.signin_address else "",
            )
            if result.exit_code != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
                raise ProjectSourceError(
                    "git could not clone the repository"
                    + (" (it timed out)" if result.timed_out else "")
                    + (f": {' / '.join(tail)}" if tail else "")
                    + "; check the URL and the ref.",
                )
            return await call.in_thread(workspace.count_cloned_files, target)

        return clone

    async def _run_and_record(
        self,
        sandbox_key: str,
        experiment_id: str,
        command: str,
        timeout_s: float,
        env: dict[str, str],
        wait_s: float | None,
    ) -> tuple[JobView, bool]:
        """A setup command's job, waited for ``wait_s`` (None: to its end, killed if the
        call is cancelled); and whether it finished."""
        experiment = await self._records.get(sandbox_key, experiment_id)
        row, finished = await self._commands.run(
            Command(sandbox_key, experiment, command, "setup", timeout_s, env, background=False),
            wait_s=wait_s,
        )
        return JobView.of(row), finished


def _setup_not_started(
    commands: Sequence[str], first: int, running: JobView | None, options: ExperimentOptions
) -> str:
    """The note for setup commands ``first`` onwards, not started: which, and what to do
    (after ``running``, the one still running, when there is one)."""
    left = len(commands) - first
    which = (
        f"Setup command {first + 1} was"
        if left == 1
        else f"Setup commands {first + 1} to {len(commands)} were"
    )
    them = "it" if left == 1 else "them"
    if running is None:
        return (
            f"{which} not started: the ones before took the call's {options.sync_wait_s:g} s. "
            f"Run {them} with execute_experiment."
        )
    return (
        f"{which} not started: run {them} with execute_experiment once "
        f"get_job_result(job_id={running.job_id!r}) says job {running.job_id} completed."
    )


def _started(starting: asyncio.Future[Container]) -> Container | None:
    """The container a cold start made, if it made one."""
    if not starting.done() or starting.cancelled() or starting.exception() is not None:
        return None
    return starting.result()


def _refusal(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    return f"creation failed: {code or type(exc).__name__}"
