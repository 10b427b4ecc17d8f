"""Which calls get their line and audit row: refusals per sandbox, tool and code a
minute, every call per sandbox (and per sign-in address) a day, counted in a ledger
every process shares; the rest counted."""

from __future__ import annotations

import asyncio

from fetch_testkit import Clock

from app.errors import DatabaseUnavailable
from app.mcp.call_sampling import CallSampling, DailyAllowance, MemoryDays
from app.sampling import Unwritten


async def admitted(sampling: CallSampling, calls: int, *key: str, address: str = "") -> list[bool]:
    sandbox, tool, outcome = key
    return [await sampling.admit(sandbox, tool, outcome, address or None) for _ in range(calls)]


class CountingDays(MemoryDays):
    """The shared ledger, telling how often it is asked, each answer after a yield (as a
    round trip to the database would)."""

    def __init__(self) -> None:
        super().__init__()
        self.reservations = 0
        self.away = False

    async def reserve(self, owner: str, day: int, want: int, cap: int) -> int:
        self.reservations += 1
        await asyncio.sleep(0)
        if self.away:
            raise DatabaseUnavailable("connection refused")
        return await super().reserve(owner, day, want, cap)


async def test_refusals_are_bounded_per_sandbox_tool_and_code_but_ok_calls_are_not() -> None:
    clock = Clock()
    sampling = CallSampling(refusals_per_minute=2, rows_per_day=1_000, clock=clock)
    assert await admitted(sampling, 5, "m", "get", "NOT_FOUND") == [True] * 2 + [False] * 3
    assert await sampling.admit("m", "get", "BAD_INPUT")  # another code
    assert await sampling.admit("a", "get", "NOT_FOUND")  # another sandbox
    assert all(await admitted(sampling, 50, "m", "get", "ok"))
    t0, clock.now = clock.now, clock.now + 60
    assert sampling.ended() == [Unwritten(("m", "get", "NOT_FOUND"), 3, t0, t0 + 60)]


async def test_past_the_day_s_rows_every_call_is_counted_per_tool_and_outcome() -> None:
    clock = Clock()
    clock.now = 10 * 86_400.0  # the start of a UTC day
    sampling = CallSampling(refusals_per_minute=100, rows_per_day=3, clock=clock)
    assert await admitted(sampling, 5, "m", "status", "ok") == [True] * 3 + [False] * 2
    assert not await sampling.admit("m", "get", "NOT_FOUND")
    assert await sampling.admit("a", "status", "ok")  # another sandbox's day
    t0 = clock.now
    assert sorted(sampling.drain(), key=lambda u: u.key) == [
        Unwritten(("m", "get", "NOT_FOUND"), 1, t0, t0),
        Unwritten(("m", "status", "ok"), 2, t0, t0),
    ]
    clock.now += 86_400
    assert await sampling.admit("m", "status", "ok")  # a new day


async def test_two_processes_sharing_the_ledger_write_one_day_s_rows_between_them() -> None:
    """As ``serve --workers 2``: each process reserves blocks from the one count, so
    the sandbox's calls, spread over both, write the day's rows once, not twice."""
    clock, days = Clock(), MemoryDays()
    first, second = (
        CallSampling(100, rows_per_day=1_000, clock=clock, days=days) for _ in range(2)
    )
    written = 0
    for _ in range(1_200):
        written += await first.admit("m", "status", "ok")
        written += await second.admit("m", "status", "ok")
    assert written == 1_000
    assert await first.admit("other", "status", "ok")  # another sandbox's own day


async def test_rows_held_unspent_are_given_back_as_a_process_stops() -> None:
    clock, days = Clock(), MemoryDays()
    first = CallSampling(100, rows_per_day=1_000, clock=clock, days=days)
    assert await first.admit("m", "status", "ok")  # reserves a block of 10, spends 1
    await first.give_back()
    second = CallSampling(100, rows_per_day=1_000, clock=clock, days=days)
    assert sum(await admitted(second, 1_100, "m", "status", "ok")) == 999


async def test_one_address_s_sandboxes_share_its_day_and_another_address_has_its_own() -> None:
    clock = Clock()
    sampling = CallSampling(100, rows_per_day=10, clock=clock, rows_per_address_per_day=25)
    written = [
        sum(await admitted(sampling, 20, sandbox, "status", "ok", address="198.51.100.0/24"))
        for sandbox in ("m1", "m2", "m3", "m4")
    ]
    assert written == [10, 10, 5, 0]  # the address's 25, each sandbox at most its 10
    assert sum(await admitted(sampling, 20, "h", "status", "ok", address="203.0.113.7")) == 10
    # An address spent before the sandbox's own bound leaves the sandbox's rows unspent.
    assert sampling._sandboxes.has("s:m4", 0) is None


async def test_a_light_call_costs_no_round_trip_and_waiting_calls_share_one() -> None:
    days = CountingDays()
    sampling = CallSampling(100, rows_per_day=100_000, clock=Clock(), days=days)
    results = await asyncio.gather(*(sampling.admit("m", "status", "ok") for _ in range(500)))
    assert all(results)
    # One block of 1,000: every call at once waited for the same reservation.
    assert days.reservations == 1
    assert all(await admitted(sampling, 1_500, "m", "status", "ok"))
    assert days.reservations == 2


async def test_the_database_away_leaves_the_call_s_row_to_be_tried_not_counted() -> None:
    days = CountingDays()
    days.away = True
    sampling = CallSampling(100, rows_per_day=3, clock=Clock(), days=days)
    assert all(await admitted(sampling, 5, "m", "status", "ok"))
    days.away = False
    assert await admitted(sampling, 5, "m", "status", "ok") == [True] * 3 + [False] * 2


def test_a_block_is_a_hundredth_of_the_day_between_1_and_1000() -> None:
    days = MemoryDays()
    assert [DailyAllowance(days, n).block for n in (1, 50, 100_000, 10**7)] == [1, 1, 1_000, 1_000]
