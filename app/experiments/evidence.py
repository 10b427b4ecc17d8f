"""The evidence an experiment leaves: test results, exit codes, change size, duration, artifacts.

Gathered live for a running experiment and recorded in its findings before
teardown, so that a destroyed experiment stays comparable.
"""

from __future__ import annotations

from app.experiments import changes
from app.experiments.compare import ExperimentEvidence
from app.experiments.records import Experiment
from app.experiments.workspace import ExperimentDirs
from app.storage.experiment_store import ExperimentRecords
from jail.context import InThread

# Test reports and dependency folders are not the agent's changes.
EXCLUDED_FROM_CHANGES = changes.DEFAULT_EXCLUDED | {".sandbox-reports"}


async def inspect(
    in_thread: InThread,
    dirs: ExperimentDirs,
    *,
    include_diff: bool,
    max_files_with_diff: int | None = None,
) -> changes.ChangeReport:
    """The workspace against its baseline (in a worker thread of the caller's share,
    ``in_thread``: it walks and reads files)."""
    return await in_thread(
        changes.inspect,
        dirs.workspace,
        dirs.baseline,
        include_diff=include_diff,
        max_files_with_diff=max_files_with_diff,
        excluded_dirs=EXCLUDED_FROM_CHANGES,
    )


async def gather(
    records: ExperimentRecords,
    experiment: Experiment,
    dirs: ExperimentDirs | None,
    in_thread: InThread,
) -> ExperimentEvidence:
    """The experiment's evidence: recorded findings if destroyed, else measured now."""
    if experiment.findings and "evidence" in experiment.findings:
        recorded = ExperimentEvidence(**experiment.findings["evidence"])
        return recorded.model_copy(update={"state": experiment.state.value})
    jobs = await records.jobs_of(experiment.experiment_id)
    tested = [j for j in jobs if j.test_summary]
    summary = (tested[-1].test_summary or {}) if tested else {}
    stored = await records.artifacts_of(experiment.sandbox_key, experiment.experiment_id)
    evidence = ExperimentEvidence(
        experiment_id=experiment.experiment_id,
        name=experiment.name,
        state=experiment.state.value,
        exit_codes=[j.exit_code for j in jobs],
        last_exit_code=jobs[-1].exit_code if jobs else None,
        duration_s=round(sum(j.duration_s or 0 for j in jobs), 3),
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
