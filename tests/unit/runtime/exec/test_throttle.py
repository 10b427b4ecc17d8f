"""The leaky bucket the executor's stream is read through (app.runtime.exec.throttle)."""

from __future__ import annotations

from app.runtime.exec.throttle import Throttle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_seconds_worth_passes_then_the_rest_waits_its_share() -> None:
    clock = Clock()
    throttle = Throttle(100, clock=clock)
    assert throttle.take(100) == 0  # the burst
    assert throttle.take(50) == 0.5  # 50 more: half a second
    clock.now += 0.5  # the wait it was told
    assert throttle.take(0) == 0
    assert throttle.take(100) == 1.0


def test_what_was_used_drains_at_the_rate() -> None:
    clock = Clock()
    throttle = Throttle(10, clock=clock)
    assert throttle.take(30) == 2.0
    clock.now += 10  # long idle: empty, not negative
    assert throttle.take(10) == 0
    assert throttle.take(1) == 0.1
