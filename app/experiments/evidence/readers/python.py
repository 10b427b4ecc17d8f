"""Reads the text summaries of pytest and unittest."""

from __future__ import annotations

import re

from app.experiments.evidence.readers._common import Inputs, Tally, _counts, _lines, _num

# --- pytest's text summary ------------------------------------------------------------------

_PYTEST_SUMMARY = re.compile(r"^=*\s*(\d[\w ,]*?|no tests ran) in ([\d.]+)s\b")
_PYTEST_WORDS = frozenset(
    {"passed", "failed", "error", "errors", "skipped", "xfailed", "xpassed", "deselected"}
)
_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$")


def pytest_text(inputs: Inputs) -> Tally | None:
    summary: re.Match[str] | None = None
    failing: list[str] = []
    for line in _lines(inputs.text):
        if (match := _PYTEST_SUMMARY.match(line)) and (
            match[1] == "no tests ran" or _PYTEST_WORDS & _counts(match[1]).keys()
        ):
            summary = match
        elif match := _PYTEST_FAILED.match(line):
            failing.append(match[1])
    if summary is None:
        return None
    counts = _counts(summary[1])
    tally = Tally("pytest", duration_s=_num(summary[2]))
    tally.passed = counts.get("passed", 0) + counts.get("xpassed", 0)
    tally.skipped = counts.get("skipped", 0) + counts.get("xfailed", 0)
    tally.failed = counts.get("failed", 0)
    tally.errors = counts.get("error", 0) + counts.get("errors", 0)
    tally.failing = failing
    return tally


# --- unittest -v ------------------------------------------------------------------------------

_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in ([\d.]+)s$")
_UNITTEST_END = re.compile(r"^(OK|FAILED)(?: \((.*)\))?$")
_UNITTEST_FAILED = re.compile(r"^(FAIL|ERROR|UNEXPECTED SUCCESS): (\S+) \(([^)]*)\)(.*)$")


def unittest_text(inputs: Inputs) -> Tally | None:
    ran: re.Match[str] | None = None
    end: re.Match[str] | None = None
    names: list[str] = []
    for line in _lines(inputs.text):
        if match := _UNITTEST_FAILED.match(line):
            method, where, rest = match[2], match[3], match[4]
            # 3.11 prints "test_x (pkg.Class.test_x)", older Pythons "test_x (pkg.Class)".
            test_id = where if where.endswith(f".{method}") else f"{where}.{method}"
            names.append(test_id + rest)
        elif match := _UNITTEST_RAN.match(line):
            ran, end = match, None
        elif ran and (match := _UNITTEST_END.match(line)):
            end = match
    if ran is None or end is None:
        return None
    counts = {k.strip(): int(v) for k, v in re.findall(r"([a-z ]+)=(\d{1,9})", end[2] or "")}
    tally = Tally("unittest", duration_s=_num(ran[2]), failing=names)
    tally.failed = counts.get("failures", 0) + counts.get("unexpected successes", 0)
    tally.errors = counts.get("errors", 0)
    tally.skipped = counts.get("skipped", 0) + counts.get("expected failures", 0)
    # Failing subtests are counted one by one, so the parts may add up to more than "Ran N".
    tally.passed = max(0, int(ran[1]) - tally.failed - tally.errors - tally.skipped)
    return tally
