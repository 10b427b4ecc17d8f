"""Refusal warnings of the sign-in path, written a bounded number of times.

Anyone may send /authorize, /register and /token requests, before any sign-in: the
fairness bench's 8 networks flooding /authorize with numeric-host client_ids wrote 26,288
``oauth.client_document_refused`` lines in about 170 s, one per request, into the log
every tenant shares (issue 23). Now, per event and minute, the first few lines of each
sign-in address, of each network and in all are written; the rest are counted, and
the count is written once as the minute ends (the event with ``repeats_not_written``,
with the next line of that event, the server's housekeeping, or at shutdown).

The same rule as app/sampling.py's (which bounds the tool runner's lines and the
server's own repeating warnings), kept here because auth/ never imports app/. Its
memory is bounded too: a minute holds the keys of its written lines (at most
``in_all``) and tells apart at most ``max_keys`` addresses of the counted ones (the
summary's ``addresses``); the rest count as one, ``others``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from auth.client_address import network_key

OTHERS = "others"


@dataclass
class _Minute:
    since: float
    written: int = 0
    counted: int = 0
    by_address: dict[str, int] = field(default_factory=dict)
    by_network: dict[str, int] = field(default_factory=dict)
    # The addresses whose repeats were only counted (at most max_keys of them told apart).
    counted_from: set[str] = field(default_factory=set)


class RefusalLog:
    """Warnings that anyone may cause, bounded per sign-in address, network and in all.

    ``warning(event, prefix, ...)``: ``prefix`` is the budget key of whoever caused it
    (auth.client_address); None counts in ``others``.
    """

    def __init__(
        self,
        log: Any,
        *,
        per_address: int = 5,
        per_network: int = 10,
        in_all: int = 30,
        window_s: float = 60.0,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.per_address = per_address
        self.per_network = per_network
        self.in_all = in_all
        self.window_s = window_s
        self.max_keys = max_keys
        self._log = log
        self._clock = clock
        # One entry per event name; the names are the code's own, so few.
        self._minutes: dict[str, _Minute] = {}

    def warning(self, event: str, prefix: str | None, **fields: Any) -> None:
        now = self._clock()
        self.flush(now)
        minute = self._minutes.get(event)
        if minute is None:
            minute = self._minutes[event] = _Minute(now)
        address = prefix or OTHERS
        network = network_key(address) if prefix else OTHERS
        # by_address and by_network hold written lines only: at most in_all keys each.
        if (
            minute.written < self.in_all
            and minute.by_address.get(address, 0) < self.per_address
            and minute.by_network.get(network, 0) < self.per_network
        ):
            # Counted only when written: a counted repeat spends no one's lines.
            minute.written += 1
            minute.by_address[address] = minute.by_address.get(address, 0) + 1
            minute.by_network[network] = minute.by_network.get(network, 0) + 1
            self._log.warning(event, **fields)
        else:
            minute.counted += 1
            # Past max_keys, a new address is one of the others: memory stays bounded
            # however many addresses a flood comes from.
            if address in minute.counted_from or len(minute.counted_from) < self.max_keys:
                minute.counted_from.add(address)
            else:
                minute.counted_from.add(OTHERS)

    def flush(self, now: float | None = None) -> None:
        """Write the counts of the minutes that are over, and forget those minutes."""
        now = self._clock() if now is None else now
        for event, minute in list(self._minutes.items()):
            if now >= minute.since + self.window_s:
                self._close(event, minute, minute.since + self.window_s)

    def drain(self) -> None:
        """Write every count, minutes over or not (at shutdown)."""
        now = self._clock()
        for event, minute in list(self._minutes.items()):
            self._close(event, minute, min(now, minute.since + self.window_s))

    def _close(self, event: str, minute: _Minute, until: float) -> None:
        del self._minutes[event]
        if minute.counted:
            self._log.warning(
                event,
                repeats_not_written=minute.counted,
                in_s=round(until - minute.since),
                addresses=len(minute.counted_from),
            )


# One per process, shared by the sign-in path's handlers and the client directory: the
# bound holds in all, whichever part refuses. The server flushes it on its housekeeping
# and drains it at shutdown (app/root/oauth.py).
refusals = RefusalLog(structlog.get_logger("auth.refusals"))
