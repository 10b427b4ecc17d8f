"""The fair container share and the output-reader sizing (app.runtime.docker.capacity)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from app.errors import ConfigurationError, LimitReached
from app.runtime.docker.capacity import (
    UNATTRIBUTED,
    ContainerLimiter,
    ContainerShares,
    output_streams,
)
from app.runtime.errors import CapacityExceeded


def test_a_first_container_fits_while_the_server_is_below_its_total() -> None:
    shares = ContainerShares(total=4, slots=4, per_sandbox=3)
    assert shares.refusal({"a": 1, "b": 1, "c": 1}, "d") is None


def test_extras_come_only_out_of_what_every_slot_leaves() -> None:
    shares = ContainerShares(total=6, slots=4, per_sandbox=3)
    assert shares.spare == 2
    assert shares.refusal({"a": 1}, "a") is None
    assert shares.refusal({"a": 2}, "a") is None
    assert shares.refusal({"a": 3}, "b") is None  # b's first
    refused = shares.refusal({"a": 2, "b": 2}, "b")
    assert isinstance(refused, CapacityExceeded)
    assert refused.details == {"limit": 6, "spare": 2, "reason": "spare_in_use"}
    assert "2 containers this server keeps for second and later experiments" in refused.message


def test_the_pool_is_reserved_even_while_most_of_it_is_free() -> None:
    # One tenant alone on a pool of 4 with 5 containers: it gets one extra, not four,
    # so the three sandboxes that will be leased later still find their first.
    shares = ContainerShares(total=5, slots=4, per_sandbox=3)
    assert shares.refusal({"a": 1}, "a") is None
    assert isinstance(shares.refusal({"a": 2}, "a"), CapacityExceeded)
    assert shares.refusal({"a": 2}, "b") is None


def test_a_sandbox_at_its_own_cap_gets_limit_reached_before_anything_else() -> None:
    shares = ContainerShares(total=100, slots=4, per_sandbox=3)
    refused = shares.refusal({"a": 3}, "a")
    assert isinstance(refused, LimitReached)
    assert refused.code == "LIMIT_REACHED"
    assert refused.details == {"limit": "containers_per_sandbox", "value": 3}
    assert "maximum of 3" in refused.message
    assert "destroy_experiment" in refused.message


def test_unattributed_containers_count_as_extras() -> None:
    shares = ContainerShares(total=3, slots=2)
    assert isinstance(shares.refusal({UNATTRIBUTED: 1, "a": 1}, "a"), CapacityExceeded)
    assert shares.refusal({UNATTRIBUTED: 1, "a": 1}, "b") is None
    assert shares.refusal({"a": 1}, UNATTRIBUTED) is None  # the one spare
    assert isinstance(shares.refusal({"a": 1, UNATTRIBUTED: 1}, UNATTRIBUTED), CapacityExceeded)


def test_a_full_server_refuses_even_a_first() -> None:
    refused = ContainerShares(total=2).refusal({"a": 1, "b": 1}, "c")
    assert isinstance(refused, CapacityExceeded)
    assert refused.details == {"limit": 2, "reason": "server_full"}


@pytest.mark.parametrize(("total", "slots"), [(0, 0), (3, 4)])
def test_a_total_below_the_pool_is_a_configuration_error(total: int, slots: int) -> None:
    with pytest.raises(ConfigurationError):
        ContainerShares(total=total, slots=slots)


@pytest.mark.parametrize("seed", range(20))
def test_a_slot_holder_always_gets_its_first_container(seed: int) -> None:
    """A random walk of leases, creations and removals: no first is ever refused."""
    rng = random.Random(seed)
    slots = rng.randint(1, 8)
    shares = ContainerShares(total=slots + rng.randint(0, 6), slots=slots, per_sandbox=3)
    held: Counter[str] = Counter()
    leased: list[str] = []
    for step in range(400):
        roll = rng.random()
        if roll < 0.1 and len(leased) < slots:
            leased.append(f"s{step}")
        elif roll < 0.2 and leased:
            # The pool empties a sandbox: its containers go before its slot.
            gone = leased.pop(rng.randrange(len(leased)))
            held.pop(gone, None)
        elif roll < 0.4 and held:
            victim = rng.choice(sorted(held))
            held[victim] -= 1
            if not held[victim]:
                del held[victim]
        elif leased:
            sandbox = rng.choice(leased)
            refusal = shares.refusal(held, sandbox)
            if held[sandbox] == 0:
                assert refusal is None, (seed, step, dict(held), sandbox)
            if refusal is None:
                held[sandbox] += 1
        assert sum(held.values()) <= shares.total


async def test_the_limiter_counts_creations_in_flight() -> None:
    live: dict[str, str] = {}
    entered = asyncio.Event()
    release = asyncio.Event()

    async def engine() -> dict[str, str]:
        return dict(live)

    limiter = ContainerLimiter(ContainerShares(total=3, slots=2, per_sandbox=3), engine)

    async def create(sandbox: str, name: str) -> None:
        async with limiter.admit(sandbox, name):
            entered.set()
            await release.wait()
            live[name] = sandbox

    first = asyncio.create_task(create("a", "a1"))  # a's first, still being created
    await entered.wait()
    second = asyncio.create_task(create("a", "a2"))  # a's second: the one spare
    await asyncio.sleep(0)
    with pytest.raises(CapacityExceeded):
        async with limiter.admit("a", "a3"):  # a's third: the spare is in flight
            pass
    async with limiter.admit("b", "b1"):  # b's first always fits
        pass
    release.set()
    await asyncio.gather(first, second)
    assert live == {"a1": "a", "a2": "a"}


async def test_a_container_the_engine_already_shows_is_not_counted_twice() -> None:
    # Two containers, two slots: the engine lists a's container before a's creation
    # has left the limiter; b's first must still fit.
    live: dict[str, str] = {}

    async def engine() -> dict[str, str]:
        return dict(live)

    limiter = ContainerLimiter(ContainerShares(total=2, slots=2), engine)

    async with limiter.admit("a", "a1"):
        live["a1"] = "a"  # made at the engine, not yet out of the limiter
        async with limiter.admit("b", "b1"):
            live["b1"] = "b"
    with pytest.raises(CapacityExceeded):
        async with limiter.admit("c", "c1"):
            pass


async def test_a_refused_or_failed_creation_gives_its_place_back() -> None:
    async def none() -> dict[str, str]:
        return {}

    limiter = ContainerLimiter(ContainerShares(total=1, slots=1), none)

    with pytest.raises(RuntimeError):
        async with limiter.admit("a", "a1"):
            raise RuntimeError("the engine refused")
    async with limiter.admit("b", "b1"):
        pass


async def test_admissions_that_arrive_together_share_one_listing() -> None:
    # A burst of creations: each needs a listing that began after it arrived, and those
    # arriving while one is under way share the next, rather than one listing each.
    listings = 0
    gate = asyncio.Event()

    async def engine() -> dict[str, str]:
        nonlocal listings
        listings += 1
        await gate.wait()
        return {}

    limiter = ContainerLimiter(ContainerShares(total=100, slots=100), engine)

    async def create(sandbox: str) -> None:
        async with limiter.admit(sandbox, sandbox):
            pass

    first = asyncio.create_task(create("first"))
    await asyncio.sleep(0)  # its listing is under way
    burst = [asyncio.create_task(create(f"s{i}")) for i in range(50)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *burst)
    assert listings == 2


async def test_a_creation_that_ended_after_the_listing_began_still_counts() -> None:
    # c's listing began before b1 was made, so it does not show b1: b1 is counted from
    # the limiter's own record (it ended after that listing began).
    now = [0.0]
    gate = asyncio.Event()
    calls = 0

    async def engine() -> dict[str, str]:
        nonlocal calls
        calls += 1
        if calls == 2:  # c's listing: it began at 1.0 and answers after b1 was made
            await gate.wait()
        return {}

    limiter = ContainerLimiter(ContainerShares(total=1, slots=1), engine, clock=lambda: now[0])
    b_in = asyncio.Event()
    b_done = asyncio.Event()

    async def b() -> None:
        async with limiter.admit("b", "b1"):
            b_in.set()
            await b_done.wait()
            now[0] = 2.0  # made at the engine; its creation ends now

    async def c() -> None:
        async with limiter.admit("c", "c1"):
            pass

    b_task = asyncio.create_task(b())
    await b_in.wait()
    now[0] = 1.0
    c_task = asyncio.create_task(c())
    await asyncio.sleep(0)  # c's listing began at 1.0
    b_done.set()
    await b_task
    gate.set()
    with pytest.raises(CapacityExceeded):
        await c_task


def test_output_streams_cover_every_sandbox_at_its_caps() -> None:
    # 500 slots, 8 jobs each, plus one stream per creation in flight (3 experiments).
    assert output_streams(500, 8, 3) == 5500
    assert output_streams(6, 2, 3) == 30
