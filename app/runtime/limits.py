"""Clamping what an experiment asks for to the operator's ceilings (and sane floors).

A request outside the range is never refused: it is moved into it and the move
is reported as a warning the agent sees, so a too-greedy request still runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.errors import ConfigurationError, InvalidArgument
from app.runtime.backend import Limits

# Below these a container cannot do useful work: tini + the keep-alive + one
# command's supervisor already take 4 processes; Python or Node need ~100 MB.
FLOORS = Limits(cpus=0.1, memory_mb=128, pids=32, tmp_mb=16)
MIN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Ceilings:
    """The most one experiment may get (operator configuration)."""

    cpus: float = 4.0
    memory_mb: int = 8192
    pids: int = 2048
    tmp_mb: int = 1024
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        for name in ("cpus", "memory_mb", "pids", "tmp_mb", "timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigurationError(f"The {name} ceiling must be a positive number.")


def _num(value: float) -> str:
    return f"{value:g}"


def _check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise InvalidArgument(f"{name} must be a number.", field=name)
    return float(value)


def clamp_limits(
    requested: Limits, ceilings: Ceilings, host_cpus: float | None = None
) -> tuple[Limits, tuple[str, ...]]:
    """Move each limit into [floor, ceiling]; return the limits applied and the warnings.

    ``host_cpus`` (the engine's CPU count) lowers the CPU ceiling further: Docker
    refuses a CPU quota larger than the machine.
    """
    warnings: list[str] = []

    def clamp(name: str, value: float, floor: float, ceiling: float, above: str) -> float:
        floor = min(floor, ceiling)
        if value > ceiling:
            warnings.append(f"{name} {_num(value)} is above {above}; clamped to {_num(ceiling)}")
            return ceiling
        if value < floor:
            warnings.append(f"{name} {_num(value)} is below the minimum; raised to {_num(floor)}")
            return floor
        return value

    def whole(name: str) -> int:
        """A whole-number limit against its floor and the operator's ceiling."""
        value = _check_number(name, getattr(requested, name))
        floor, ceiling = getattr(FLOORS, name), getattr(ceilings, name)
        return int(clamp(name, value, floor, ceiling, "the ceiling"))

    cpus = _check_number("cpus", requested.cpus)
    cpu_ceiling, cpu_above = float(ceilings.cpus), "the ceiling"
    if host_cpus is not None and 0 < host_cpus < cpu_ceiling and cpus > host_cpus:
        cpu_ceiling, cpu_above = float(host_cpus), f"the {_num(host_cpus)} CPUs of this host"
    applied = Limits(
        cpus=round(clamp("cpus", cpus, FLOORS.cpus, cpu_ceiling, cpu_above), 2),
        memory_mb=whole("memory_mb"),
        pids=whole("pids"),
        tmp_mb=whole("tmp_mb"),
    )
    return applied, tuple(warnings)


def clamp_timeout(timeout_s: float, ceiling_s: float) -> tuple[float, str | None]:
    """A command's wall clock, moved into [1 s, ceiling]; the warning if it moved."""
    value = _check_number("timeout_s", timeout_s)
    if value > ceiling_s:
        return ceiling_s, (
            f"timeout_s {_num(value)} is above the ceiling; clamped to {_num(ceiling_s)}"
        )
    if value < MIN_TIMEOUT_S:
        return MIN_TIMEOUT_S, (
            f"timeout_s {_num(value)} is below the minimum; raised to {_num(MIN_TIMEOUT_S)}"
        )
    return value, None
