"""The descriptor arithmetic of the slowloris guard (the behaviour is tested over HTTP)."""

from __future__ import annotations

import resource

from app.http.connection_guard import RESERVED_DESCRIPTORS, connection_cap, raise_descriptor_limit


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
