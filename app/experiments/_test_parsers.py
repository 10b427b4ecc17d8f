"""Readers of test-runner output, the reading half of ``testing``.

Each reader turns one format into a ``Tally``; ``first_reading`` tries them in order and
``summarize`` makes the agent-facing ``TestSummary`` of the result. All the text comes from a
process inside the sandbox, so it is hostile: a reader returns ``None`` when its format is
absent and raises ``Unreadable`` when the format is there but can't be used; anything else it
raises is caught in ``first_reading``. The regular expressions run on single lines of at most
4 KiB (or are anchored literals), so no input makes them backtrack for long.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring as defused_fromstring

WORKSPACE = "/workspace/"
MAX_FAILING = 200
MAX_NAME_CHARS = 500
_SKIPPED = frozenset({"pending", "skipped", "todo", "disabled"})


@dataclass(frozen=True)
class TestSummary:
    """What a test run came to; ``detected`` is False when its output could not be read."""

    __test__: ClassVar[bool] = False

    detected: bool
    runner: str | None
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    total: int = 0
    failing_tests: list[str] = field(default_factory=list)
    failing_tests_truncated: bool = False
    duration_s: float | None = None
    notes: list[str] = field(default_factory=list)


class Unreadable(Exception):
    """The format is present but its content can't be used; the message says why."""


@dataclass
class Tally:
    runner: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    failing: list[str] = field(default_factory=list)
    duration_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def fail(self, name: str, *, error: bool = False) -> None:
        if error:
            self.errors += 1
        else:
            self.failed += 1
        self.failing.append(name)


@dataclass(frozen=True)
class Inputs:
    stdout: str
    stderr: str
    report: str | None
    text: str  # stdout and stderr together, for runners that split their output between them


Reader = Callable[[Inputs], Tally | None]


# --- small helpers for untrusted JSON ---------------------------------------------------------


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if 0 <= number < 1e15 else None


def _rel(path: str) -> str:
    return path[len(WORKSPACE) :] if path.startswith(WORKSPACE) else path


def _lines(text: str) -> Iterator[str]:
    # Summary lines are short; a megabyte-long line is output, not a summary.
    return (line for line in text.splitlines() if len(line) <= 4096)


def _json_at(text: str, key: str) -> dict[str, Any] | None:
    """The JSON object holding ``"key"``, found in output that may carry other lines around it."""
    decoder = json.JSONDecoder()
    end = len(text)
    for _ in range(5):
        at = text.rfind(f'"{key}"', 0, end)
        if at < 0:
            return None
        start = text.rfind("{", 0, at)
        if start >= 0:
            try:
                value, _ = decoder.raw_decode(text, start)
            except (ValueError, RecursionError):
                value = None
            if isinstance(value, dict) and key in value:
                return value
        end = at
    return None


def _counts(text: str) -> dict[str, int]:
    """``"7 failed, 6 passed"`` or ``"3 failed | 2 passed"`` → ``{"failed": 7, "passed": 6}``."""
    found: dict[str, int] = {}
    for number, word in re.findall(r"(\d{1,9}) ([a-z]+)", text):
        found[word] = found.get(word, 0) + int(number)
    return found


# --- JUnit XML (pytest --junitxml, and other producers) ----------------------------------------

_XML_REFUSED = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def junit(inputs: Inputs) -> Tally | None:
    return junit_text(inputs.report, "pytest") if inputs.report else None


def junit_in_output(inputs: Inputs) -> Tally | None:
    text = inputs.stdout
    start = text.find("<testsuite")
    if start < 0:
        return None
    decl = text.rfind("<?xml", 0, start)
    end = max(text.rfind("</testsuites>"), text.rfind("</testsuite>"))
    if end < start:
        return None
    body = text[decl if decl >= 0 else start : text.index(">", end) + 1]
    return junit_text(body, "junit")


