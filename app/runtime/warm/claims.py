"""Which slot holds a warm container and whose it is, as every process sees it.

Each server process keeps warm containers of its own (``app.runtime.warm.pool``) in
free slots that all of them share. A claim per slot keeps them apart: a process
places a warm container only in a slot it claimed first (a second claim is
refused), and whoever deletes the claim (to hand the container over, or to remove
it) is the only one who may touch the container; a release that finds the claim
gone means another process did, and the caller leaves the container alone.

``LocalWarmClaims`` keeps them in memory for one process; with several, the
database keeps them (``app.storage.slots.warm_store.SqlWarmClaimLedger``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class WarmClaim:
    slot: str  # the slot root's name
    process_id: str
    root: str  # <slot root>/.warm-<token>
    container_id: str | None = None  # None while it is being created


class WarmClaimLedger(Protocol):
    async def place(self, slot: str, process_id: str, root: str, at: float) -> bool:
        """Claim ``slot`` for a warm container at ``root``; False if it is claimed."""
        ...

    async def started(self, claim: WarmClaim, container_id: str) -> bool:
        """Record its container; False if the claim is gone meanwhile (taken or removed
        by another process: the caller removes the container it just made)."""
        ...

    async def release(self, claim: WarmClaim) -> bool:
        """Delete exactly this claim; False if another process already did."""
        ...

    async def of_slot(self, slot: str) -> WarmClaim | None: ...

    async def all(self) -> list[WarmClaim]: ...


class LocalWarmClaims:
    """The claims of one process, in its memory."""

    def __init__(self) -> None:
        self._claims: dict[str, WarmClaim] = {}

    async def place(self, slot: str, process_id: str, root: str, at: float) -> bool:
        if slot in self._claims:
            return False
        self._claims[slot] = WarmClaim(slot, process_id, root)
        return True

    async def started(self, claim: WarmClaim, container_id: str) -> bool:
        held = self._claims.get(claim.slot)
        if held is None or held.root != claim.root:
            return False
        self._claims[claim.slot] = WarmClaim(claim.slot, claim.process_id, claim.root, container_id)
        return True

    async def release(self, claim: WarmClaim) -> bool:
        held = self._claims.get(claim.slot)
        if held is None or held.root != claim.root:
            return False
        del self._claims[claim.slot]
        return True

    async def of_slot(self, slot: str) -> WarmClaim | None:
        return self._claims.get(slot)

    async def all(self) -> list[WarmClaim]:
        return list(self._claims.values())
