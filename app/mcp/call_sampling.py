"""Which tool calls get their ``tool.call`` line and audit row, and the counts of those
that do not.

Each call used to write both, so one sandbox repeating a refused call 121 times a
second made about 5 GiB of log a day and 19 GB of audit rows within the retention
(issue 23). Now, per sandbox:

* refusals (any outcome but ``ok``): the first ``refusals_per_minute`` of each tool
  and code a minute are written, the rest counted;
* every call: the first ``rows_per_day`` of a day are written (per process), the
  rest counted per tool and outcome, an hour at a time.

Each count is written as one line and one row standing for ``calls`` calls, once its
window is over (with the next call's, or at shutdown). Calls under both bounds (an
honest tenant's) are all written. Metrics count every call whatever is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.sampling import Unwritten, WindowSampler

# (sandbox key, tool, outcome)
CallKey = tuple[str, str, str]

MINUTE_S = 60.0
DAY_S = 86_400.0
HOUR_S = 3_600.0


class CallSampling:
    def __init__(
        self,
        refusals_per_minute: int,
        rows_per_day: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._refusals: WindowSampler[CallKey] = WindowSampler(refusals_per_minute, MINUTE_S, clock)
        self._days: WindowSampler[str] = WindowSampler(rows_per_day, DAY_S, clock)
        # Past the day's rows, nothing is written one by one: each (tool, outcome) counted.
        self._past_day: WindowSampler[CallKey] = WindowSampler(0, HOUR_S, clock)

    def admit(self, sandbox_key: str, tool: str, outcome: str) -> bool:
        """Whether this call's line and row are written (else it was counted)."""
        key = (sandbox_key, tool, outcome)
        if outcome != "ok" and not self._refusals.admit(key):
            return False
        if not self._days.admit(sandbox_key):
            self._past_day.admit(key)
            return False
        return True

    def ended(self) -> list[Unwritten[CallKey]]:
        """The counts whose window is over, each handed over once."""
        self._days.ended()  # forgets past days; their counts are _past_day's
        return self._refusals.ended() + self._past_day.ended()

    def drain(self) -> list[Unwritten[CallKey]]:
        """Every count not yet handed over (at shutdown)."""
        self._days.drain()
        return self._refusals.drain() + self._past_day.drain()