def junit_text(text: str, runner: str) -> Tally:
    # The report comes from a hostile container: no DTD is accepted at all (refused
    # unread here), and defusedxml refuses entities and external references again.
    if _XML_REFUSED.search(text):
        raise Unreadable("the JUnit XML declares a DOCTYPE or ENTITY; refused it unread")
    try:
        root = defused_fromstring(text)
    except DefusedXmlException as exc:
        raise Unreadable(f"the JUnit XML was refused ({type(exc).__name__})") from None
    except ET.ParseError as exc:
        raise Unreadable(f"the JUnit XML is not well-formed ({exc})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise Unreadable(f"the XML report's root is <{root.tag[:40]}>, not <testsuites>")
    tally = Tally(runner)
    for case in root.iter("testcase"):
        outcomes = {child.tag for child in case}
        if "failure" in outcomes:
            tally.fail(_junit_name(case))
        elif "error" in outcomes:
            tally.fail(_junit_name(case), error=True)
        elif "skipped" in outcomes:
            tally.skipped += 1
        else:
            tally.passed += 1
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    times = [_num(suite.get("time")) for suite in suites]
    tally.duration_s = _num(root.get("time")) or sum(t for t in times if t is not None)
    return tally


def _junit_name(case: ET.Element) -> str:
    """pytest's node id when the report has ``file`` (``junit_family=xunit1``), else class.name."""
    name, classname, file = case.get("name", ""), case.get("classname", ""), case.get("file")
    if file and file.endswith(".py"):
        module = file[:-3].replace("/", ".")
        if not classname:
            return file  # a collection error: the module itself failed
        if classname == module:
            return f"{file}::{name}"
        if classname.startswith(module + "."):
            return f"{file}::{classname[len(module) + 1 :].replace('.', '::')}::{name}"
    return f"{classname}.{name}" if classname else name


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


# --- TAP (node --test, and other producers) ----------------------------------------------------

_TAP_POINT = re.compile(r"^(\s*)(not ok|ok)\b *\d* *-? ?(.*)$")
_TAP_DIRECTIVE = re.compile(r"(?<!\\)#\s*(SKIP|TODO)\b", re.IGNORECASE)
_NODE_SUMMARY = re.compile(
    r"^# (tests|pass|fail|cancelled|skipped|todo|duration_ms) (\d+(?:\.\d+)?)$"
)


def tap(inputs: Inputs) -> Tally | None:
    text = inputs.stdout
    if "TAP version" not in text and not re.search(r"(?m)^1\.\.\d+$", text):
        return None
    tally = Tally("tap")
    parents: dict[int, str] = {}
    summary: dict[str, float] = {}
    last_indent, points, after_point, in_yaml = -1, 0, False, False
    for line in text.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        # The YAML block after a test point holds error text, which may look like anything.
        if in_yaml:
            in_yaml = stripped != "..."
            continue
        if after_point and stripped == "---":
            after_point, in_yaml = False, True
            continue
        after_point = False
        if stripped.startswith(("ok", "not ok")) and (match := _TAP_POINT.match(line)):
            points, after_point = points + 1, True
            # Node prints a test's subtests, indented, before the test itself.
            has_children, last_indent = last_indent > indent, indent
            if not has_children:
                _tap_point(tally, match, parents, indent)
        elif stripped.startswith("# Subtest: "):
            tally.runner = "node"  # only node's TAP names each test in a comment first
            parents = {at: name for at, name in parents.items() if at < indent}
            parents[indent] = stripped[len("# Subtest: ") :].replace("\\#", "#")
        elif indent == 0 and (match := _NODE_SUMMARY.match(line)):
            summary[match[1]] = float(match[2])
        elif stripped.startswith("Bail out!"):
            tally.notes.append(f"the run bailed out: {stripped[:200]}")
    if points == 0 and not summary:
        return None
    if {"tests", "pass", "fail"} <= summary.keys():
        # Node's own counts; they agree with the leaf count unless the output was cut.
        tally.passed = int(summary.get("pass", 0))
        tally.failed = int(summary.get("fail", 0) + summary.get("cancelled", 0))
        tally.skipped = int(summary.get("skipped", 0) + summary.get("todo", 0))
    if "duration_ms" in summary:
        tally.duration_s = summary["duration_ms"] / 1000
    return tally


def _tap_point(tally: Tally, match: re.Match[str], parents: dict[int, str], indent: int) -> None:
    description = match[3]
    directive = _TAP_DIRECTIVE.search(description)
    if directive:
        description = description[: directive.start()].rstrip()
    description = description.replace("\\#", "#").replace("\\\\", "\\")
    if directive:
        tally.skipped += 1
    elif match[2] == "ok":
        tally.passed += 1
    else:
        path = [name for at, name in sorted(parents.items()) if at < indent]
        tally.fail(" > ".join([*path, description]))


# --- node --test's spec reporter (the default on a terminal, and everywhere from Node 23) ------

_SPEC_COUNT = re.compile(
    r"^\u2139 (tests|pass|fail|cancelled|skipped|todo|duration_ms) (\d+(?:\.\d+)?)$"
)
_SPEC_FAILED = re.compile(r"^✖ (.+?) \([\d.]+m?s\)( # TODO)?$")


def node_spec(inputs: Inputs) -> Tally | None:
    counts: dict[str, float] = {}
    names: list[str] = []
    in_failures = False
    for line in _lines(inputs.text):
        if match := _SPEC_COUNT.match(line):
            counts[match[1]] = float(match[2])
        elif line.startswith("✖ failing tests:"):
            in_failures = True
        elif in_failures and (match := _SPEC_FAILED.match(line)) and not match[2]:
            names.append(match[1])
    if "tests" not in counts:
        return None
    tally = Tally("node", failing=names)
    tally.passed = int(counts.get("pass", 0))
    tally.failed = int(counts.get("fail", 0) + counts.get("cancelled", 0))
    tally.skipped = int(counts.get("skipped", 0) + counts.get("todo", 0))
    if "duration_ms" in counts:
        tally.duration_s = counts["duration_ms"] / 1000
    return tally


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


# --- go test -json ----------------------------------------------------------------------------

_GO_BUILD_FAILED = re.compile(r"(?m)^FAIL\s+(\S+) \[(?:build|setup) failed\]$")
_GO_ENDS = ('"Action":"pass"', '"Action":"fail"', '"Action":"skip"')


def go_json(inputs: Inputs) -> Tally | None:
    outcomes: dict[tuple[str, str], str] = {}
    parents: set[tuple[str, str]] = set()
    # Before Go 1.24 a package that didn't build is a plain line, not an event.
    plain = _GO_BUILD_FAILED.findall(inputs.stdout) if " failed]" in inputs.stdout else []
    failed_packages = dict.fromkeys(plain, True)
    times: list[str] = []
    events = 0
    for line in _go_end_events(inputs.stdout):
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(event, dict):
            continue
        action, package, test = event.get("Action"), _str(event.get("Package")), event.get("Test")
        if action not in ("pass", "fail", "skip"):
            continue
        events += 1
        if isinstance(time := event.get("Time"), str):
            times.append(time)
        if not isinstance(test, str) or not test:
            if action == "fail":
                failed_packages[package] = bool(event.get("FailedBuild"))
            continue
        outcomes[(package, test)] = action
        parents.update((package, parent) for parent in _parents(test))
    if events == 0:
        return None
    tally = Tally("go")
    failing_packages: set[str] = set()
    for (package, test), action in outcomes.items():
        if (package, test) in parents:
            continue
        if action == "pass":
            tally.passed += 1
        elif action == "skip":
            tally.skipped += 1
        else:
            tally.fail(f"{package}.{test}")
            failing_packages.add(package)
    for package, build in failed_packages.items():
        if package not in failing_packages:
            tally.fail(package, error=True)
            if build:
                tally.notes.append(f"{package} did not build")
    tally.duration_s = _elapsed(times[0], times[-1]) if times else None
    return tally


def _go_end_events(text: str) -> list[str]:
    """The lines holding a pass, fail or skip event, in order. Finding them by their marker
    skips the output events, which are most of the stream and say nothing these don't; the
    marker can't occur inside a JSON string, where quotes are escaped."""
    found: list[tuple[int, str]] = []
    for marker in _GO_ENDS:
        at = text.find(marker)
        while at >= 0:
            start = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at)
            end = len(text) if end < 0 else end
            found.append((start, text[start:end]))
            at = text.find(marker, end)
    found.sort()
    return [line for _, line in found]


