"""The one mechanism that bounds repeats: the first few of a window written, the rest
counted and handed over once the window is over."""

from __future__ import annotations

from typing import Any

from fetch_testkit import Clock

from app.sampling import ThrottledLog, Unwritten, WindowSampler

T0 = Clock().now


def test_the_first_of_each_window_are_admitted_the_rest_counted() -> None:
    clock = Clock()
    sampler: WindowSampler[str] = WindowSampler(3, 60, clock)
    assert [sampler.admit("a") for _ in range(10)] == [True] * 3 + [False] * 7
    assert sampler.admit("b")  # another key has a window of its own
    clock.now += 59
    assert sampler.ended() == []
    assert not sampler.admit("a")
    clock.now += 6  # windows are looked over every few seconds, not on every call
    assert sampler.ended() == [Unwritten("a", 8, T0, T0 + 60)]
    assert sampler.ended() == []  # handed over once
    assert [sampler.admit("a") for _ in range(4)] == [True] * 3 + [False]


def test_a_window_over_is_closed_by_the_next_repeat_of_its_key() -> None:
    clock = Clock()
    sampler: WindowSampler[str] = WindowSampler(1, 60, clock)
    assert [sampler.admit("a") for _ in range(5)] == [True] + [False] * 4
    clock.now += 61
    assert sampler.admit("a")  # a new window
    assert sampler.ended() == [Unwritten("a", 4, T0, T0 + 60)]


def test_drain_hands_over_every_count_and_forgets_every_window() -> None:
    clock = Clock()
    sampler: WindowSampler[str] = WindowSampler(0, 60, clock)
    for key in "aab":
        assert not sampler.admit(key)
    clock.now += 10
    assert sorted(sampler.drain(), key=lambda u: u.key) == [
        Unwritten("a", 2, T0, T0 + 10),
        Unwritten("b", 1, T0, T0 + 10),
    ]
    assert sampler.drain() == []
    assert sampler._windows == {}


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append(("warning", event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append(("info", event, fields))


def test_a_throttled_warning_is_written_once_a_window_then_its_count() -> None:
    clock, recorder = Clock(), Recorder()
    throttled = ThrottledLog(recorder, 60, clock)
    for n in range(20):
        throttled.warning("warm.create_refused", slot=f"slot-{n}")
    throttled.info("other.event", x=1)
    assert recorder.lines == [
        ("warning", "warm.create_refused", {"slot": "slot-0"}),
        ("info", "other.event", {"x": 1}),
    ]
    clock.now += 61
    throttled.warning("warm.create_refused", slot="slot-20")
    assert recorder.lines[2:] == [
        ("warning", "warm.create_refused", {"repeats_not_written": 19, "in_s": 60}),
        ("warning", "warm.create_refused", {"slot": "slot-20"}),
    ]
