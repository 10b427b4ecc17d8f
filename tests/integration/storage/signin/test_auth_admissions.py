"""The sign-in's admissions (issue 25): the presses of "Create my sandbox" queued behind
a slow one are decided together, so a flood of presses does not make an honest one wait
for each of the flood's transactions in turn; the caps hold as if each came alone."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from turns_testkit import counted_transactions, database_held, settle

from app.storage.signin.auth_admissions import MAX_ADMISSIONS
from app.storage.signin.auth_store import _ADMISSION_LOCK, SqlAuthStore
from auth.admission import Admitted, Refusal, SigninAdmission
from auth.config import AuthConfig
from auth.ratelimit import Shares
from auth.store import Client, Grant, IssuedCode, TokenRecord

pytestmark = pytest.mark.integration

NOW = 1_700_000_000.0
CODE_TTL = 600.0


def flood_prefix(n: int) -> str:
    return f"2001:db8:f{n % 8:x}:1::/64"  # eight networks, an address each


def a_code(name: str, prefix: str, at: float) -> IssuedCode:
    return IssuedCode(f"hash-{name}", prefix, at, at + CODE_TTL)


def admission_of(store: SqlAuthStore, **limits: object) -> SigninAdmission:
    config = AuthConfig(issuer="https://mcp.example.test", **limits)  # type: ignore[arg-type]
    return SigninAdmission(config, store, clock=lambda: NOW)


async def test_a_press_behind_a_flood_waits_for_one_transaction_not_one_each(
    engine: AsyncEngine,
) -> None:
    """An honest press arrives behind 60 of a flood's, while the first of them waits for
    the database. Before, each press held the admission lock for a transaction of its
    own: the honest one waited for 61 of them (``POST /authorize`` 11.9 s median under
    the fairness bench's attack). Now the queued presses are decided in one
    transaction, in the order they came, each against the codes admitted before it."""
    store = SqlAuthStore(engine)
    admission = admission_of(store, signins_per_address_per_minute=3)
    with counted_transactions(engine) as began:
        async with database_held(engine, _ADMISSION_LOCK):
            first = asyncio.create_task(admission.admit(a_code("f0", flood_prefix(0), NOW)))
            await settle()
            queued = [
                asyncio.create_task(
                    admission.admit(a_code(f"f{n}", flood_prefix(n), NOW + n / 100))
                )
                for n in range(1, 60)
            ]
            honest = asyncio.create_task(admission.admit(a_code("honest", "198.51.100.7", NOW + 1)))
            await settle()
        outcomes = await asyncio.gather(first, *queued)
        mine = await honest
    assert began[0] == 2, f"the first press and the 60 behind it took {began[0]} transactions"
    # Each flood address had 3 presses a minute: the first 24 of the flood admitted in
    # order, the rest refused for the burst; the honest press still had its place.
    assert all(isinstance(o, Admitted) and o.first for o in outcomes[:24])
    assert all(isinstance(o, Refusal) and o.limit == "burst" for o in outcomes[24:])
    assert isinstance(mine, Admitted)
    counts = await store.signin_counts(
        flood_prefix(0), NOW + 1, burst_since=NOW - 60, hourly_since=NOW - 3600
    )
    assert len(counts.prefix_recent) == 3, "only the admitted codes were recorded"
    assert len(counts.hourly) == 25


async def test_the_caps_hold_as_if_each_press_came_alone(engine: AsyncEngine) -> None:
    """Decided together or alone, the same answers: a double press (in the batch after
    the first, or within one batch) gets the first press's code and counts nothing; a
    live grant and the codes admitted earlier in the batch fill the address's places;
    the hour's cap counts every address's codes; an old, expired code counts nothing."""
    store = SqlAuthStore(engine)
    await store.save_client(Client("c", None, ("http://127.0.0.1:9/cb",), NOW))
    home = "203.0.113.0/24"
    grant = Grant("g", "c", "key", "https://mcp.example.test/mcp", ("sandbox",), NOW - 10)
    await store.create_grant(
        replace(grant, signin_prefix=home),
        [TokenRecord("rt", "g", "refresh", NOW + 86400), TokenRecord("at", "g", "access", NOW)],
    )
    # Recorded long ago or expired: outside every window.
    await store.issue_code(
        IssuedCode("old", home, NOW - 7200, NOW - 6600),
        burst_since=0,
        hourly_since=0,
        refuse=lambda _: None,
    )
    admission = admission_of(
        store,
        sandboxes_per_address=3,
        new_sandboxes_per_hour=4,
        signins_per_address_per_minute=9,
        shares=Shares(address_percent=100, network_percent=100),
    )
    async with database_held(engine, _ADMISSION_LOCK):
        first = asyncio.create_task(admission.admit(a_code("a", home, NOW)))
        await settle()
        presses = [
            asyncio.create_task(admission.admit(code))
            for code in (
                a_code("a", home, NOW + 0.5),  # the same code pressed again
                a_code("b", home, NOW + 1),  # the grant, a and b: the third place
                a_code("b", home, NOW + 1.5),  # pressed again in the same batch
                a_code("c", home, NOW + 2),  # no fourth place for home
                a_code("d", "198.51.100.0/24", NOW + 3),  # the hour's third code
                a_code("e", "192.0.2.0/24", NOW + 4),  # the hour's fourth
                a_code("f", "192.0.2.0/24", NOW + 5),  # the hour is full
            )
        ]
        await settle()
    outcomes = [await first, *await asyncio.gather(*presses)]
    kinds = [o.first if isinstance(o, Admitted) else o.limit for o in outcomes]
    assert kinds == [True, False, True, False, "live", True, True, "hourly"]
    for again, code in (
        (outcomes[1], a_code("a", home, NOW)),
        (outcomes[3], a_code("b", home, NOW + 1)),
    ):
        assert isinstance(again, Admitted)
        assert again.issued == code, "the double press gets the first press's code"


async def test_a_cancelled_press_spends_nothing(engine: AsyncEngine) -> None:
    """A browser gone before its press was decided leaves its place to the next."""
    store = SqlAuthStore(engine)
    admission = admission_of(store, signins_per_address_per_minute=2)
    async with database_held(engine, _ADMISSION_LOCK):
        first = asyncio.create_task(admission.admit(a_code("1", "192.0.2.1", NOW)))
        await settle()
        gone = asyncio.create_task(admission.admit(a_code("2", "192.0.2.1", NOW + 1)))
        await settle()
        gone.cancel()
        await settle()
    assert isinstance(await first, Admitted)
    assert gone.cancelled()
    assert isinstance(await admission.admit(a_code("3", "192.0.2.1", NOW + 2)), Admitted)


async def test_a_transaction_decides_at_most_max_admissions_presses(engine: AsyncEngine) -> None:
    """However many queue, a transaction reads a bounded number of addresses and codes."""
    store = SqlAuthStore(engine)
    admission = admission_of(store, new_sandboxes_per_hour=10_000)
    presses = MAX_ADMISSIONS * 2 + 5
    with counted_transactions(engine) as began:
        async with database_held(engine, _ADMISSION_LOCK):
            first = asyncio.create_task(admission.admit(a_code("x", "192.0.2.1", NOW)))
            await settle()
            rest = [
                asyncio.create_task(admission.admit(a_code(f"x{n}", f"2001:db8:{n:x}::/64", NOW)))
                for n in range(presses)
            ]
            await settle()
        outcomes = await asyncio.gather(first, *rest)
    assert all(isinstance(o, Admitted) for o in outcomes)
    assert began[0] == 1 + -(-presses // MAX_ADMISSIONS)
