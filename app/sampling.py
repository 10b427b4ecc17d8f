"""Repeats written a bounded number of times: per key, the first few of each window are
written and the rest only counted, the count then written once.

One tenant can repeat a refused call a hundred times a second, and Docker being
down makes the same warning every pass of a loop: written each time, they filled
gigabytes of log and audit rows a day (issue 23). Every repeating thing that is
written (the tool runner's lines and rows, repeating warnings) goes through this
one mechanism.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Unwritten(Generic[K]):
    """What a window left unwritten: ``count`` repeats of ``key`` in [since, until)."""

    key: K
    count: int
    since: float
    until: float


@dataclass
class _Window:
    since: float
    written: int = 0
    counted: int = 0


class WindowSampler(Generic[K]):
    """Per key, a window of ``window_s`` opens at its first repeat: ``per_window`` repeats
    in it are admitted (to be written), the rest counted.

    ``ended()`` hands over, once each, the counts of windows that are over; ``drain()``
    every count (at shutdown). Memory holds one small entry per key seen in its last
    window: an ended window is forgotten as it is handed over.
    """

    def __init__(
        self, per_window: int, window_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.per_window = per_window
        self.window_s = window_s
        self._clock = clock
        self._windows: dict[K, _Window] = {}
        self._ended: list[Unwritten[K]] = []
        # Windows are looked over at most this often: ``ended()`` runs on every call.
        self._check_every_s = min(window_s, 5.0)
        self._next_check = clock() + self._check_every_s

    def admit(self, key: K) -> bool:
        """Whether this repeat of ``key`` is to be written (else it was counted)."""
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now >= window.since + self.window_s:
            self._close(key, window)
            window = None
        if window is None:
            window = self._windows[key] = _Window(now)
        if window.written < self.per_window:
            window.written += 1
            return True
        window.counted += 1
        return False

    def ended(self) -> list[Unwritten[K]]:
        """The counts of windows over since the last call."""
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + self._check_every_s
            for key, window in list(self._windows.items()):
                if now >= window.since + self.window_s:
                    self._close(key, window)
        handed, self._ended = self._ended, []
        return handed

    def drain(self) -> list[Unwritten[K]]:
        """Every count not yet handed over, windows over or not."""
        for key, window in list(self._windows.items()):
            self._close(key, window)
        handed, self._ended = self._ended, []
        return handed

    def _close(self, key: K, window: _Window) -> None:
        del self._windows[key]
        if window.counted:
            until = min(self._clock(), window.since + self.window_s)
            self._ended.append(Unwritten(key, window.counted, window.since, until))


class ThrottledLog:
    """A repeating log event written at most once a window per (event, key); each
    window's unwritten repeats are told in one line of their own (``event`` with
    ``repeats_not_written``), written with the next event of this log."""

    def __init__(
        self, log: Any, window_s: float = 60.0, clock: Callable[[], float] = time.time
    ) -> None:
        self._log = log
        self._sampler: WindowSampler[tuple[str, str, Hashable]] = WindowSampler(1, window_s, clock)

    def warning(self, event: str, key: Hashable = None, **fields: Any) -> None:
        self._write("warning", event, key, fields)

    def info(self, event: str, key: Hashable = None, **fields: Any) -> None:
        self._write("info", event, key, fields)

    def _write(self, level: str, event: str, key: Hashable, fields: dict[str, Any]) -> None:
        for unwritten in self._sampler.ended():
            was_level, was_event, _ = unwritten.key
            getattr(self._log, was_level)(
                was_event,
                repeats_not_written=unwritten.count,
                in_s=round(unwritten.until - unwritten.since),
            )
        if self._sampler.admit((level, event, key)):
            getattr(self._log, level)(event, **fields)
