"""The experiment state machine: every transition is explicit, validated and recorded.

CREATING -> READY -> RUNNING -> READY | COMPLETED | FAILED | TIMEOUT | CANCELLED
-> RUNNING | DESTROYED; CREATING -> FAILED. An illegal transition is an error,
never a silently corrupted record.
"""

from __future__ import annotations

from enum import StrEnum

from app.experiments.core.errors import InvalidTransition


class State(StrEnum):
    CREATING = "CREATING"
    READY = "READY"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    DESTROYED = "DESTROYED"


_SETTLED = {State.COMPLETED, State.FAILED, State.TIMEOUT, State.CANCELLED}

ALLOWED: dict[State, frozenset[State]] = {
    State.CREATING: frozenset({State.READY, State.FAILED, State.DESTROYED}),
    State.READY: frozenset({State.RUNNING, State.DESTROYED}),
    State.RUNNING: frozenset({State.READY, *_SETTLED}),
    **{settled: frozenset({State.RUNNING, State.DESTROYED}) for settled in _SETTLED},
    State.DESTROYED: frozenset(),
}

# States in which a command may start.
RUNNABLE = frozenset({State.READY, State.RUNNING, *_SETTLED})


def check_transition(current: State, target: State) -> None:
    """Raises InvalidTransition unless ``current -> target`` is in the machine."""
    if target not in ALLOWED[current]:
        raise InvalidTransition(
            f"The experiment is {current.value}; it cannot become {target.value}.",
            state=current.value,
            wanted=target.value,
        )


def outcome_state(exit_code: int | None, *, timed_out: bool, cancelled: bool) -> State:
    if cancelled:
        return State.CANCELLED
    if timed_out:
        return State.TIMEOUT
    return State.COMPLETED if exit_code == 0 else State.FAILED
