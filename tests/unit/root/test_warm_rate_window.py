"""SANDBOX_MCP_WARM_RATE_WINDOW_S reaches the warm pool's sizing: the creates counted are
those of the last that many seconds (default a minute: tests/unit/runtime/warm)."""

from __future__ import annotations

import pytest

from app.root.runtime import build_warm_demand
from app.settings import load_settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("window_s", [10, 60])
def test_the_creates_count_for_the_window_set(
    monkeypatch: pytest.MonkeyPatch, window_s: int
) -> None:
    monkeypatch.setenv("SANDBOX_MCP_WARM_CONTAINERS", "2")
    monkeypatch.setenv("SANDBOX_MCP_WARM_RATE_WINDOW_S", str(window_s))
    clock = Clock()
    demand = build_warm_demand(
        load_settings().runtime,
        address_share_percent=100,
        holds_slot=lambda key: False,
        queued=lambda: 0,
        clock=clock,
    )
    for _ in range(window_s):  # one a second: 10 expected in the next 10 s
        demand.created()
        clock.now += 1
    assert demand.target() == 2 + 10
    clock.now += window_s - 2  # the last create is still within the window
    assert demand.target() > 2
    clock.now += 2  # and now none is
    assert demand.target() == 2
