"""Reads TAP (node --test and other producers) and node --test's spec reporter."""

from __future__ import annotations

import re

from app.experiments.evidence.readers._common import Inputs, Tally, _lines

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
    _take_summary(tally, summary)
    return tally


def _take_summary(tally: Tally, summary: dict[str, float]) -> None:
    """Node's own counts win: they agree with the leaf count unless the output was cut."""
    if {"tests", "pass", "fail"} <= summary.keys():
        tally.passed = int(summary.get("pass", 0))
        tally.failed = int(summary.get("fail", 0) + summary.get("cancelled", 0))
        tally.skipped = int(summary.get("skipped", 0) + summary.get("todo", 0))
    if "duration_ms" in summary:
        tally.duration_s = summary["duration_ms"] / 1000


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
    _take_summary(tally, counts)
    return tally
