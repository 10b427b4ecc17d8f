"""The sign-in path's refusal warnings: the first few of each address, network and
minute written, the rest counted and told in one line (issue 23)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fetch_testkit import Clock

from auth.log_sampling import OTHERS, RefusalLog
from auth.log_sampling import refusals as the_server_s

EVENT = "oauth.client_document_refused"


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    def written(self) -> list[tuple[str, dict[str, Any]]]:
        return [line for line in self.lines if "repeats_not_written" not in line[1]]

    def summaries(self) -> list[dict[str, Any]]:
        return [fields for _, fields in self.lines if "repeats_not_written" in fields]


def sampled(clock: Clock, recorder: Recorder, **bounds: int) -> RefusalLog:
    return RefusalLog(recorder, per_address=3, per_network=5, in_all=12, clock=clock, **bounds)


def test_one_address_writes_its_few_lines_a_minute_then_one_count() -> None:
    clock, recorder = Clock(), Recorder()
    refusals = sampled(clock, recorder)
    for n in range(100):
        refusals.warning(EVENT, "203.0.113.7", host=f"10.0.0.{n}")
    assert recorder.written() == [(EVENT, {"host": f"10.0.0.{n}"}) for n in range(3)]
    clock.now += 59
    refusals.flush()
    assert recorder.summaries() == [], "the minute is not over"
    clock.now += 1
    refusals.flush()
    assert recorder.summaries() == [{"repeats_not_written": 97, "in_s": 60, "addresses": 1}]
    refusals.flush()
    assert len(recorder.summaries()) == 1, "told once"
    refusals.warning(EVENT, "203.0.113.7", host="again")
    assert recorder.lines[-1] == (EVENT, {"host": "again"}), "a new minute writes again"


def test_a_network_and_everyone_together_are_bounded_too() -> None:
    clock, recorder = Clock(), Recorder()
    refusals = sampled(clock, recorder)
    # 8 addresses of one /24: 5 lines for the network, not 8 * 3.
    for n in range(80):
        refusals.warning(EVENT, f"198.51.100.{n % 8}")
    assert len(recorder.written()) == 5
    # 40 more networks: 12 lines in all for the minute.
    for n in range(400):
        refusals.warning(EVENT, f"192.0.{n % 40}.1")
    assert len(recorder.written()) == 12
    refusals.drain()
    assert recorder.summaries() == [{"repeats_not_written": 468, "in_s": 0, "addresses": 48}]


def test_each_event_has_its_own_lines() -> None:
    clock, recorder = Clock(), Recorder()
    refusals = sampled(clock, recorder)
    for _ in range(10):
        refusals.warning(EVENT, "203.0.113.7")
        refusals.warning("oauth.register_rate_limited", "203.0.113.7")
    assert [event for event, _ in recorder.written()].count(EVENT) == 3
    assert [event for event, _ in recorder.written()].count("oauth.register_rate_limited") == 3
    clock.now += 60
    refusals.warning(EVENT, "203.0.113.7")  # the next line tells the minutes over first
    assert recorder.lines[-3:] == [
        (EVENT, {"repeats_not_written": 7, "in_s": 60, "addresses": 1}),
        ("oauth.register_rate_limited", {"repeats_not_written": 7, "in_s": 60, "addresses": 1}),
        (EVENT, {}),
    ]


def test_memory_is_bounded_however_many_addresses_flood() -> None:
    clock, recorder = Clock(), Recorder()
    refusals = sampled(clock, recorder, max_keys=100)
    for n in range(20_000):
        refusals.warning(EVENT, f"2001:db8:{n // 256:x}:{n % 256:x}::1")
    minute = refusals._minutes[EVENT]
    assert len(minute.by_address) <= 12
    assert len(minute.by_network) <= 12
    assert len(minute.counted_from) == 101
    assert OTHERS in minute.counted_from
    refusals.drain()
    assert recorder.summaries() == [
        {"repeats_not_written": 20_000 - 12, "in_s": 0, "addresses": 101}
    ]


def test_no_address_counts_as_the_others() -> None:
    clock, recorder = Clock(), Recorder()
    refusals = sampled(clock, recorder)
    for _ in range(10):
        refusals.warning(EVENT, None)
        refusals.warning(EVENT, "")
    assert len(recorder.written()) == 3


def test_the_limits_page_states_the_bounds_the_server_runs_with() -> None:
    row = next(
        line
        for line in (Path(__file__).parents[3] / "docs" / "limits.md").read_text().splitlines()
        if line.startswith("| Sign-in refusal warnings")
    )
    match = re.search(
        r"the first (\d+) of a sign-in address, (\d+) of a network \(/24, /48\), (\d+) in all; "
        r"at most ([\d,]+) addresses",
        row,
    )
    assert match, "docs/limits.md no longer states the bounds where this test reads them"
    stated = tuple(int(value.replace(",", "")) for value in match.groups())
    assert stated == (
        the_server_s.per_address,
        the_server_s.per_network,
        the_server_s.in_all,
        the_server_s.max_keys,
    )
    assert the_server_s.window_s == 60
