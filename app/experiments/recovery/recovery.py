"""What comes back, and what is reported lost, when a server process or the Docker
engine goes away under running work.

Run once at start-up and then every heartbeat (``ProcessRegistry.beat_s``) by each
process; every step is idempotent, so processes running it at once agree:

* jobs of dead processes (heartbeat stale, or no owner recorded) are marked lost,
  their process trees killed, and their experiments leave RUNNING;
* containers of live experiments that the engine holds stopped (a restart of the
  Docker daemon stops every container) are started again, the same containers, so
  hardened exactly as before, on their intact workspaces; one the engine no longer
  has at all (two rounds in a row: a destroy in progress removes it first) is
  recreated (``app.experiments.recovery.recreation``);
* experiments whose creation was refused before they got a container (for example
  while the engine was down) are retired, so they no longer count toward the
  live-experiment limit; so is one still CREATING whose creating process died (a
  clone or a copy that went on past its call when the server was killed): its record
  ends DESTROYED with a warning saying to create it again, its folder goes to its
  slot's trash, and the containers its process left (the clone helper, a container
  not yet recorded) are swept;
* a ZFS slot whose dataset went away under live experiments (zfs-fuse restarted) is
  mounted again before the revive step (``app.experiments.recovery.slot_mounts``);
* a cancel asked for through another process reaches the job's owner here too;
* the sandboxes with a job running in any process are noted for the idle check.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from app.errors import ServiceError
from app.experiments.core.errors import InvalidTransition
from app.experiments.core.jobs import JobRegistry, RunningJob
from app.experiments.core.records import LostJob
from app.experiments.core.states import State
from app.experiments.core.store import ExperimentStore
from app.experiments.recovery.process_registry import ProcessRegistry
from app.experiments.recovery.recreation import recreate
from app.experiments.workspace.dirs import ExperimentDirs
from app.runtime.backend import SandboxBackend
from app.sampling import ThrottledLog
from pool.background import cancel_and_wait
from pool.slots import Slot

log = structlog.get_logger(__name__)

DEAD_OWNER = (
    "The server process running this job stopped before it ended; its process tree "
    "was killed and its result is lost. Run the command again."
)
# No creation takes this long (a clone stops at 300 s): one still CREATING was left by a
# server process that stopped mid-way.
STALE_CREATION_S = 3600.0
REFUSED_CREATION = (
    "its creation was refused before it had a container; retired so that it no "
    "longer counts toward the live-experiment limit"
)
CREATOR_STOPPED = "the server process creating it stopped; retired"
# What the agent reads (get_experiment's warnings), as a failed creation's are worded.
CREATOR_STOPPED_WARNING = (
    "Creation failed: the server stopped (restarted or killed) while it was being "
    "prepared, so nothing of it is left. Create it again with create_experiment."
)


async def _no_slot(_key: str) -> Slot | None:
    return None


async def _nothing() -> None:
    return None


async def _keep(_folder: Path) -> None:
    return None


class Recovery:
    def __init__(
        self,
        records: ExperimentStore,
        backend: SandboxBackend,
        registry: ProcessRegistry,
        jobs: JobRegistry,
        kill: Callable[[RunningJob], Awaitable[None]],
        clock: Callable[[], float] = time.time,
        discard: Callable[[Path], Awaitable[object]] = _keep,
    ) -> None:
        self._records = records
        # Moves an experiment's folder to its slot's trash (the manager's Trash).
        self._discard = discard
        self._backend = backend
        self.registry = registry
        self._jobs = jobs
        self._kill = kill
        self._clock = clock
        # Sandboxes with a job running in any process (refreshed every round).
        self.busy: frozenset[str] = frozenset()
        # Where a sandbox's slot is (set by the composition root); None: not leased.
        self.slot_of: Callable[[str], Awaitable[Slot | None]] = _no_slot
        # Remounts the slots whose storage went away (set for ZFS slots: slot_mounts).
        self.check_mounts: Callable[[], Awaitable[object]] = _nothing
        self._missing: set[str] = set()  # containers missing at the last round
        self._task: asyncio.Task[None] | None = None
        # The database or the engine away fails each step on every round: once a minute.
        self._failures = ThrottledLog(log)

    # -- steps -------------------------------------------------------------------------

    async def take_over_dead(self) -> list[LostJob]:
        """Mark the running jobs of dead processes lost, kill their trees, settle their
        experiments; forget the dead processes. The jobs marked."""
        lost = await self._records.mark_lost_jobs(
            self._clock(), await self.registry.live(), DEAD_OWNER
        )
        for job in lost:
            if job.container_id and job.pids:
                # Commands outlive the process that exec'd them: nothing may run on
                # unobserved.
                with contextlib.suppress(ServiceError):
                    await self._backend.kill_tree(job.container_id, job.pids)
        for experiment_id in {job.experiment_id for job in lost}:
            await self._settle(experiment_id, "the server process running its command stopped")
        await self.registry.forget_dead()
        if lost:
            log.warning("jobs.lost", jobs=len(lost))
        return lost

    async def _settle(self, experiment_id: str, reason: str) -> None:
        if await self._records.running_jobs(experiment_id):
            return  # another live process still runs a job there
        with contextlib.suppress(InvalidTransition):  # not RUNNING (any more)
            await self._records.transition(experiment_id, State.FAILED, reason, self._clock())

    async def revive_containers(self) -> int:
        """Start the stopped containers of live experiments again, and recreate those
        missing two rounds in a row; how many came back."""
        live = {e.container_id: e for e in await self._records.live() if e.container_id}
        if not live:
            return 0
        try:
            revival = await self._backend.revive(set(live))
        except ServiceError:
            return 0  # the engine is still away: the next round tries again
        if revival.started:
            log.warning("experiments.revived", containers=len(revival.started))
        missing, self._missing = set(revival.missing) & self._missing, set(revival.missing)
        recreated = 0
        for container_id in missing:
            experiment = live[container_id]
            slot = await self.slot_of(experiment.sandbox_key)
            if slot is None:
                continue  # its sandbox is being emptied: the teardown takes it
            try:
                recreated += await recreate(self._records, self._backend, experiment, slot.root)
            except ServiceError as exc:
                log.warning("experiment.recreate_failed", code=exc.code, reason=exc.message)
        return len(revival.started) + recreated

    async def retire_refused_creations(self) -> int:
        """Retire the creations that can never end: refused before they got a container,
        or still CREATING with their creating process dead or older than
        STALE_CREATION_S; how many."""
        retired = 0
        stale_before = self._clock() - STALE_CREATION_S
        live = await self.registry.live()
        left_behind = False
        folders: list[Path] = []
        for experiment in await self._records.refused_creations(stale_before, live):
            creating = experiment.state is State.CREATING
            with contextlib.suppress(InvalidTransition):  # another process was first
                await self._records.transition(
                    experiment.experiment_id,
                    State.DESTROYED,
                    CREATOR_STOPPED if creating else REFUSED_CREATION,
                    self._clock(),
                    **({"warnings": [CREATOR_STOPPED_WARNING]} if creating else {}),
                )
                retired += 1
                if creating:
                    left_behind = True
                    slot = await self.slot_of(experiment.sandbox_key)
                    if slot is not None:  # else its sandbox is being emptied, folder too
                        folders.append(ExperimentDirs.of(slot.root, experiment.experiment_id).root)
        if left_behind:
            await self._sweep_dead_processes()
        # After the sweep: the dead process's clone helper wrote into the folder until then.
        for folder in folders:
            await self._discard(folder)
        if retired:
            log.warning("experiments.creations_retired", experiments=retired)
        return retired

    async def _sweep_dead_processes(self) -> None:
        """Remove the containers of processes now dead that no live experiment holds: a
        killed process's clone helper, or the container it started for an experiment it
        never recorded, spared by the start-up sweep while its heartbeat was fresh."""
        holding = {e.container_id for e in await self._records.live() if e.container_id}
        try:
            await self._backend.sweep(holding, frozenset(await self.registry.live()))
        except ServiceError as exc:  # the engine away: the next start sweeps them
            log.warning("experiments.sweep_skipped", code=exc.code, reason=exc.message)

    async def answer_cancel_requests(self) -> None:
        """Kill this process's jobs that another process asked to cancel."""
        for job_id in await self._records.cancel_requests(self.registry.process_id):
            running = self._jobs.get(job_id)
            if running is not None:
                await self._kill(running)

    async def round(self) -> None:
        """One heartbeat: each step on its own, so one failing leaves the others."""
        steps = (
            self.registry.beat,
            self.answer_cancel_requests,
            self.take_over_dead,
            self.retire_refused_creations,
            self.check_mounts,  # before revive: it starts the containers it stopped
            self.revive_containers,
            self._refresh_busy,
        )
        for step in steps:
            try:
                await step()
            except Exception:  # the database or the engine away: next round
                self._failures.warning(
                    "recovery.step_failed", step.__name__, step=step.__name__, exc_info=True
                )

    async def _refresh_busy(self) -> None:
        self.busy = frozenset(await self._records.busy_sandboxes())

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="recovery")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.registry.beat_s)
            await self.round()

    async def stop(self) -> None:
        """At shutdown (after this process's jobs were stopped): report them lost, and
        leave the registry."""
        await cancel_and_wait(self._task)
        try:
            live = await self.registry.live() - {self.registry.process_id}
            lost = await self._records.mark_lost_jobs(self._clock(), live, DEAD_OWNER)
            for experiment_id in {job.experiment_id for job in lost}:
                await self._settle(experiment_id, "the server process running its command stopped")
            await self.registry.deregister()
        except Exception:  # the database away: the others take over once we are stale
            log.warning("recovery.stop_failed", exc_info=True)
