"""Readers of test-runner output, the reading half of ``testing``.

Each reader turns one format into a ``Tally``; ``first_reading`` tries them in order and
``summarize`` makes the agent-facing ``TestSummary`` of the result. All the text comes from a
process inside the sandbox, so it is hostile: a reader returns ``None`` when its format is
absent and raises ``Unreadable`` when the format is there but can't be used; anything else it
raises is caught in ``first_reading``. The regular expressions run on single lines of at most
4 KiB (or are anchored literals), so no input makes them backtrack for long.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypeVar

from app.experiments.evidence.readers._common import Inputs, Reader, Tally, TestSummary, Unreadable
from app.experiments.evidence.readers.cargo import cargo_text
from app.experiments.evidence.readers.go import go_json, go_text
from app.experiments.evidence.readers.javascript import (
    jest_json,
    jest_text,
    js_json_in_output,
    mocha_json,
    mocha_text,
    vitest_json,
    vitest_text,
)
from app.experiments.evidence.readers.junit import junit, junit_in_output
from app.experiments.evidence.readers.node import node_spec, tap
from app.experiments.evidence.readers.python import pytest_text, unittest_text

__all__ = [
    "MAX_INPUT_CHARS",
    "READERS",
    "SNIFFERS",
    "Inputs",
    "Reader",
    "Tally",
    "TestSummary",
    "Unreadable",
    "first_reading",
    "prepare",
    "summarize",
]

T = TypeVar("T", str, bytes)

MAX_FAILING = 200
MAX_NAME_CHARS = 500


# --- which readers, in which order --------------------------------------------------------------

READERS: dict[str, tuple[Reader, ...]] = {
    "pytest": (junit, pytest_text),
    "unittest": (unittest_text,),
    "node": (tap, node_spec),
    "jest": (jest_json, jest_text),
    "vitest": (vitest_json, vitest_text),
    "mocha": (mocha_json, mocha_text),
    "cargo": (cargo_text,),
    "go": (go_json, go_text),
}
# Structured formats first: a JSON or XML document may quote any text summary.
SNIFFERS: tuple[Reader, ...] = (
    go_json,
    js_json_in_output,
    mocha_json,
    junit_in_output,
    tap,
    cargo_text,
    pytest_text,
    unittest_text,
    jest_text,
    vitest_text,
    mocha_text,
    node_spec,
    go_text,
)
MAX_INPUT_CHARS = 20 * 1024 * 1024
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def prepare(stdout: str, stderr: str, report: bytes | str | None, notes: list[str]) -> Inputs:
    """Cap each text and drop colour codes from the terminal streams. The report stays
    bytes (the parsers decode it): as text one non-Latin character makes it 4 bytes a
    character."""

    def cap(text: T, what: str) -> T:
        if len(text) <= MAX_INPUT_CHARS:
            return text
        notes.append(f"{what} is over {MAX_INPUT_CHARS // 2**20} MB; read its start only")
        return text[:MAX_INPUT_CHARS]

    stdout, stderr = _ANSI.sub("", cap(stdout, "stdout")), _ANSI.sub("", cap(stderr, "stderr"))
    if isinstance(report, str):
        report = report.encode("utf-8", "replace")
    report = cap(report, "the report") if report is not None else None
    return Inputs(stdout, stderr, report, f"{stdout}\n{stderr}")


def first_reading(
    readers: Iterable[Reader], inputs: Inputs, notes: list[str], *, fallback: bool = False
) -> Tally | None:
    """The first reader's result that isn't None; why the ones before it failed goes to notes.

    With ``fallback``, the first reader is the runner's machine-readable output and the others
    its text summaries, which the notes then say.
    """
    for index, reader in enumerate(readers):
        try:
            tally = reader(inputs)
        except Unreadable as exc:
            notes.append(str(exc))
            continue
        except Exception:  # hostile output must never break the tool
            notes.append(f"the {reader.__name__} reader failed on this output")
            continue
        if tally is not None:
            if fallback and index:
                notes.append(
                    f"no machine-readable results; read {tally.runner}'s text summary instead"
                )
            return tally
    return None


def summarize(
    tally: Tally | None, notes: list[str], exit_code: int | None, runner: str | None
) -> TestSummary:
    """The agent-facing summary of a reading (``None``: nothing could be read)."""
    if tally is None:
        notes.append(f"could not read the test results; trust the exit code ({exit_code})")
        if exit_code == 127:
            notes.append("exit code 127: the command was not found (is the runner in the image?)")
        return TestSummary(detected=False, runner=runner, notes=notes)
    names = list(dict.fromkeys(_clip(name) for name in tally.failing if name))
    total = tally.passed + tally.failed + tally.skipped + tally.errors
    notes += tally.notes
    if total == 0:
        notes.append("no tests ran")
    elif tally.failed + tally.errors and exit_code == 0:
        notes.append("tests failed but the command exited 0")
    elif not tally.failed + tally.errors and exit_code not in (0, None):
        notes.append(
            f"no test failed but the command exited {exit_code}: a step outside the tests "
            "failed, or the run was cut short"
        )
    return TestSummary(
        detected=True,
        runner=tally.runner,
        passed=tally.passed,
        failed=tally.failed,
        skipped=tally.skipped,
        errors=tally.errors,
        total=total,
        failing_tests=names[:MAX_FAILING],
        failing_tests_truncated=len(names) > MAX_FAILING or tally.failing_cut,
        duration_s=round(tally.duration_s, 3) if tally.duration_s is not None else None,
        notes=notes,
    )


def _clip(name: str) -> str:
    return name if len(name) <= MAX_NAME_CHARS else name[: MAX_NAME_CHARS - 1] + "…"
