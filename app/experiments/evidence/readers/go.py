"""Reads go test output, as -json events or as text."""

from __future__ import annotations

import json
import re
from datetime import datetime

from app.experiments.evidence.readers._common import Inputs, Tally, _lines, _str

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
        tally.count(f"{package}.{test}", action)
        if action not in ("pass", "skip"):
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
                tally.count(f"{package}.{name}", outcome.lower())
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
