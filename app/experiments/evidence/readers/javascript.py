"""Reads jest, vitest and mocha output: their JSON reports and their text summaries."""

from __future__ import annotations

import json
import re
from typing import Any

from app.experiments.evidence.readers._common import (
    _SKIPPED,
    MAX_JSON_VALUES,
    Inputs,
    Tally,
    Unreadable,
    _counts,
    _dict,
    _json_at,
    _lines,
    _list,
    _num,
    _rel,
    _str,
    json_values_over_cap,
)

# --- jest --json and vitest --reporter=json (the same shape) -----------------------------------


def jest_json(inputs: Inputs) -> Tally | None:
    return _js_report(inputs, "jest")


def vitest_json(inputs: Inputs) -> Tally | None:
    return _js_report(inputs, "vitest")


def js_json_in_output(inputs: Inputs) -> Tally | None:
    data = _json_at(inputs.stdout, "numTotalTests")
    if data is None:
        return None
    return _js_tally(data, "jest" if "numRuntimeErrorTestSuites" in data else "vitest")


def _js_report(inputs: Inputs, runner: str) -> Tally | None:
    if inputs.report is None:
        data = _json_at(inputs.stdout, "numTotalTests")
        return _js_tally(data, runner) if data is not None else None
    if json_values_over_cap(inputs.report):
        raise Unreadable(
            f"the {runner} JSON report holds more than {MAX_JSON_VALUES:,} values "
            "(cap MAX_JSON_VALUES); not read"
        )
    try:
        data = json.loads(inputs.report)
    except (ValueError, RecursionError) as exc:
        raise Unreadable(f"the {runner} JSON report is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or "testResults" not in data:
        raise Unreadable(f"the {runner} JSON report has no testResults")
    return _js_tally(data, runner)


def _js_tally(data: dict[str, Any], runner: str) -> Tally:
    tally = Tally(runner)
    ended: list[float] = []
    for file_result in map(_dict, _list(data.get("testResults"))):
        file = _rel(_str(file_result.get("name")))
        failed_before = tally.failed
        for test in map(_dict, _list(file_result.get("assertionResults"))):
            status = _str(test.get("status"))
            if status == "passed":
                tally.passed += 1
            elif status == "failed":
                titles = [*map(_str, _list(test.get("ancestorTitles"))), _str(test.get("title"))]
                tally.fail(" > ".join([file, *titles]))
            elif status in _SKIPPED:
                tally.skipped += 1
        # A file that failed with no failing test never ran: a syntax error, a missing import.
        if tally.failed == failed_before and file_result.get("status") == "failed":
            tally.fail(file, error=True)
        if (end := _num(file_result.get("endTime"))) is not None:
            ended.append(end)
    start = _num(data.get("startTime"))
    if start is not None and ended and max(ended) >= start:
        tally.duration_s = (max(ended) - start) / 1000
    return tally


# --- mocha --reporter json --------------------------------------------------------------------


def mocha_json(inputs: Inputs) -> Tally | None:
    # Mocha writes its JSON to stdout after whatever the tests printed there.
    data = _json_at(inputs.stdout, "stats")
    if data is None or not isinstance(data.get("stats"), dict):
        return None
    tally = Tally("mocha", passed=len(_list(data.get("passes"))))
    tally.skipped = len(_list(data.get("pending")))
    for failure in map(_dict, _list(data.get("failures"))):
        tally.fail(_str(failure.get("fullTitle")) or _str(failure.get("title")))
    if (duration := _num(_dict(data["stats"]).get("duration"))) is not None:
        tally.duration_s = duration / 1000
    return tally


# --- text summaries of the JavaScript runners ---------------------------------------------------

_JEST_TESTS = re.compile(r"^Tests:\s+(.*) total$")
_JEST_FILE = re.compile(r"^(?:FAIL|PASS) (\S.*?)(?: \([\d.]+ m?s\))?$")
_VITEST_TESTS = re.compile(r"^\s*Tests\s+(\d[^()]*)\((\d+)\)$")
_VITEST_FAIL = re.compile(r"^ FAIL  (.+?)(?: \[ [^\[\]]* \])?$")
_MOCHA_COUNT = re.compile(r"^\s+(\d+) (passing|pending|failing)(?: \((\d+)(ms|s|m)\))?$")
_MOCHA_FAILURE = re.compile(r"^  (\d+)\) (.*)$")


def jest_text(inputs: Inputs) -> Tally | None:
    counts: dict[str, int] | None = None
    tally = Tally("jest")
    file = ""
    for line in _lines(inputs.text):
        if match := _JEST_TESTS.match(line):
            counts = _counts(match[1])
        elif match := _JEST_FILE.match(line):
            file = match[1]
        elif line.startswith("  ● ") and not line.startswith("  ● Console"):
            title = line[4:].strip()
            if title == "Test suite failed to run":
                tally.errors += 1
                tally.failing.append(file)
            else:
                tally.failing.append(" > ".join([file, *title.split(" \u203a ")]))
    if counts is None:
        return None
    tally.passed = counts.get("passed", 0)
    tally.failed = counts.get("failed", 0)
    tally.skipped = counts.get("skipped", 0) + counts.get("todo", 0) + counts.get("pending", 0)
    return tally


def vitest_text(inputs: Inputs) -> Tally | None:
    counts: dict[str, int] | None = None
    tally = Tally("vitest")
    for line in _lines(inputs.text):
        if match := _VITEST_TESTS.match(line):
            counts = _counts(match[1])
        elif match := _VITEST_FAIL.match(line):
            if " > " in match[1]:
                tally.failing.append(match[1])
            else:
                tally.fail(match[1], error=True)
    if counts is None:
        return None
    tally.passed = counts.get("passed", 0)
    tally.failed = counts.get("failed", 0)
    tally.skipped = counts.get("skipped", 0) + counts.get("todo", 0)
    return tally


def mocha_text(inputs: Inputs) -> Tally | None:
    counts: dict[str, int] = {}
    tally = Tally("mocha")
    title: list[str] | None = None
    for line in _lines(inputs.text):
        if match := _MOCHA_COUNT.match(line):
            counts[match[2]] = int(match[1])
            if match[3]:
                tally.duration_s = int(match[3]) / {"ms": 1000, "s": 1, "m": 1 / 60}[match[4]]
        elif "failing" in counts and (match := _MOCHA_FAILURE.match(line)):
            title = [match[2].strip()]
        elif title is not None:
            # A failure's title is spread over indented lines, the last ending with ":".
            title.append(line.strip())
            if line.endswith(":") or len(title) > 20:
                tally.failing.append(" ".join(title).removesuffix(":"))
                title = None
    if "passing" not in counts and "failing" not in counts:
        return None
    tally.passed = counts.get("passing", 0)
    tally.failed = counts.get("failing", 0)
    tally.skipped = counts.get("pending", 0)
    return tally
