"""The slot storage seam: a fixed set of pre-created, resettable folders.

A *slot* is where one sandbox keeps its files. Slots are created once by
provisioning (``pool/provision.py``, the only step that needs admin rights) and
then only ever emptied, never created or destroyed, by the running server.
Implementations: ``pool/slots_zfs.py`` (a dataset per slot, emptied by
``zfs rollback``) and ``pool/slots_dir.py`` (plain folders, emptied by
rename-then-delete; the embedded default). Leases, the queue and the watchdog
are built on top of this seam and never touch the filesystem themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

SLOT_PREFIX = "slot-"


def name_of(index: int) -> str:
    """Return the stable name of slot ``index``: ``slot-000`` ... ``slot-999``, ``slot-1000``.

    Three digits at least; a pool larger than 1000 simply gets wider names for
    the high indices, so existing names never change when a pool grows.
    """
    if index < 0:
        raise ValueError(f"slot index must be >= 0, got {index}")
    return f"{SLOT_PREFIX}{index:03d}"


@dataclass(frozen=True)
class Slot:
    """One slot: its index in the pool, its name and the folder the sandbox uses."""

    index: int
    name: str
    root: Path


class SlotsRoot(Protocol):
    """Where slots live: all a container runtime needs to know of the storage."""

    @property
    def base(self) -> Path:
        """The folder every slot lies under (a workspace outside it is never mounted).

        Raises:
            PoolError: ``SLOT_STORE_CLOSED`` before the store is opened.
        """
        ...


@dataclass(frozen=True)
class SlotsAt:
    """A fixed slots root, for a runtime used without a slot store (tools, tests)."""

    base: Path


class SlotStore(SlotsRoot, Protocol):
    """Storage for a fixed pool of slots, ``slot-000`` up to ``size - 1``.

    Built without I/O by the composition root, opened once in the lifespan.
    """

    async def open(self) -> None:
        """Get ready to serve: learn where the slots live, sweep what a crash left.

        Raises:
            PoolError: the storage cannot be reached (``ZFS_UNAVAILABLE``,
                ``ZFS_DATASET_NOT_FOUND``, ``ZFS_BAD_MOUNTPOINT``).
        """
        ...

    async def missing(self, size: int) -> list[str]:
        """Check that slots ``0 .. size-1`` exist and are usable.

        Called once at server start; a non-empty answer means the server must
        refuse to start and tell the operator to run ``sandbox-mcp provision``.
        The reason for each unusable slot is logged (event ``slot.unusable``).

        Args:
            size: Number of slots the server is configured to use.

        Returns:
            Names of the slots that are absent or unusable, in index order;
            empty when the whole pool is ready.

        Raises:
            PoolError: The storage itself cannot be inspected (e.g.
                ``ZFS_UNAVAILABLE``).
        """
        ...

    def slot(self, index: int) -> Slot:
        """Describe slot ``index`` without any I/O.

        The root path follows the naming convention (checked by
        :meth:`missing`), so this is cheap enough to call on every tool call.

        Args:
            index: 0-based slot number.

        Returns:
            The :class:`Slot`.

        Raises:
            ValueError: ``index`` is negative.
        """
        ...

    async def reset(self, slot: Slot) -> None:
        """Empty a slot, whatever it holds.

        When this returns, ``slot.root`` exists, is empty and is seen as empty
        by the caller. Aim: well under 100 ms for any content (the cost of
        deleting a large tree, if any, is paid in the background). Callers
        must stop every container using the slot first.

        Args:
            slot: A slot of this store.

        Raises:
            PoolError: ``SLOT_MISSING`` if the slot's storage is gone,
                ``SLOT_RESET_FAILED`` / ``ZFS_*`` if it cannot be emptied,
                ``SLOT_STORE_CLOSED`` after :meth:`close`.
        """
        ...

    async def close(self) -> None:
        """Release the store: wait (bounded) for background deletions to finish.

        Deletions still running at the deadline are abandoned and their
        leftovers cleaned at the next start.
        """
        ...
