"""The evidence an experiment leaves: test results, exit codes, change size, duration, artifacts.

Gathered live for a running experiment and recorded in its findings before
teardown, so that a destroyed experiment stays comparable.
"""

from __future__ import annotations

from app.experiments.core.records import Experiment
from app.experiments.core.store import ExperimentStore
from app.experiments.evidence.compare import ExperimentEvidence
from app.experiments.workspace import changes
from app.experiments.workspace.dirs import ExperimentDirs
from jail.context import InThread

# Test reports and dependency folders are not the agent's changes.
EXCLUDED_FROM_CHANGES = changes.EXCLUDED


async def inspect(
    in_thread: InThread,
    dirs: ExperimentDirs,
    *,
    include_diff: bool,
    max_files_with_diff: int | None = None,
) -> changes.ChangeReport:
    """The workspace against its baseline (in a worker thread of the caller's share,
    ``in_thread``: it walks and reads files)."""
    return await in_thread(_inspect, dirs, include_diff, max_files_with_diff)


def _inspect(
    dirs: ExperimentDirs, include_diff: bool, max_files_with_diff: int | None
) -> changes.ChangeReport:
    # In the thread: which baseline there is (a pack, or an older experiment's folder)
    # is a look at the disk too.
    return changes.inspect(
        dirs.workspace,
        dirs.kept_baseline(),
        include_diff=include_diff,
        max_files_with_diff=max_files_with_diff,
        excluded_dirs=EXCLUDED_FROM_CHANGES,
    )


async def gather(
    records: ExperimentStore,
    experiment: Experiment,
    dirs: ExperimentDirs | None,
    in_thread: InThread,
    *,
    listed_jobs: int,
    listed_command_chars: int,
) -> ExperimentEvidence:
    """The experiment's evidence: recorded findings if destroyed, else measured now; the
    exit codes of its newest ``listed_jobs`` jobs, read with their commands cut to
    ``listed_command_chars`` (the caller's listing: an experiment's view lists the same)."""
    if experiment.findings and "evidence" in experiment.findings:
        recorded = ExperimentEvidence(**experiment.findings["evidence"])
        return recorded.model_copy(update={"state": experiment.state.value})
    # The newest jobs' exit codes and the sums of all: an experiment runs any number of
    # jobs, each command up to 100,000 characters (cut here by the database, as listed).
    page, total = await records.newest_jobs(
        experiment.experiment_id, listed_jobs, 0, listed_command_chars
    )
    tally = await records.tally(experiment.experiment_id)
    summary = tally.test_summary or {}
    stored = await records.artifacts_of(experiment.sandbox_key, experiment.experiment_id)
    evidence = ExperimentEvidence(
        experiment_id=experiment.experiment_id,
        name=experiment.name,
        state=experiment.state.value,
        exit_codes=[job.exit_code for job, _ in page],
        exit_codes_not_listed=total - len(page),
        jobs_total=total,
        jobs_failed=tally.failed,
        last_exit_code=page[-1][0].exit_code if page else None,
        duration_s=round(tally.duration_s, 3),
        artifacts=len(stored),
    )
    if summary.get("detected"):
        evidence.tests_passed = summary["passed"]
        evidence.tests_failed = summary["failed"] + summary["errors"]
        evidence.tests_skipped = summary["skipped"]
        evidence.tests_total = summary["total"]
        evidence.failing_tests = summary["failing_tests"][:50]
    if dirs is not None and dirs.workspace.exists():
        report = await inspect(in_thread, dirs, include_diff=False)
        evidence.files_changed = report.files_changed
        evidence.lines_changed = report.insertions + report.deletions
    return evidence
