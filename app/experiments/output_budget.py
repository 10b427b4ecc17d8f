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

Why a daily budget and not "the newest N jobs of an experiment": an honest agent
never loses output it may page back to (256 MiB a day is hundreds of full-size
jobs), and the budget holds however many experiments the sandbox makes and
destroys, which a per-experiment count would not.
"""

from __future__ import annotations

import dataclasses

from app.experiments.records import JobOutcome

TAIL_CHARS = 4_096  # per stream, past the budget
COMMAND_KEPT_CHARS = 1_000  # views list commands cut to this (MAX_LISTED_COMMAND_CHARS)


def stored_bytes(*texts: str | None) -> int:
    """What ``texts`` take in the database, as UTF-8 (what both databases store)."""
    total = 0
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
