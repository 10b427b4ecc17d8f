"""Errors raised by the pool package.

Every failure leaves ``pool/`` as a :class:`PoolError` carrying a stable ``code``
(for handlers, metrics and tests to branch on), a one-sentence ``message`` an
operator or agent can act on, and ``details`` for logs. Lower-level errors
(``OSError``, failed ``zfs`` commands) are translated at the boundary with
``raise PoolError(...) from exc``; only ``app/`` maps them to HTTP/MCP errors.

Add new codes to :data:`PoolErrorCode`; never rename an existing one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

PoolErrorCode = Literal[
    # slot storage
    "SLOT_MISSING",
    "SLOT_RESET_FAILED",
    "SLOT_STORE_CLOSED",
    # zfs
    "ZFS_UNAVAILABLE",
    "ZFS_COMMAND_FAILED",
    "ZFS_POOL_NOT_FOUND",
    "ZFS_DATASET_NOT_FOUND",
    "ZFS_DATASET_BUSY",
    "ZFS_BAD_MOUNTPOINT",
    # provisioning input
    "INVALID_DATASET",
    "INVALID_QUOTA",
    "INVALID_SLOT_COUNT",
    "UNKNOWN_OWNER",
    "PROVISION_FAILED",
    "MOUNT_FLAGS_FAILED",
    # leases and queue
    "SANDBOX_QUEUED",
    "SLOT_CONFLICT",
]


class PoolError(Exception):
    """Base (and, so far, only) error of the pool package.

    Attributes:
        code: Stable UPPER_SNAKE identifier, one of :data:`PoolErrorCode`.
        message: One sentence saying what went wrong and what to do about it.
        details: Extra facts for logs (slot, command, stderr summary, ...).
    """

    def __init__(
        self,
        code: PoolErrorCode,
        message: str,
        details: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.code: PoolErrorCode = code
        self.message = message
        self.details: dict[str, object] = dict(details or {})

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"PoolError({self.code!r}, {self.message!r})"


class StaleSlot(PoolError):
    """A slot write found the slot no longer as the writer last saw it (never overwritten)."""

    def __init__(self, index: int) -> None:
        super().__init__(
            "SLOT_CONFLICT",
            "The sandbox pool changed under this call; call again.",
            {"slot": index},
        )
