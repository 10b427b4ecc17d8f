"""Shared by the readers: the result types, ``Unreadable`` and helpers for untrusted text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

WORKSPACE = "/workspace/"
# More failing names than the summary shows (200) are not kept: a report of a million
# failing cases costs its counts only.
MAX_KEPT_FAILING = 1000
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
    failing_cut: bool = False  # more failed than ``failing`` names
    duration_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def count(self, name: str, outcome: str) -> None:
        """One test's outcome: ``pass``, ``skip``, or anything else, a failure by ``name``."""
        if outcome == "pass":
            self.passed += 1
        elif outcome == "skip":
            self.skipped += 1
        else:
            self.fail(name)

    def fail(self, name: str, *, error: bool = False) -> None:
        if error:
            self.errors += 1
        else:
            self.failed += 1
        if len(self.failing) < MAX_KEPT_FAILING:
            self.failing.append(name)
        else:
            self.failing_cut = True


@dataclass(frozen=True)
class Inputs:
    stdout: str
    stderr: str
    report: bytes | None  # the runner's report file, as read (kept as bytes: 20 MB at most)
    text: str  # stdout and stderr together, for runners that split their output between them


Reader = Callable[[Inputs], Tally | None]


# --- small helpers for untrusted JSON ---------------------------------------------------------

# A JSON document's values cost ~20 times their text (``[{},{},...]``: 4 MiB of it took
# 81 MB), so a 20 MB report could take 400 MB. Every value but a container's first
# follows a comma, every key too, so this many commas and brackets bound what json.loads
# builds (about 35 MB). jest's own report has about 35 a test (the fixture's): past
# 14,000 tests the reading falls back to jest's text summary, which has the counts.
MAX_JSON_VALUES = 500_000


def json_values_over_cap(text: bytes) -> bool:
    """Whether ``text`` may hold more than ``MAX_JSON_VALUES`` values (counted, not parsed)."""
    return text.count(b",") + text.count(b"[") + text.count(b"{") > MAX_JSON_VALUES


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
