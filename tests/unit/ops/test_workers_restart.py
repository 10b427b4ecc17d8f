"""``serve --workers N``: a child that dies is restarted after a pause that doubles
while it keeps dying soon after starting, up to a cap, and starts over once a child
has stayed up. Real child processes that crash on start-up; the supervisor's clock is
the test's, and each step waits for the real child's exit, not for wall-clock time."""

from __future__ import annotations

import re
import signal
import socket
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from app.ops.workers import RestartPolicy, Supervisor

# Dies at start-up (exit 3) unless the marker file exists; then serves until killed.
CHILD = (
    "import pathlib, sys, time\n"
    "if not pathlib.Path(sys.argv[1]).exists(): sys.exit(3)\n"
    "time.sleep(600)\n"
)
POLICY = RestartPolicy(first_s=1, cap_s=8, stable_s=30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        yield listening


def supervisor(sock: socket.socket, marker: Path, clock: Clock) -> Supervisor:
    return Supervisor(
        sock, 1, [sys.executable, "-c", CHILD, str(marker)], policy=POLICY, clock=clock
    )


def deaths(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == "workers.died"]


def test_a_child_that_dies_at_start_up_is_restarted_ever_later_up_to_the_cap(
    sock: socket.socket, tmp_path: Path
) -> None:
    clock = Clock()
    workers = supervisor(sock, tmp_path / "healthy", clock)
    with capture_logs() as logs:
        workers.start_all()
        for pause in (1, 2, 4, 8, 8, 8):
            child = workers.children[0]
            assert child.wait(timeout=30) == 3  # the real child crashed at start-up
            workers.tick()
            died = deaths(logs)[-1]
            assert (died["restart_in_s"], died["code"]) == (pause, 3)
            clock.now += pause - 0.5
            workers.tick()
            assert workers.children[0] is child, "restarted before its pause was over"
            clock.now += 0.5
            workers.tick()
            assert workers.children[0] is not child
    assert [d["deaths_in_a_row"] for d in deaths(logs)] == [1, 2, 3, 4, 5, 6]
    # Once at the cap, the log says it is crash-looping and that it keeps trying.
    looping = [entry for entry in logs if entry["event"] == "workers.crash_looping"]
    assert len(looping) == 3
    assert looping[0]["log_level"] == "error"
    assert "restarted every 8 s until it stays up" in str(looping[0]["message"])
    workers.children[0].wait(timeout=30)


def test_a_child_that_stayed_up_is_restarted_after_the_first_pause_again(
    sock: socket.socket, tmp_path: Path
) -> None:
    clock = Clock()
    marker = tmp_path / "healthy"
    workers = supervisor(sock, marker, clock)
    with capture_logs() as logs:
        workers.start_all()
        for pause in (1, 2, 4):
            workers.children[0].wait(timeout=30)
            workers.tick()
            clock.now += pause
            workers.tick()
        child = workers.children[0]
        assert child.wait(timeout=30) == 3
        marker.touch()  # the cause went away: the next child stays up
        workers.tick()
        assert deaths(logs)[-1]["restart_in_s"] == 8
        clock.now += 8
        workers.tick()
        healthy = workers.children[0]
        assert healthy is not child
        clock.now += POLICY.stable_s  # it served long enough to count as healthy
        workers.tick()
        assert healthy.poll() is None
        healthy.send_signal(signal.SIGKILL)
        healthy.wait(timeout=30)
        workers.tick()
        assert (deaths(logs)[-1]["restart_in_s"], deaths(logs)[-1]["deaths_in_a_row"]) == (1, 1)
        clock.now += 1
        workers.tick()
        assert workers.children[0] is not healthy
        workers.children[0].kill()
        workers.children[0].wait(timeout=30)


def test_no_child_is_started_once_the_supervisor_is_stopping(
    sock: socket.socket, tmp_path: Path
) -> None:
    clock = Clock()
    workers = supervisor(sock, tmp_path / "healthy", clock)
    workers.start_all()
    child = workers.children[0]
    child.wait(timeout=30)
    workers.tick()  # waits out its pause
    workers._stop(signal.SIGTERM, None)
    clock.now += 60
    workers.tick()
    assert workers.children[0] is child


SECONDS = {"second": 1, "minute": 60, "hour": 3600}


def documented_schedule() -> tuple[list[float], float, float]:
    """docs/several-processes.md's promise: the first pauses, the cap, and the uptime
    after which the count starts over."""
    text = " ".join(
        (Path(__file__).parents[3] / "docs" / "several-processes.md").read_text().split()
    )
    steps = re.search(r"restarted after (\d+) s, then ([\d, ]+), \.\.\. up to once an? (\w+)", text)
    reset = re.search(r"one that served an? (\w+) starts the count over", text)
    assert steps, "docs/several-processes.md no longer states the restart pauses"
    assert reset, "docs/several-processes.md no longer states when the count starts over"
    first = [float(steps.group(1)), *(float(n) for n in steps.group(2).split(", "))]
    return first, float(SECONDS[steps.group(3)]), float(SECONDS[reset.group(1)])


def test_the_default_schedule_is_the_documented_one(sock: socket.socket, tmp_path: Path) -> None:
    """The supervisor as shipped (no policy given): a child dying at start-up is started
    again after the documented pauses, doubling to the cap; one that served the
    documented time starts over at the first pause."""
    first, cap, stable = documented_schedule()
    clock = Clock()
    marker = tmp_path / "healthy"
    workers = Supervisor(sock, 1, [sys.executable, "-c", CHILD, str(marker)], clock=clock)
    expected = [*first]
    while expected[-1] * 2 < cap:
        expected.append(expected[-1] * 2)
    expected += [cap, cap]
    with capture_logs() as logs:
        workers.start_all()
        for n, pause in enumerate(expected):
            child = workers.children[0]
            assert child.wait(timeout=30) == 3
            workers.tick()
            assert deaths(logs)[-1]["restart_in_s"] == pause, [
                d["restart_in_s"] for d in deaths(logs)
            ]
            if n == len(expected) - 1:
                marker.touch()  # the next child stays up
            clock.now += pause
            workers.tick()
            assert workers.children[0] is not child
        healthy = workers.children[0]
        clock.now += stable - 1
        workers.tick()
        assert healthy.poll() is None
        healthy.send_signal(signal.SIGKILL)
        healthy.wait(timeout=30)
        workers.tick()
        assert deaths(logs)[-1]["restart_in_s"] == expected[-1], "reset before the stable time"
        clock.now += expected[-1]
        workers.tick()
        steady = workers.children[0]
        clock.now += stable
        workers.tick()
        steady.send_signal(signal.SIGKILL)
        steady.wait(timeout=30)
        workers.tick()
        assert deaths(logs)[-1]["restart_in_s"] == first[0], "no reset after the stable time"
        clock.now += first[0]
        workers.tick()
        workers.children[0].kill()
        workers.children[0].wait(timeout=30)
    print("pauses:", [d["restart_in_s"] for d in deaths(logs)])
