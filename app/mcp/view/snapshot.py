"""What the view's app-only tools return: small records, each bounded twice.

A host hands a tool result to its view whole, and claude.ai swaps a payload past about
150,000 characters for a file pointer the view cannot parse. The figures below keep a
record small by construction; ``bounded`` is the net under them, in bytes as the record
goes out (the SDK escapes every non-ASCII character as ``\\uXXXX``: six bytes for an
``é``, twelve for an emoji), so that the structured content and its text copy together
stay under ``MAX_VIEW_PAYLOAD_BYTES`` whatever the output held. The protocol tests
measure both on the wire.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, Field

from app.experiments.core.records import JobRecord
from app.experiments.views import ExperimentView, JobView
from app.experiments.workspace.diff import shown_path
from app.mcp.envelope import ToolOutput
from app.mcp.fit import fit

# The bound the tests hold every payload the view receives to (claude.ai: about 150k
# characters before it swaps the payload for a file pointer).
MAX_VIEW_PAYLOAD_BYTES = 130_000
# A record's structured content, as sent: its text copy costs at most twice as much on
# the wire (each quote and backslash escaped once more), so the whole result stays
# under 3 x 40,000 bytes plus the envelope.
MAX_RECORD_WIRE_BYTES = 40_000

MAX_EXPERIMENTS = 12  # newest first; the rest counted
JOBS_PER_EXPERIMENT = 3  # in the overview; an experiment's detail lists MAX_LISTED_JOBS
COMMAND_CHARS = 200
FAILING_NAMES = 5
FAILING_NAME_CHARS = 120
TAIL_JOBS = 5  # an experiment's detail: the newest jobs with the end of their output
TAIL_CHARS = 1_500
DIFF_CHARS = 16_000  # one file's diff as the view shows it (its head; the rest counted)


class ViewTests(BaseModel):
    detected: bool = False
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    total: int = 0
    failing: list[str] = Field(default_factory=list, description="The first failing names.")


class ViewJob(BaseModel):
    job_id: str
    command: str
    status: str
    exit_code: int | None = None
    duration_s: float | None = None
    tests: ViewTests | None = None
    output_tail: str | None = Field(default=None, description="The end of stdout and stderr.")


class ViewExperiment(BaseModel):
    experiment_id: str
    name: str
    state: str
    image: str
    network: str
    created_at: float
    jobs: list[ViewJob] = Field(default_factory=list, description="Newest last.")
    jobs_total: int = 0


class SandboxOverview(ToolOutput):
    """``view_sandbox``: the sandbox at a glance."""

    sandbox: str
    holds_slot: bool
    queue_position: int | None = None
    estimated_wait_s: int | None = None
    idle_timeout_s: int
    experiments: list[ViewExperiment]
    experiments_total: int


class ExperimentDetail(ToolOutput):
    """``view_experiment``: one experiment, its newest jobs with the end of their output."""

    experiment: ViewExperiment


class FileDiff(ToolOutput):
    """``view_file_diff``: one file's unified diff against the baseline."""

    experiment_id: str
    path: str
    diff: str
    chars_left_out: int = 0
    found: bool = True


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def test_summary(tests: dict[str, Any] | None) -> ViewTests | None:
    if not tests:
        return None
    failing = tests.get("failing_tests") or []
    return ViewTests(
        detected=bool(tests.get("detected")),
        passed=int(tests.get("passed") or 0),
        failed=int(tests.get("failed") or 0),
        skipped=int(tests.get("skipped") or 0),
        total=int(tests.get("total") or 0),
        failing=[_cut(str(name), FAILING_NAME_CHARS) for name in failing[:FAILING_NAMES]],
    )


def tail(record: JobRecord) -> str:
    """The last ``TAIL_CHARS`` of what the job printed (stdout, then stderr)."""
    out = (record.stdout or "")[-TAIL_CHARS:]
    err = (record.stderr or "")[-TAIL_CHARS:]
    joined = out + ("\n" if out and err and not out.endswith("\n") else "") + err
    return joined[-TAIL_CHARS:]


def view_job(job: JobView) -> ViewJob:
    return ViewJob(
        job_id=job.job_id,
        command=_cut(job.command, COMMAND_CHARS),
        status=job.status,
        exit_code=job.exit_code,
        duration_s=job.duration_s,
        tests=test_summary(job.tests),
    )


def view_experiment(experiment: ExperimentView, jobs: int) -> ViewExperiment:
    return ViewExperiment(
        experiment_id=experiment.experiment_id,
        name=_cut(experiment.name, COMMAND_CHARS),
        state=experiment.state,
        image=_cut(experiment.image, COMMAND_CHARS),
        network=str(experiment.isolation.get("network", "none")),
        created_at=experiment.created_at,
        jobs=[view_job(job) for job in experiment.jobs[-jobs:]] if jobs else [],
        jobs_total=experiment.jobs_total or len(experiment.jobs),
    )


def file_section(diff: str, path: str) -> str | None:
    """One file's part of a unified diff as ``inspect_changes`` writes it (``--- a/x`` /
    ``+++ b/x`` headers, ``/dev/null`` for a created or deleted file), or None (a binary
    or large file has no hunks; a file past the report's limits has no part)."""
    lines = diff.splitlines(keepends=True)
    start = None
    for i, line in enumerate(lines):
        header = line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        if start is None:
            if header and _names(line, lines[i + 1], path):
                start = i
        elif header or line.startswith("[... "):
            return "".join(lines[start:i])
    return None if start is None else "".join(lines[start:])


def _names(old: str, new: str, path: str) -> bool:
    a, b = old[4:].rstrip("\n"), new[4:].rstrip("\n")
    return a == shown_path(f"a/{path}") or b == shown_path(f"b/{path}")


R = TypeVar("R", bound=ToolOutput)


def wire_bytes(value: Any) -> int:
    """The size of ``value`` as JSON with every non-ASCII character escaped."""
    return len(json.dumps(value, separators=(",", ":")))


def bounded(record: R, limit: int = MAX_RECORD_WIRE_BYTES) -> R:
    """``record``, cut by the result net (``app/mcp/fit.py``: the largest list halved, the
    largest string keeping its head and tail) until its JSON is under ``limit`` bytes
    as sent; a note says what was cut."""
    data = record.model_dump(mode="json")
    size = wire_bytes(data)
    if size <= limit:
        return record
    notes: dict[str, None] = {}
    for _ in range(16):  # each pass shrinks by a fixed share: a bound, not luck
        # fit's budget is in UTF-8 bytes; this limit is with every non-ASCII escaped.
        utf8 = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
        for note in fit(data, budget=max(1_000, int(utf8 * limit / size * 0.9))):
            notes[note] = None
        size = wire_bytes(data)
        if size <= limit:
            break
    data["notes"] = [*data.get("notes", []), *notes]
    return type(record).model_validate(data)


def head_within(text: str, limit: int = MAX_RECORD_WIRE_BYTES - 2_000) -> str:
    """The longest head of ``text`` (to a shrinking factor) under ``limit`` bytes as sent."""
    for _ in range(32):
        size = wire_bytes(text)
        if size <= limit:
            break
        text = text[: int(len(text) * limit / size * 0.95)]
    return text
