"""The proxy's connection bounds, sized from Squid's descriptors (egress_bounds)."""

from __future__ import annotations

from app.egress.bounds import PER_CONNECTION, RESERVE, mark, size_bounds


def test_every_slot_s_share_together_never_exceeds_what_squid_serves() -> None:
    for descriptors, slots, shares in ((65_536, 500, 4), (20_000, 500, 4), (2_048, 16, 2)):
        bounds = size_bounds(descriptors, slots, shares)
        assert bounds.connections == (descriptors - RESERVE) // PER_CONNECTION
        assert bounds.per_sandbox * slots <= bounds.connections
        assert bounds.per_address == shares * bounds.per_sandbox
    assert size_bounds(65_536, 500, 4).per_sandbox == 65  # the documented arithmetic
    assert size_bounds(1_024, 10_000, 4).per_sandbox == 1  # never none at all


def test_marks_are_stable_and_never_zero() -> None:
    assert mark("sbx-a") == mark("sbx-a") != mark("sbx-b")
    assert all(mark(f"sbx-{i}") != 0 for i in range(1000))
