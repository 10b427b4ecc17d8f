"""The experiment domain's records: plain, frozen data that the store reads and writes.

Nothing outside ``app/storage`` sees an ORM row; the store converts at its boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.experiments.core.states import State


@dataclass(frozen=True)
class Experiment:
    experiment_id: str
    sandbox_key: str
    name: str
    goal: str
    state: State
    image: str
    container_id: str | None
    isolation: dict[str, Any]
    warnings: list[str]
    source: str
    created_at: float
    updated_at: float
    findings: dict[str, Any] | None
    # What its preparation put in its workspace and left out (secret-shaped files),
    # once prepared: kept, so an agent whose create went on in the background reads them.
    files_copied: int | None = None
    secrets_skipped: int | None = None
    # The server process that created it: one still CREATING whose process died (its
    # heartbeat stale) is retired by recovery (app/experiments/recovery/recovery.py).
    creator_process: str | None = None


@dataclass(frozen=True)
class JobTally:
    """What every job of an experiment adds up to, read as sums in the database (the
    evidence and the findings; the jobs themselves are listed only the newest few)."""

    jobs: int = 0
    failed: int = 0  # jobs whose status is not "completed"
    duration_s: float = 0.0
    test_summary: dict[str, Any] | None = None  # the newest run_tests job's


@dataclass(frozen=True)
class JobSummary:
    """One command run in an experiment (a job), as recorded, without its output.

    What listings show (an experiment's jobs, their statuses and exit codes, a job's
    status): read without the stdout and stderr columns, up to 2 MB a job."""

    job_id: str
    experiment_id: str
    sandbox_key: str
    kind: str
    command: str
    status: str
    background: bool
    timeout_s: float
    started_at: float
    exit_code: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    finished_at: float | None = None
    duration_s: float | None = None
    reason: str | None = None
    test_summary: dict[str, Any] | None = None  # for run_tests jobs
    owner_process: str | None = None  # the server process that runs it
    # Its output went past the sandbox's daily storage budget: only its tails are kept
    # (app/experiments/output_budget.py).
    output_not_kept: bool = False


@dataclass(frozen=True)
class JobRecord(JobSummary):
    """A job as recorded, its output included (a job's result, its logs)."""

    stdout: str | None = None
    stderr: str | None = None


@dataclass(frozen=True)
class OutputEnds:
    """One recorded output stream as the database cut it: the whole of it when it holds
    at most the head and tail asked for (``tail`` then empty), else its first and last
    characters; and its whole length in characters."""

    head: str
    tail: str
    length: int

    @classmethod
    def of(cls, text: str, head: int, tail: int) -> OutputEnds:
        """The same, cut here (what the database does, for a stream it cannot cut)."""
        if len(text) <= head + tail:
            return cls(text, "", len(text))
        return cls(text[:head], text[len(text) - tail :], len(text))


@dataclass(frozen=True)
class JobEnds:
    """A job as the logs resource shows it: its command cut (and its whole length), how
    it ended, and the ends of its output, never the whole of it (up to 2 MB a job)."""

    job_id: str
    command: str
    command_length: int
    status: str
    exit_code: int | None
    stdout: OutputEnds
    stderr: OutputEnds


@dataclass(frozen=True)
class JobControl:
    """What another process needs to wait for or cancel a job."""

    owner_process: str | None
    pids: tuple[int, int] | None  # its process tree's root and supervisor, once announced
    cancel_requested: bool


@dataclass(frozen=True)
class LostJob:
    """A running job whose process died, as recovery marked it lost."""

    job_id: str
    experiment_id: str
    container_id: str | None
    pids: tuple[int, int] | None


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended: everything ``finish_job`` records."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    finished_at: float
    duration_s: float
    reason: str | None
    test_summary: dict[str, Any] | None

    @classmethod
    def without_output(
        cls, status: str, *, finished_at: float, duration_s: float, reason: str
    ) -> JobOutcome:
        """A job that ended with no output of its own to keep: never started, or lost."""
        return cls(
            status=status,
            exit_code=None,
            stdout="",
            stderr="",
            stdout_truncated=False,
            stderr_truncated=False,
            finished_at=finished_at,
            duration_s=duration_s,
            reason=reason,
            test_summary=None,
        )


@dataclass(frozen=True)
class ArtifactRecord:
    """A file copied out of a workspace, kept on the shelf."""

    artifact_id: str
    experiment_id: str
    sandbox_key: str
    path: str
    size: int
    sha256: str
    stored_as: str
    created_at: float
    # Set when the sandbox is emptied: the artifact outlives it by ARTIFACT_TTL_S.
    expires_at: float | None = None


@dataclass(frozen=True)
class DiskHoldings:
    """What a sandbox's disk budget counts besides its slot's tree: the containers of
    its live experiments (their processes may hold deleted files open) and what its
    artifacts on the shelf weigh."""

    containers: tuple[str, ...]
    artifact_bytes: int


@dataclass(frozen=True)
class Move:
    """A move of an experiment written together with a job's record: a command's start
    and end each wait on their writes, and SQLite writes one at a time."""

    experiment_id: str
    target: State
    reason: str