def _parents(test: str) -> list[str]:
    """``"A/b/c"`` → ``["A", "A/b"]``; a name too long to be real is taken as a leaf."""
    if len(test) > 1000:
        return []
    parts = test.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _elapsed(first: str, last: str) -> float | None:
    try:
        seconds = (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
    except (ValueError, TypeError):
        return None
    return seconds if seconds >= 0 else None


# --- go test (text) ---------------------------------------------------------------------------

_GO_TEST_LINE = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \(")
_GO_PACKAGE_LINE = re.compile(r"^(ok|FAIL)\s*\t(\S+)")


def go_text(inputs: Inputs) -> Tally | None:
    tally = Tally("go")
    block: dict[str, str] = {}  # this package's tests: go prints them before the package line
    packages = {"ok": 0, "FAIL": 0}
    for line in _lines(inputs.text):
        if match := _GO_TEST_LINE.match(line):
            block[match[2]] = match[1]
        elif match := _GO_PACKAGE_LINE.match(line):
            package, failed = match[2], tally.failed
            packages[match[1]] += 1
            parents = {parent for name in block for parent in _parents(name)}
            for name, outcome in block.items():
                if name in parents:
                    continue
                if outcome == "PASS":
                    tally.passed += 1
                elif outcome == "SKIP":
                    tally.skipped += 1
                else:
                    tally.fail(f"{package}.{name}")
            if match[1] == "FAIL" and tally.failed == failed:
                tally.fail(package, error=True)
            block = {}
    if not sum(packages.values()):
        return None
    if not tally.passed + tally.skipped:
        tally.notes.append(
            f"go test printed per-package results only ({packages['ok']} ok, "
            f"{packages['FAIL']} FAIL); run it with -json or -v for per-test counts"
        )
    return tally


# --- cargo test (libtest's text; its JSON output needs a nightly toolchain) --------------------

_CARGO_RESULT = re.compile(
    r"^test result: (?:ok|FAILED)\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured;"
    r".*?(?:finished in ([\d.]+)s)?$"
)
_CARGO_FAILED = re.compile(r"^test (.+?) \.\.\. FAILED$")
_CARGO_STDOUT = re.compile(r"^---- (.+?) std(?:out|err) ----$")


def cargo_text(inputs: Inputs) -> Tally | None:
    tally = Tally("cargo", duration_s=0.0)
    results = 0
    for line in _lines(inputs.stdout):
        if match := _CARGO_RESULT.match(line):
            results += 1
            tally.passed += int(match[1]) + int(match[4])
            tally.failed += int(match[2])
            tally.skipped += int(match[3])
            tally.duration_s = (tally.duration_s or 0) + (_num(match[5]) or 0)
        elif match := _CARGO_FAILED.match(line) or _CARGO_STDOUT.match(line):
            tally.failing.append(match[1].removesuffix(" - should panic"))
    if results == 0:
        if re.search(r"(?m)^error(\[E\d+\])?: (could not compile|.*)", inputs.stderr):
            raise Unreadable("cargo printed no test result: the crate did not compile")
        return None
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


def prepare(stdout: str, stderr: str, report: str | None, notes: list[str]) -> Inputs:
    """Cap each text and drop colour codes from the terminal streams."""

    def cap(text: str, what: str) -> str:
        if len(text) <= MAX_INPUT_CHARS:
            return text
        notes.append(f"{what} is over {MAX_INPUT_CHARS // 2**20} MB; read its start only")
        return text[:MAX_INPUT_CHARS]

    stdout, stderr = _ANSI.sub("", cap(stdout, "stdout")), _ANSI.sub("", cap(stderr, "stderr"))
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
        failing_tests_truncated=len(names) > MAX_FAILING,
        duration_s=round(tally.duration_s, 3) if tally.duration_s is not None else None,
        notes=notes,
    )


def _clip(name: str) -> str:
    return name if len(name) <= MAX_NAME_CHARS else name[: MAX_NAME_CHARS - 1] + "…"
