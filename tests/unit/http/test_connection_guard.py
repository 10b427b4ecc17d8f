"""The descriptor arithmetic of the slowloris guard (the behaviour is tested over HTTP)."""

from __future__ import annotations

import resource
from typing import cast

from fetch_testkit import Clock
from structlog.testing import capture_logs

from app.http.connection_guard import (
    RESERVED_DESCRIPTORS,
    ConnectionGuard,
    GuardedH11Protocol,
    connection_cap,
    raise_descriptor_limit,
)


def test_the_cap_leaves_the_reserve_free() -> None:
    assert connection_cap(4096, 1024) == 1024 - RESERVED_DESCRIPTORS
    assert connection_cap(100, 20_000) == 100
    assert connection_cap(4096, 300) == 16  # never zero: the server must still answer


def test_raise_descriptor_limit_reaches_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, hard), hard))
        assert raise_descriptor_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connections_refused_at_the_cap_are_written_once_a_minute_then_counted() -> None:
    """Anyone may open connections past the cap, before signing in: a warning each
    would be a line per connection in the log every tenant shares (issue 23)."""
    clock = Clock()
    guard = ConnectionGuard(max_connections=0, header_timeout_s=10, body_timeout_s=60, clock=clock)
    with capture_logs() as logged:
        for _ in range(500):
            assert not guard.admit(cast(GuardedH11Protocol, object()))
        clock.now += 61
        assert not guard.admit(cast(GuardedH11Protocol, object()))
    refused = [line for line in logged if line["event"] == "http.connection_refused"]
    assert [line.get("repeats_not_written") for line in refused] == [None, 499, None]
