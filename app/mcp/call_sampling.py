"""Which tool calls get their ``tool.call`` line and audit row, and the counts of those
that do not.

Each call used to write both, so one sandbox repeating a refused call 121 times a
second made about 5 GiB of log a day and 19 GB of audit rows within the retention
(issue 23). Now, per sandbox:

* refusals (any outcome but ``ok``): the first ``refusals_per_minute`` of each tool
  and code a minute are written (per process), the rest counted;
* every call: the first ``rows_per_day`` of a UTC day are written, counted in the
  database every process shares, and the sandboxes signed in from one address
  together write at most ``rows_per_address_per_day``; past either, the calls are
  counted per tool and outcome, an hour at a time.

Each count is written as one line and one row standing for ``calls`` calls, once its
window is over (with the next call's, or at shutdown). Calls under every bound (an
honest tenant's) are all written. Metrics count every call whatever is written.

The day's rows are reserved from the shared count a block at a time
(:class:`DailyAllowance`), so a call costs no round trip of its own: a process holds at
most a block per sandbox and address unspent, given back as it stops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from app.errors import DatabaseUnavailable
from app.sampling import Unwritten, WindowSampler

log = structlog.get_logger("app.mcp.call_sampling")

# (sandbox key, tool, outcome)
CallKey = tuple[str, str, str]

MINUTE_S = 60.0
DAY_S = 86_400.0
HOUR_S = 3_600.0

# A block is a hundredth of the day's rows (at most 1,000): at the default 100,000 a
# sandbox's calls go to the database once per 1,000, and the rows a process may hold
# unspent (a block per sandbox and process) are 1% of its day.
BLOCK_PARTS = 100
MAX_BLOCK = 1_000


class DayLedger(Protocol):
    """The day's rows of every owner, shared by the processes that write the audit trail
    (app/storage/audit_day_store.py)."""

    async def reserve(self, owner: str, day: int, want: int, cap: int) -> int:
        """Up to ``want`` of ``owner``'s ``cap`` rows of ``day``: how many granted."""

    async def give_back(self, owner: str, day: int, count: int, cap: int) -> None:
        """Return ``count`` rows reserved and not written."""


class MemoryDays:
    """A ledger of one process (unit tests, and a runner built without a database)."""

    def __init__(self) -> None:
        self.granted: dict[tuple[str, int], int] = {}

    async def reserve(self, owner: str, day: int, want: int, cap: int) -> int:
        if any(seen < day for _, seen in self.granted):  # past days are forgotten
            self.granted = {k: v for k, v in self.granted.items() if k[1] >= day}
        have = self.granted.get((owner, day), 0)
        taken = max(0, min(want, cap - have))
        self.granted[owner, day] = have + taken
        return taken

    async def give_back(self, owner: str, day: int, count: int, cap: int) -> None:
        have = self.granted.get((owner, day), 0)
        self.granted[owner, day] = max(0, min(have, cap) - count)


@dataclass
class _Held:
    day: int
    left: int = 0
    spent: bool = False  # the ledger has nothing more for this day


