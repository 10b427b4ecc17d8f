"""Warm containers' slot claims on the real databases (SQLite and PostgreSQL), and the
in-memory ledger of one process held to the same rules."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.runtime.warm.claims import LocalWarmClaims, WarmClaim, WarmClaimLedger
from app.storage.slots.warm_store import SqlWarmClaimLedger

pytestmark = pytest.mark.integration


@pytest.fixture(params=["database", "memory"])
def ledger(request: pytest.FixtureRequest, engine: AsyncEngine) -> WarmClaimLedger:
    return SqlWarmClaimLedger(engine) if request.param == "database" else LocalWarmClaims()


async def test_one_claim_per_slot_and_only_its_releaser_touches_the_container(
    ledger: WarmClaimLedger,
) -> None:
    # Two processes racing for one slot: exactly one claim wins.
    won = await asyncio.gather(
        ledger.place("slot-000", "proc_a", "/s/slot-000/.warm-a", 1.0),
        ledger.place("slot-000", "proc_b", "/s/slot-000/.warm-b", 1.0),
    )
    assert sorted(won) == [False, True]
    [claim] = await ledger.all()
    assert claim.container_id is None
    assert await ledger.started(claim, "c" * 64)
    started = WarmClaim(claim.slot, claim.process_id, claim.root, "c" * 64)
    assert await ledger.of_slot("slot-000") == started
    # Another process takes it over (releases the claim): the maker's release then
    # fails, so it leaves the container alone; a late "started" is refused too.
    assert await ledger.release(started)
    assert not await ledger.release(started)
    assert not await ledger.started(claim, "d" * 64)
    assert await ledger.of_slot("slot-000") is None
    # A new claim on the slot is not the old one's to release.
    assert await ledger.place("slot-000", "proc_b", "/s/slot-000/.warm-c", 2.0)
    assert not await ledger.release(started)
    assert [c.root for c in await ledger.all()] == ["/s/slot-000/.warm-c"]
