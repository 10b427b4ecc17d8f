"""What the experiment tools return: the agent-facing shapes (each becomes an outputSchema)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from app.experiments.core.records import Experiment, JobRecord, JobSummary, OutputEnds
from app.experiments.core.result import Result
from app.experiments.options import ExperimentOptions
from app.experiments.output_budget import not_kept_note
from app.experiments.workspace.changes import ChangeReport
from app.runtime.backend import RuntimeInfo

# A result must fit the clients' windows with room to spare (Claude Code caps a tool
# result at 25,000 tokens by default, claude.ai's connectors at about 150,000
# characters), so a long output is shown as an excerpt: its start and, larger, its
# end, where a failure says why. The whole recorded output is read in pages.
EXCERPT_HEAD_CHARS = 2_000
EXCERPT_TAIL_CHARS = 8_000
MAX_PAGE_CHARS = 20_000  # serialized: within the result budget of app/mcp/fit.py
# An experiment runs any number of jobs over its life, each command up to 100,000
# characters: its view lists the newest few, each command cut, and counts the rest.
# Ten jobs of 1,000 characters fit the result budget with the experiment's fields.
MAX_LISTED_JOBS = 10
MAX_LISTED_COMMAND_CHARS = 1_000
Stream = Literal["stdout", "stderr"]


def excerpt(text: str) -> tuple[str, int]:
    """``text`` if it is short; else its head and tail around a marker, and how many
    characters were left out."""
    return excerpt_of(OutputEnds.of(text, EXCERPT_HEAD_CHARS, EXCERPT_TAIL_CHARS))


def excerpt_of(ends: OutputEnds) -> tuple[str, int]:
    """``excerpt`` of a stream from its ends (``OutputEnds`` of ``EXCERPT_HEAD_CHARS``
    and ``EXCERPT_TAIL_CHARS``), as the database cuts them."""
    if ends.length <= EXCERPT_HEAD_CHARS + EXCERPT_TAIL_CHARS:
        return ends.head, 0
    left_out = ends.length - EXCERPT_HEAD_CHARS - EXCERPT_TAIL_CHARS
    marker = f"\n[... {left_out} characters left out of this excerpt ...]\n"
    return ends.head + marker + ends.tail, left_out


class OutputPage(Result):
    """One page of a recorded output stream (``get_job_result`` with ``offset``)."""

    stream: Stream
    offset: int = Field(description="Where this page starts, in characters.")
    text: str
    end: int = Field(description="Where this page ends; pass it as the next offset.")
    total_chars: int = Field(description="Length of the whole recorded stream.")
    more: bool = Field(description="Whether the stream goes on after this page.")


class JobView(Result):
    job_id: str
    experiment_id: str
    command: str
    command_left_out: int = Field(
        default=0,
        description="Characters of the command not shown in this listing (get_job_status "
        "shows more of it).",
    )
    status: str = Field(
        description=(
            "running, completed (exit 0), failed (non-zero exit), timeout, cancelled or lost"
        )
    )
    exit_code: int | None = None
    stdout: str | None = Field(
        default=None, description="The output, or an excerpt of it (head and tail) if long."
    )
    stderr: str | None = Field(
        default=None, description="The error output, or an excerpt of it if long."
    )
    stdout_truncated: bool = Field(
        default=False, description="The command printed more than the server keeps (1 MB)."
    )
    stderr_truncated: bool = False
    stdout_chars: int | None = Field(
        default=None, description="Length of the whole recorded stdout, in characters."
    )
    stderr_chars: int | None = None
    stdout_left_out: int = Field(
        default=0, description="Characters of stdout not in this result (read them in pages)."
    )
    stderr_left_out: int = 0
    duration_s: float | None = None
    reason: str | None = Field(default=None, description="Why it ended, when not by itself.")
    tests: dict[str, Any] | None = Field(
        default=None,
        description=(
            "For run_tests: passed, failed, skipped, errors, total, failing_tests. When "
            "`detected` is false the results could not be read: trust the exit code."
        ),
    )
    page: OutputPage | None = Field(
        default=None, description="The page asked for with `offset`, if any."
    )
    # Seed 001's names for the same facts, so a client written for it reads them unchanged.
    test_summary: dict[str, Any] | None = Field(
        default=None, description="The same as `tests`, plus `framework` (= `runner`)."
    )
    duration_ms: int | None = Field(default=None, description="duration_s in milliseconds.")
    finished: bool = Field(default=False, description="Whether the job has ended.")
    output_not_kept: bool = Field(
        default=False,
        description=(
            "The job's output went past the sandbox's daily storage budget: its record "
            "keeps only the last 4,096 characters of each stream."
        ),
    )

    @classmethod
    def summary(cls, row: JobSummary) -> JobView:
        """The job without its output (a listing, a status)."""
        return cls(
            job_id=row.job_id,
            experiment_id=row.experiment_id,
            command=row.command,
            status=row.status,
            exit_code=row.exit_code,
            stdout_truncated=row.stdout_truncated,
            stderr_truncated=row.stderr_truncated,
            duration_s=row.duration_s,
            reason=row.reason,
            tests=row.test_summary,
            test_summary=_seed_summary(row.test_summary),
            duration_ms=None if row.duration_s is None else round(row.duration_s * 1000),
            finished=row.status != "running",
            output_not_kept=row.output_not_kept,
        )

    @classmethod
    def of(cls, row: JobRecord) -> JobView:
        """The job with excerpts of its output (a job's result)."""
        view = cls.summary(row)
        view.stdout, view.stdout_left_out = excerpt(row.stdout or "")
        view.stderr, view.stderr_left_out = excerpt(row.stderr or "")
        view.stdout_chars, view.stderr_chars = len(row.stdout or ""), len(row.stderr or "")
        long = [name for name in ("stdout", "stderr") if getattr(view, f"{name}_left_out")]
        if row.output_not_kept:  # no pages to read: say why instead
            view.notes.append(not_kept_note(row.job_id))
        elif long:
            view.notes.append(
                f"The {' and '.join(long)} {'is' if len(long) == 1 else 'are'} long: this "
                f"result shows the first {EXCERPT_HEAD_CHARS:,} and the last "
                f"{EXCERPT_TAIL_CHARS:,} characters. Read the rest in pages with "
                f"get_job_result(job_id={row.job_id!r}, offset=N, stream='stdout')."
            )
        return view

    @classmethod
    def paged(cls, row: JobRecord, stream: Stream, offset: int, max_chars: int) -> JobView:
        """The job without its excerpts, and one page of ``stream`` from ``offset``."""
        view = cls.summary(row)
        text = (row.stdout if stream == "stdout" else row.stderr) or ""
        start = min(offset, len(text))
        end = min(len(text), start + min(max_chars, MAX_PAGE_CHARS))
        # Escapes (control characters, quotes) can make a page longer on the wire than
        # in characters: shorten it until it fits, so it is never cut on the way out.
        while end > start + 1 and len(json.dumps(text[start:end])) > MAX_PAGE_CHARS:
            end = start + (end - start) // 2
        view.page = OutputPage(
            stream=stream,
            offset=start,
            text=text[start:end],
            end=end,
            total_chars=len(text),
            more=end < len(text),
        )
        if row.output_not_kept:
            view.notes.append(not_kept_note(row.job_id))
        return view

    def as_text(self) -> str:
        """For the model to read: one line of what happened, then the output as it was."""
        how = f"exit {self.exit_code}" if self.exit_code is not None else self.status
        took = f" in {self.duration_s:g} s" if self.duration_s is not None else ""
        parts = [f"Job {self.job_id} {self.status} ({how}){took}: {self.command[:200]}"]
        if self.reason:
            parts.append(self.reason)
        if self.tests is not None and self.tests.get("detected"):
            parts.append(
                "Tests: {passed} passed, {failed} failed, {skipped} skipped.".format(
                    **{k: self.tests.get(k, 0) for k in ("passed", "failed", "skipped")}
                )
            )
        if self.page is not None:
            page = self.page
            parts.append(
                f"--- {page.stream} [{page.offset}:{page.end} of {page.total_chars}] ---\n"
                + page.text
            )
        for name in ("stdout", "stderr"):
            value = getattr(self, name)
            if value:
                parts.append(f"--- {name} ---\n{value}")
        return "\n".join(parts)


def _seed_summary(tests: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if tests is None else {**tests, "framework": tests.get("runner")}


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
    jobs: list[JobView] = Field(
        default_factory=list,
        description=f"Commands run, oldest first: the newest {MAX_LISTED_JOBS} (page back "
        "with jobs_skip).",
    )
    jobs_total: int = Field(default=0, description="How many jobs the experiment ran in all.")
    jobs_not_listed: int = Field(
        default=0, description="Jobs older than the ones listed (read them with jobs_skip)."
    )
    findings: dict[str, Any] | None = Field(
        default=None, description="Recorded when the experiment was destroyed."
    )
    files_copied: int | None = Field(
        default=None,
        description="Files its creation put in the workspace; null until it is prepared.",
    )
    secrets_skipped: int | None = Field(
        default=None,
        description="Secret-shaped files left out of the copy; null until it is prepared.",
    )
    # Seed 001's names for the same facts.
    objective: str = Field(default="", description="The same as `goal`.")
    base_image: str = Field(default="", description="The same as `image`.")
    status: str = Field(default="", description="The same as `state`.")
    network_mode: str = Field(
        default="none", description="none, enabled (network egress) or restricted."
    )

    @classmethod
    def of(cls, experiment: Experiment, jobs: Sequence[JobSummary] | None = None) -> ExperimentView:
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
            jobs=[JobView.summary(job) for job in jobs or []],
            findings=experiment.findings,
            files_copied=experiment.files_copied,
            secrets_skipped=experiment.secrets_skipped,
            objective=experiment.goal,
            base_image=experiment.image,
            status=experiment.state.value,
            network_mode=_SEED_NETWORK.get(str(experiment.isolation.get("network")), "none"),
        )

    @classmethod
    def listing(
        cls, experiment: Experiment, page: Sequence[tuple[JobSummary, int]], total: int, skip: int
    ) -> ExperimentView:
        """The experiment with one page of its jobs (``newest_jobs``): each command as the
        database cut it, and a note on the jobs not listed."""
        view = cls.of(experiment, [job for job, _ in page])
        for job, (_, length) in zip(view.jobs, page, strict=True):
            job.command_left_out = length - len(job.command)
        view.jobs_total = total
        view.jobs_not_listed = max(total - skip - len(page), 0)
        if view.jobs_not_listed > 0 or skip:
            skipped = f" skipping the {min(skip, total)} newest," if skip else ""
            view.notes.append(
                f"This experiment ran {total} jobs; listed: {len(page)},{skipped} and "
                f"{view.jobs_not_listed} older ones are not. Page back with "
                f"get_experiment(jobs_skip={skip + len(page)}); get_job_status shows a job "
                "and more of its command."
            )
        if any(job.command_left_out for job in view.jobs):
            view.notes.append(
                f"Commands longer than {MAX_LISTED_COMMAND_CHARS:,} characters are cut here "
                "(command_left_out says by how much); get_job_status shows more of one."
            )
        return view


_SEED_NETWORK = {"egress": "enabled", "restricted": "restricted"}


class CreatedExperiment(ExperimentView):
    setup: list[JobView] = Field(
        default_factory=list, description="Setup commands in order; they stop at the first failure."
    )


class ExperimentList(Result):
    experiments: list[ExperimentView] = Field(description="Newest first.")
    total: int = Field(default=0, description="How many matched, shown or not.")


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
    network_modes: list[str] = Field(description="The network modes this server offers.")
    egress_allowlist: list[str] = Field(
        default_factory=list,
        description="Network restricted: the names an experiment may reach (at most).",
    )
    egress_max_bytes: int | None = Field(
        default=None, description="Network restricted: bytes one experiment may move."
    )
    max_experiments: int
    max_jobs_per_sandbox: int
    max_jobs_per_experiment: int
    ceilings: dict[str, float]

    @classmethod
    def of(cls, info: RuntimeInfo, options: ExperimentOptions) -> RuntimeView:
        """check_sandbox_runtime: what the backend reports, with the server's policy."""
        return cls(
            reachable=info.reachable,
            version=info.version,
            reason=info.reason,
            images=list(info.images),
            missing_images=list(info.missing_images),
            default_image=options.default_image,
            network_default="none",
            egress_allowed=options.egress_allowed,
            network_modes=[
                "none",
                *(["restricted"] if options.restricted_allowed else []),
                *(["egress"] if options.egress_allowed else []),
            ],
            egress_allowlist=list(options.egress_allowlist),
            egress_max_bytes=options.egress_max_bytes if options.restricted_allowed else None,
            max_experiments=options.max_experiments,
            max_jobs_per_sandbox=options.max_jobs_per_sandbox,
            max_jobs_per_experiment=options.max_jobs_per_experiment,
            ceilings=dict(options.ceilings),
        )


class _OfExperiment(Result):
    experiment_id: str


# The report's own fields, declared once (ChangeReport); pydantic puts the fields of the
# later base first, so the id still comes first in the result, as the agent reads it.
class ChangesView(ChangeReport, _OfExperiment):
    """inspect_changes: what changed against the baseline taken before any command ran."""

    # Seed 001's names: the paths alone.
    files_created: list[str] = Field(default_factory=list)
    files_modified: list[str] = Field(default_factory=list)
    files_deleted: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, experiment_id: str, report: ChangeReport) -> ChangesView:
        return cls(
            experiment_id=experiment_id,
            **report.model_dump(),
            files_created=[c.path for c in report.created],
            files_modified=[c.path for c in report.modified],
            files_deleted=[c.path for c in report.deleted],
        )
