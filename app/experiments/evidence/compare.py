"""Comparing experiments, and recommending one when the evidence supports it.

The order of evidence: fewest failing tests, then a clean exit of the last
command, then the smallest change, then the fastest. An experiment with no
test results is compared only if none has any.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.experiments.core.result import Result


class ExperimentEvidence(BaseModel):
    experiment_id: str
    name: str
    label: str | None = Field(
        default=None, description="The caller's label for it (compare_experiments `labels`)."
    )
    state: str
    tests_passed: int | None = None
    tests_failed: int | None = Field(default=None, description="Failed plus errored tests.")
    tests_skipped: int | None = None
    tests_total: int | None = None
    failing_tests: list[str] = Field(default_factory=list)
    last_exit_code: int | None = None
    exit_codes: list[int | None] = Field(
        default_factory=list,
        description="The newest jobs' exit codes, oldest first (get_experiment lists them).",
    )
    exit_codes_not_listed: int = Field(
        default=0, description="Older jobs whose exit codes are not listed."
    )
    jobs_total: int = Field(default=0, description="How many jobs the experiment ran in all.")
    jobs_failed: int = Field(default=0, description="Jobs that did not complete.")
    files_changed: int | None = None
    lines_changed: int | None = Field(default=None, description="Insertions plus deletions.")
    duration_s: float = 0.0
    artifacts: int = 0


class Comparison(Result):
    experiments: list[ExperimentEvidence]
    recommended: str | None = Field(default=None, description="The experiment id to prefer.")
    reason: str


def _shown(e: ExperimentEvidence) -> str:
    return e.label or e.name


def _key(e: ExperimentEvidence) -> tuple[float, int, float, float]:
    failed = e.tests_failed if e.tests_failed is not None else float("inf")
    clean = 0 if e.last_exit_code == 0 else 1
    change = e.lines_changed if e.lines_changed is not None else float("inf")
    return (failed, clean, change, e.duration_s)


def recommend(evidence: list[ExperimentEvidence]) -> tuple[str | None, str]:
    if len(evidence) < 2:
        return None, "Compare at least two experiments."
    tested = [e for e in evidence if e.tests_total]
    pool = tested or [e for e in evidence if e.last_exit_code is not None]
    if not pool:
        return None, "No experiment has run tests or commands yet, so there is nothing to go on."
    ranked = sorted(pool, key=_key)
    best, runner_up = ranked[0], (ranked[1] if len(ranked) > 1 else None)
    if runner_up is not None and _key(best) == _key(runner_up):
        return (
            None,
            "The leading experiments tie on every measure; run more tests to separate them.",
        )
    if runner_up is None:
        return (
            best.experiment_id,
            f"{_shown(best)} is the only one with {'test results' if tested else 'results'}.",
        )
    first, second = _key(best), _key(runner_up)
    if tested and first[0] != second[0]:
        why = (
            f"fewest failing tests ({best.tests_failed} of {best.tests_total}, against "
            f"{runner_up.tests_failed} for {_shown(runner_up)})"
        )
    elif first[1] != second[1]:
        why = "same test results, and its last command exited cleanly"
    elif first[2] != second[2]:
        why = f"same tests and exit, and the smallest change ({best.lines_changed} lines)"
    else:
        why = f"same tests, exit and change size, and the fastest ({best.duration_s:.1f} s)"
    return best.experiment_id, f"{_shown(best)}: {why}."
