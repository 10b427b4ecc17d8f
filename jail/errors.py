"""Errors raised by the jail: a stable code plus one sentence an agent can act on.

A message is built only from sandbox-relative paths and environment variable
names. The text of an ``OSError`` (which can carry a host path) is never copied
into a message; only its errno decides the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

ErrorCode = Literal[
    # Paths and links
    "PATH_OUTSIDE_SANDBOX",
    "SYMLINK_ESCAPE",
    "SYMLINK_UNRESOLVABLE",
    "INVALID_PATH",
    "NOT_FOUND",
    "NOT_A_REGULAR_FILE",
    "NOT_A_DIRECTORY",
    "IS_A_DIRECTORY",
    "ALREADY_EXISTS",
    "DIRECTORY_NOT_EMPTY",
    "TOO_LARGE",
    "TOO_MANY_ENTRIES",
    "PERMISSION_DENIED",
    "NO_SPACE",
    "PATH_BUSY",
    "IO_ERROR",
    "JAIL_CLOSED",
    # Per-call context and edits
    "STALE_EDIT",
    "EDIT_WITHOUT_READ",
    # Snapshot copy
    "PROJECT_PATH_REFUSED",
    "INVALID_EXCLUDE_PATTERN",
    # Environment policy
    "ENV_NAME_REFUSED",
    "ENV_INVALID",
]


class JailError(Exception):
    """A refused or failed jail operation.

    Attributes:
        code: stable UPPER_SNAKE identifier, safe to branch on and to show.
        message: one sentence telling the agent what to do; ``str(err)`` returns it.
        details: machine-readable extras, e.g. the sandbox-relative ``path``.
    """

    # A plain class rather than a frozen dataclass: contextlib and asyncio assign
    # ``__traceback__`` on exceptions, which a frozen dataclass would refuse.
    def __init__(
        self,
        code: ErrorCode,
        message: str,
        details: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.details: dict[str, object] = dict(details or {})

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"JailError({self.code!r}, {self.message!r})"

    def __reduce__(self) -> tuple[type[JailError], tuple[ErrorCode, str, dict[str, object]]]:
        return (type(self), (self.code, self.message, self.details))
