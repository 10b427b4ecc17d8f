"""What a job keeps of its output once its sandbox has stored its day's worth.

A job's command and output are stored with it in the database every tenant shares,
and kept as long as its experiment lives (then ``RECORD_RETENTION_DAYS``): one
sandbox running ``head -c 1M`` in a loop would fill that disk. So each sandbox has
a budget of stored job bytes a UTC day (``JOB_OUTPUT_BYTES_PER_SANDBOX_PER_DAY``),
counted in the database for every server process (``job_output_days``). A job that
fits is kept whole; past the budget the job still runs and its result is still
returned whole to the call that waits for it, but what is stored is cut to the
last ``TAIL_CHARS`` of each stream (where a failure says why) and the command's
first ``COMMAND_KEPT_CHARS`` (what listings show anyway), and the record says so.

The cut records are counted too, and each job also costs its row (``JOB_ROW_BYTES``):
a sandbox that goes on running jobs past the budget (16 a second were measured, each
up to 10 KB cut) still adds rows. So at ``CEILING`` times the budget no new job starts
in that sandbox until the UTC day ends (``LIMIT_REACHED``): the bytes one sandbox adds
in a day are at most the ceiling plus the jobs it had in flight, however it spends them.

Why a daily budget and not "the newest N jobs of an experiment": an honest agent
never loses output it may page back to (256 MiB a day is hundreds of full-size
jobs), and the budget holds however many experiments the sandbox makes and
destroys, which a per-experiment count would not.
"""

from __future__ import annotations

import dataclasses

from app.errors import LimitReached
from app.experiments.core.records import JobOutcome

TAIL_CHARS = 4_096  # per stream, past the budget
COMMAND_KEPT_CHARS = 1_000  # views list commands cut to this (MAX_LISTED_COMMAND_CHARS)
JOB_ROW_BYTES = 512  # a job row's own columns and index entries, charged with its texts
CEILING = 2  # times the budget: past it no new job starts that day
DAY_S = 86_400


def day_of(at: float) -> int:
    """The UTC day of ``at`` (days since 1970), the budget's period."""
    return int(at // DAY_S)


def stored_bytes(*texts: str | None) -> int:
    """What a job row holding ``texts`` takes in the database: the texts as UTF-8 (what
    both databases store) and ``JOB_ROW_BYTES``."""
    total = JOB_ROW_BYTES
    for text in texts:
        if text:
            # ASCII (the usual output) is counted without a copy.
            total += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return total


def cut(outcome: JobOutcome, command: str) -> tuple[JobOutcome, str]:
    """The outcome and command as kept past the budget: each stream's tail, the
    command's head."""
    kept = dataclasses.replace(
        outcome,
        stdout=outcome.stdout[-TAIL_CHARS:],
        stderr=outcome.stderr[-TAIL_CHARS:],
    )
    return kept, command[:COMMAND_KEPT_CHARS]


def not_kept_note(job_id: str) -> str:
    """What the agent is told of a job whose output passed the budget."""
    return (
        "This job's output went past the sandbox's daily storage budget for job output, "
        "so it is returned but not kept: this result was made from the whole output when "
        f"the job ended, and its record keeps only the last {TAIL_CHARS:,} characters of "
        f"each stream (and the command's first {COMMAND_KEPT_CHARS:,}); get_job_result("
        f"job_id={job_id!r}) later and the logs show only those. Print less (or write to "
        "a file and read it with the file tools), or wait for the next UTC day."
    )


def ceiling_refusal(stored: int, budget: int, now: float) -> LimitReached:
    """The refusal of a new job once the sandbox's day holds ``CEILING`` times the budget."""
    minutes = max(1, round((DAY_S - now % DAY_S) / 60))
    return LimitReached(
        f"Your sandbox has stored {stored:,} bytes of job records today: past the daily "
        f"budget of stored job output ({budget:,} bytes) each job keeps only the tails of "
        f"its output, and past {CEILING} times it no command runs. Commands run again when "
        f"the UTC day ends, in about {minutes} minutes; then print less (or write to files "
        "and read them with the file tools).",
        limit="job_output_per_day",
        value=budget,
    )
