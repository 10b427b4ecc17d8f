"""What the experiment tools return: the agent-facing shapes (each becomes an outputSchema)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from app.experiments.changes import FileChange
from app.experiments.records import Experiment, JobRecord
from app.experiments.result import Result


class JobView(Result):
    job_id: str
    experiment_id: str
    command: str
    status: str = Field(
        description=(
            "running, completed (exit 0), failed (non-zero exit), timeout, cancelled or lost"
        )
    )
    exit_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float | None = None
    reason: str | None = Field(default=None, description="Why it ended, when not by itself.")
    tests: dict[str, Any] | None = Field(
        default=None,
        description=(
            "For run_tests: passed, failed, skipped, errors, total, failing_tests. When "
            "`detected` is false the results could not be read: trust the exit code."
        ),
    )

    @classmethod
    def of(cls, row: JobRecord, *, with_output: bool = True) -> JobView:
        return cls(
            job_id=row.job_id,
            experiment_id=row.experiment_id,
            command=row.command,
            status=row.status,
            exit_code=row.exit_code,
            stdout=row.stdout if with_output else None,
            stderr=row.stderr if with_output else None,
            stdout_truncated=row.stdout_truncated,
            stderr_truncated=row.stderr_truncated,
            duration_s=row.duration_s,
            reason=row.reason,
            tests=row.test_summary,
        )


class ExperimentView(Result):
    experiment_id: str
    name: str
    goal: str
    state: str
    image: str
    source: str
    isolation: dict[str, Any] = Field(description="The isolation actually applied.")
    warnings: list[str] = Field(default_factory=list)
    created_at: float
    jobs: list[JobView] = Field(default_factory=list, description="Commands run, oldest first.")
    findings: dict[str, Any] | None = Field(
        default=None, description="Recorded when the experiment was destroyed."
    )

    @classmethod
    def of(cls, experiment: Experiment, jobs: list[JobRecord] | None = None) -> ExperimentView:
        return cls(
            experiment_id=experiment.experiment_id,
            name=experiment.name,
            goal=experiment.goal,
            state=experiment.state.value,
            image=experiment.image,
            source=experiment.source,
            isolation=experiment.isolation,
            warnings=experiment.warnings,
            created_at=experiment.created_at,
            jobs=[JobView.of(job, with_output=False) for job in jobs or []],
            findings=experiment.findings,
        )


class CreatedExperiment(ExperimentView):
    setup: list[JobView] = Field(
        default_factory=list, description="Setup commands in order; they stop at the first failure."
    )
    files_copied: int = 0
    secrets_skipped: int = Field(default=0, description="Secret-shaped files left out of the copy.")


class ExperimentList(Result):
    experiments: list[ExperimentView]


class DestroyReport(ExperimentView):
    already_destroyed: bool = False


class RuntimeView(Result):
    reachable: bool
    version: str | None
    reason: str | None = None  # why sandboxes cannot run now (e.g. seccomp inactive)
    images: list[str]
    missing_images: list[str]
    default_image: str
    network_default: str
    egress_allowed: bool
    max_experiments: int
    ceilings: dict[str, float]


class ChangesView(Result):
    """inspect_changes: what changed against the baseline taken before any command ran."""

    experiment_id: str
    created: list[FileChange]
    modified: list[FileChange]
    deleted: list[FileChange]
    insertions: int
    deletions: int
    files_changed: int
    diff: str | None = None
    diff_truncated: bool = False
