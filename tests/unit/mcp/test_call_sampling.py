"""Which calls get their line and audit row: refusals per sandbox, tool and code a
minute, every call per sandbox a day; the rest counted."""

from __future__ import annotations

from fetch_testkit import Clock

from app.mcp.call_sampling import CallSampling
from app.sampling import Unwritten


def test_refusals_are_bounded_per_sandbox_tool_and_code_but_ok_calls_are_not() -> None:
    clock = Clock()
    sampling = CallSampling(refusals_per_minute=2, rows_per_day=1_000, clock=clock)
    assert [sampling.admit("m", "get", "NOT_FOUND") for _ in range(5)] == [True] * 2 + [False] * 3
    assert sampling.admit("m", "get", "BAD_INPUT")  # another code
    assert sampling.admit("a", "get", "NOT_FOUND")  # another sandbox
    assert all(sampling.admit("m", "get", "ok") for _ in range(50))
    t0, clock.now = clock.now, clock.now + 60
    assert sampling.ended() == [Unwritten(("m", "get", "NOT_FOUND"), 3, t0, t0 + 60)]


def test_past_the_day_s_rows_every_call_is_counted_per_tool_and_outcome() -> None:
    clock = Clock()
    sampling = CallSampling(refusals_per_minute=100, rows_per_day=3, clock=clock)
    assert [sampling.admit("m", "status", "ok") for _ in range(5)] == [True] * 3 + [False] * 2
    assert not sampling.admit("m", "get", "NOT_FOUND")
    assert sampling.admit("a", "status", "ok")  # another sandbox's day
    t0 = clock.now
    assert sorted(sampling.drain(), key=lambda u: u.key) == [
        Unwritten(("m", "get", "NOT_FOUND"), 1, t0, t0),
        Unwritten(("m", "status", "ok"), 2, t0, t0),
    ]
    clock.now += 86_400
    assert sampling.admit("m", "status", "ok")  # a new day
