"""The ExperimentStore seam: what the experiment domain needs from its records' storage.

The domain reads and writes plain records (:mod:`app.experiments.core.records`) through this
Protocol; its SQL implementation is ``app.storage.experiment_store.SqlExperimentStore``,
built by the composition root (``app/root``) and handed in. Every query is scoped to
a sandbox key where the caller has one: another key's id reads like one that never
existed.
"""

from __future__ import annotations

from typing import Any, Protocol

from app.experiments.core.records import (
    ArtifactRecord,
    DiskHoldings,
    Experiment,
    JobControl,
    JobEnds,
    JobOutcome,
    JobRecord,
    JobSummary,
    JobTally,
    LostJob,
    Move,
)
from app.experiments.core.states import State


class ExperimentStore(Protocol):
    """Experiments, their transitions, jobs and artifacts, and the jobs' cancel flags."""

    # Experiments and their state transitions.
    async def add(self, experiment: Experiment, reason: str) -> None: ...
    async def load(self, sandbox_key: str, experiment_id: str) -> Experiment | None: ...
    async def get(self, sandbox_key: str, experiment_id: str) -> Experiment:
        """The sandbox's experiment ``experiment_id``: the one ownership check.

        Raises:
            ExperimentNotFound: there is none in this sandbox.
        """
        ...

    async def of_sandbox(
        self, sandbox_key: str, *, include_destroyed: bool = True
    ) -> list[Experiment]: ...
    async def live(self) -> list[Experiment]:
        """Every experiment not yet destroyed, across all sandboxes (start-up sweep)."""
        ...

    async def transition(
        self, experiment_id: str, target: State, reason: str, at: float, **changes: Any
    ) -> State:
        """Move an experiment to ``target`` if the machine allows it; returns the old state."""
        ...

    async def complete_findings(self, experiment_id: str, findings: dict[str, Any]) -> bool:
        """Replace a destroyed experiment's findings; whether it was there."""
        ...

    async def replace_container(
        self, experiment_id: str, old: str, new: str, warnings: list[str]
    ) -> bool:
        """Point a live experiment at a new container, if it still has ``old``."""
        ...

    async def refused_creations(
        self, stale_before: float, live_processes: set[str]
    ) -> list[Experiment]:
        """Experiments whose creation failed before they got a container, or still
        CREATING with their creating process not in ``live_processes`` or since before
        ``stale_before``: their server process stopped mid-way."""
        ...

    # Jobs.
    async def add_job(self, job: JobRecord, *, then: Move | None = None) -> None:
        """Record ``job``; with ``then``, move its experiment in the same write.

        Raises:
            InvalidTransition: the machine forbids ``then``; nothing is written.
        """
        ...

    async def finish_job(
        self, job_id: str, outcome: JobOutcome, *, then: Move | None = None
    ) -> None:
        """Record how the job ended; with ``then``, move its experiment in the same write
        if the machine allows it."""
        ...

    async def finish_job_within(
        self,
        job_id: str,
        outcome: JobOutcome,
        *,
        sandbox_key: str,
        command: str,
        day_budget: int,
        then: Move | None = None,
    ) -> bool:
        """``finish_job``, charging the job's command and output to its sandbox's stored
        bytes of the day: whole if they fit in ``day_budget``, else cut and the cut
        charged; True if kept whole."""
        ...

    async def stored_output_of_day(self, sandbox_key: str, day: int) -> int:
        """The job bytes charged to ``sandbox_key`` on ``day`` (days since 1970, UTC)."""
        ...

    async def load_job(self, sandbox_key: str, job_id: str) -> JobRecord | None: ...
    async def load_job_summary(self, sandbox_key: str, job_id: str) -> JobSummary | None:
        """The job without its output (its status, exit code, test summary)."""
        ...

    async def jobs_of(self, experiment_id: str) -> list[JobSummary]:
        """The experiment's jobs in the order they started, without their output."""
        ...

    async def load_job_ends(
        self, sandbox_key: str, job_id: str, *, head: int, tail: int, command_chars: int
    ) -> JobEnds | None:
        """The job with its command cut to ``command_chars`` and only the ends of each
        output stream (``head`` and ``tail`` characters), cut by the database."""
        ...

    async def newest_jobs(
        self, experiment_id: str, count: int, skip: int, command_chars: int
    ) -> tuple[list[tuple[JobSummary, int]], int]:
        """``count`` of the experiment's jobs, oldest first, after skipping the ``skip``
        newest, each command cut to ``command_chars`` with its whole length; and how many
        jobs the experiment has in all."""
        ...

    async def tally(self, experiment_id: str) -> JobTally:
        """The experiment's jobs added up, and its newest test summary."""
        ...

    async def mark_lost_jobs(
        self, at: float, live_processes: set[str], reason: str
    ) -> list[LostJob]:
        """Running jobs whose process is not in ``live_processes`` (or that have no owner)
        can never report: record them lost with ``reason``; the jobs so marked."""
        ...

    async def record_job_pids(self, job_id: str, pids: tuple[int, int]) -> None: ...
    async def job_control(self, job_id: str) -> JobControl | None:
        """Who runs the job, its process tree's pids and whether a cancel was asked for."""
        ...

    async def running_jobs(self, experiment_id: str) -> list[JobRecord]:
        """The experiment's jobs recorded as running, whichever process runs them."""
        ...

    async def busy_sandboxes(self) -> set[str]:
        """Sandbox keys with a job recorded as running (in any process)."""
        ...

    # Cancel requests across processes.
    async def request_cancel(self, row_id: str) -> None:
        """Ask the process running ``row_id`` to cancel it (it sees the flag on its next poll)."""
        ...

    async def cancel_requests(self, owner_process: str) -> list[str]:
        """Running rows of ``owner_process`` that another process asked to cancel."""
        ...

    # Artifacts.
    async def add_artifacts(self, artifacts: list[ArtifactRecord]) -> None: ...
    async def artifact_bytes_of(self, sandbox_key: str) -> int:
        """What the sandbox's artifacts on the shelf weigh, in bytes."""
        ...

    async def disk_holdings(self, sandbox_key: str) -> DiskHoldings:
        """The containers of the sandbox's live experiments and its artifacts' bytes."""
        ...

    async def artifacts_of(self, sandbox_key: str, experiment_id: str) -> list[ArtifactRecord]: ...
    async def start_artifact_clock(self, sandbox_key: str, expires_at: float) -> None: ...
    async def expired_artifacts(self, now: float) -> list[ArtifactRecord]: ...
    async def delete_artifacts(self, artifact_ids: list[str]) -> None: ...
