"""Errors raised by the service layer (``app``), with stable codes for agents and operators.

Each package keeps its own base error (``jail.errors.JailError``,
``pool.errors.PoolError``, ``app.errors.ServiceError``); all carry ``code``,
``message`` and ``details``, and only the tool wrapper and the HTTP handlers
turn them into responses.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of the service's own errors.

    ``code`` is stable (UPPER_SNAKE) and meant for programs; ``message`` is one
    sentence a person or an agent can act on and never holds a host path or a
    secret; ``details`` carries structured fields (for example a queue position).
    """

    code = "SERVICE_ERROR"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, object] = details


class DatabaseUnavailable(ServiceError):
    code = "DATABASE_UNAVAILABLE"

    def __init__(self, reason: str) -> None:
        super().__init__(f"The database is unavailable ({reason}).", reason=reason)


class InvalidArgument(ServiceError):
    code = "INVALID_ARGUMENT"


class ConfigurationError(ServiceError):
    code = "CONFIGURATION_ERROR"


class LimitReached(ServiceError):
    """A per-sandbox limit (containers, concurrent jobs): the caller acts on it itself.

    ``limit`` names which limit, ``value`` is its value; the message says what to
    do (destroy an experiment, wait for a job to end).
    """

    code = "LIMIT_REACHED"

    def __init__(self, message: str, *, limit: str, value: int) -> None:
        super().__init__(message, limit=limit, value=value)


class TooManyCalls(ServiceError):
    """The sandbox already has its most tool calls in flight; the caller waits for one."""

    code = "TOO_MANY_CALLS"

    def __init__(self, limit: int, per: str = "sandbox") -> None:
        whose = (
            "This sandbox already has"
            if per == "sandbox"
            else "The sandboxes signed in from your address already have"
        )
        super().__init__(
            f"{whose} {limit} tool calls in flight, the most one {per} may have at once; "
            "wait for one of them to return, then call again.",
            limit=f"calls_per_{per}",
            value=limit,
        )