class DailyAllowance:
    """Each owner's ``per_day`` rows of a day, reserved from ``ledger`` ``block`` at a
    time and spent here; one reservation in flight per owner, whoever waits for it."""

    def __init__(self, ledger: DayLedger, per_day: int, block: int | None = None) -> None:
        self.per_day = per_day
        self.block = block or max(1, min(MAX_BLOCK, per_day // BLOCK_PARTS))
        self._ledger = ledger
        self._held: dict[str, _Held] = {}
        self._reserving: dict[str, asyncio.Task[None]] = {}

    def has(self, owner: str, day: int) -> bool | None:
        """True: a row is held here; False: the day is spent; None: ask the ledger."""
        held = self._held.get(owner)
        if held is None or held.day != day:
            return None
        if held.left:
            return True
        return False if held.spent else None

    def take(self, owner: str) -> None:
        self._held[owner].left -= 1

    async def refill(self, owner: str, day: int) -> None:
        task = self._reserving.get(owner)
        if task is None:
            task = self._reserving[owner] = asyncio.create_task(self._reserve(owner, day))
        # Shielded: a caller that goes away leaves the reservation to the others.
        await asyncio.shield(task)

    async def _reserve(self, owner: str, day: int) -> None:
        try:
            try:
                got = await self._ledger.reserve(owner, day, self.block, self.per_day)
                spent = got < self.block
            except DatabaseUnavailable:
                # The row's own write will fail and be told (audit.write_failed); the
                # call is not turned into a count by a database that is away.
                got, spent = 1, False
            held = self._held.get(owner)
            if held is None or held.day != day:
                held = self._held[owner] = _Held(day)
            held.left += got
            held.spent = spent
        finally:
            del self._reserving[owner]

    def forget_before(self, day: int) -> None:
        """Drop the owners of past days (their unspent rows count for nothing now)."""
        self._held = {owner: held for owner, held in self._held.items() if held.day >= day}

    async def give_back(self) -> None:
        """Return every row held and unspent (at shutdown), so other processes get them."""
        for owner, held in list(self._held.items()):
            if held.left:
                left, held.left = held.left, 0
                try:
                    await self._ledger.give_back(owner, held.day, left, self.per_day)
                except DatabaseUnavailable as exc:
                    log.warning("audit.give_back_failed", reason=exc.details["reason"])
                    return


class CallSampling:
    def __init__(
        self,
        refusals_per_minute: int,
        rows_per_day: int,
        clock: Callable[[], float] = time.time,
        *,
        rows_per_address_per_day: int = 0,
        days: DayLedger | None = None,
    ) -> None:
        """``days`` is the ledger every process shares (by default one of this process
        alone); ``rows_per_address_per_day`` 0 sets no bound per address."""
        self._clock = clock
        self._refusals: WindowSampler[CallKey] = WindowSampler(refusals_per_minute, MINUTE_S, clock)
        ledger = days or MemoryDays()
        self._sandboxes = DailyAllowance(ledger, rows_per_day)
        self._addresses = (
            DailyAllowance(ledger, rows_per_address_per_day) if rows_per_address_per_day else None
        )
        self._today = int(clock() // DAY_S)
        # Past the day's rows, nothing is written one by one: each (tool, outcome) counted.
        self._past_day: WindowSampler[CallKey] = WindowSampler(0, HOUR_S, clock)

    async def admit(
        self, sandbox_key: str, tool: str, outcome: str, address: str | None = None
    ) -> bool:
        """Whether this call's line and row are written (else it was counted).
        ``address`` is the sign-in address's key the sandbox shares its rows with."""
        key = (sandbox_key, tool, outcome)
        if outcome != "ok" and not self._refusals.admit(key):
            return False
        day = int(self._clock() // DAY_S)
        if day != self._today:
            self._today = day
            self._sandboxes.forget_before(day)
            if self._addresses is not None:
                self._addresses.forget_before(day)
        wanted = [(self._sandboxes, "s:" + sandbox_key)]
        if address and self._addresses is not None:
            wanted.append((self._addresses, "a:" + address))
        while True:
            # Each pass either finds a row held for every owner (no await: the light
            # call's path), finds one owner's day spent, or reserves a block for one.
            missing: tuple[DailyAllowance, str] | None = None
            for allowance, owner in wanted:
                held = allowance.has(owner, day)
                if held is False:
                    self._past_day.admit(key)
                    return False
                if held is None:
                    missing = (allowance, owner)
                    break
            if missing is None:
                for allowance, owner in wanted:
                    allowance.take(owner)
                return True
            await missing[0].refill(missing[1], day)

    def ended(self) -> list[Unwritten[CallKey]]:
        """The counts whose window is over, each handed over once."""
        return self._refusals.ended() + self._past_day.ended()

    def drain(self) -> list[Unwritten[CallKey]]:
        """Every count not yet handed over (at shutdown)."""
        return self._refusals.drain() + self._past_day.drain()

    async def give_back(self) -> None:
        """Return the day's rows reserved and not written (at shutdown)."""
        await self._sandboxes.give_back()
        if self._addresses is not None:
            await self._addresses.give_back()
