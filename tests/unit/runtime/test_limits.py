"""Clamping experiment limits and command timeouts to the operator's ceilings."""

from __future__ import annotations

import math

import pytest

from app.errors import ConfigurationError, InvalidArgument
from app.runtime.backend import Limits
from app.runtime.limits import FLOORS, Ceilings, clamp_limits, clamp_timeout


def test_limits_inside_the_range_pass_unchanged_without_warnings() -> None:
    asked = Limits(cpus=1.5, memory_mb=2048, pids=512, tmp_mb=128)
    applied, warnings = clamp_limits(asked, Ceilings(), host_cpus=8)
    assert applied == asked
    assert warnings == ()


def test_each_limit_above_its_ceiling_is_clamped_with_a_warning() -> None:
    asked = Limits(cpus=6, memory_mb=20000, pids=100_000, tmp_mb=4096)
    applied, warnings = clamp_limits(asked, Ceilings(), host_cpus=None)
    assert applied == Limits(cpus=4, memory_mb=8192, pids=2048, tmp_mb=1024)
    assert warnings == (
        "cpus 6 is above the ceiling; clamped to 4",
        "memory_mb 20000 is above the ceiling; clamped to 8192",
        "pids 100000 is above the ceiling; clamped to 2048",
        "tmp_mb 4096 is above the ceiling; clamped to 1024",
    )


def test_each_limit_below_its_floor_is_raised_with_a_warning() -> None:
    asked = Limits(cpus=0.01, memory_mb=4, pids=1, tmp_mb=0)
    applied, warnings = clamp_limits(asked, Ceilings(), host_cpus=2)
    assert applied == FLOORS
    assert warnings == (
        "cpus 0.01 is below the minimum; raised to 0.1",
        "memory_mb 4 is below the minimum; raised to 128",
        "pids 1 is below the minimum; raised to 32",
        "tmp_mb 0 is below the minimum; raised to 16",
    )


def test_negative_values_are_raised_to_the_floor() -> None:
    applied, warnings = clamp_limits(Limits(cpus=-3, memory_mb=-1), Ceilings())
    assert (applied.cpus, applied.memory_mb) == (FLOORS.cpus, FLOORS.memory_mb)
    assert len(warnings) == 2


def test_cpus_are_also_capped_by_the_cpus_of_the_host() -> None:
    applied, warnings = clamp_limits(Limits(cpus=3), Ceilings(cpus=4), host_cpus=2)
    assert applied.cpus == 2
    assert warnings == ("cpus 3 is above the 2 CPUs of this host; clamped to 2",)


def test_a_request_above_the_ceiling_on_a_small_host_names_the_ceiling_and_the_host() -> None:
    applied, warnings = clamp_limits(Limits(cpus=16), Ceilings(cpus=4), host_cpus=2)
    assert applied.cpus == 2
    assert warnings == ("cpus 16 is above the 2 CPUs of this host; clamped to 2",)


def test_cpus_are_rounded_to_hundredths() -> None:
    applied, _ = clamp_limits(Limits(cpus=1.23456), Ceilings())
    assert applied.cpus == 1.23


def test_a_ceiling_below_a_floor_wins() -> None:
    applied, warnings = clamp_limits(Limits(memory_mb=1024, pids=8), Ceilings(memory_mb=64))
    assert applied.memory_mb == 64
    assert applied.pids == FLOORS.pids
    assert "memory_mb 1024 is above the ceiling; clamped to 64" in warnings


@pytest.mark.parametrize("field", ["cpus", "memory_mb", "pids", "tmp_mb"])
def test_nan_is_refused_not_clamped(field: str) -> None:
    asked = Limits(**{field: math.nan})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument) as caught:
        clamp_limits(asked, Ceilings())
    assert caught.value.details == {"field": field}


def test_infinity_is_clamped_to_the_ceiling() -> None:
    applied, warnings = clamp_limits(Limits(cpus=math.inf), Ceilings(cpus=2))
    assert applied.cpus == 2
    assert warnings == ("cpus inf is above the ceiling; clamped to 2",)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf])
def test_ceilings_must_be_positive_and_finite(bad: float) -> None:
    with pytest.raises(ConfigurationError):
        Ceilings(memory_mb=bad)  # type: ignore[arg-type]


def test_timeouts_are_clamped_to_the_wall_clock_ceiling_and_a_one_second_floor() -> None:
    assert clamp_timeout(60, 1800) == (60, None)
    assert clamp_timeout(7200, 1800) == (
        1800,
        "timeout_s 7200 is above the ceiling; clamped to 1800",
    )
    assert clamp_timeout(0, 1800) == (1.0, "timeout_s 0 is below the minimum; raised to 1")
    with pytest.raises(InvalidArgument):
        clamp_timeout(math.nan, 1800)
