"""Shares of the DNS lookup threads per key: how many lookups are in flight, until when a
place is held, and that nothing is left behind (``auth.lookup_shares``)."""

from __future__ import annotations

import asyncio

import pytest

from auth.lookup_shares import KeyedShares


class Lookups:
    """Lookups that end when the test says so, each recording that it started."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._ends: dict[str, asyncio.Future[list[str]]] = {}

    async def lookup(self, host: str) -> list[str]:
        self.started.append(host)
        self._ends[host] = asyncio.get_running_loop().create_future()
        return await self._ends[host]

    def end(self, host: str, error: Exception | None = None) -> None:
        if error is None:
            self._ends[host].set_result(["192.0.2.1"])
        else:
            self._ends[host].set_exception(error)


async def looked_up(
    shares: KeyedShares, lookups: Lookups, keys: list[tuple[str, int]], host: str
) -> list[str]:
    held = await shares.take(keys)
    return await held.run(lookups.lookup(host))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_key_has_its_limit_in_flight_and_the_next_waits_for_one_to_end() -> None:
    shares, lookups = KeyedShares(), Lookups()
    keys = [("address:a", 2)]
    first = asyncio.create_task(looked_up(shares, lookups, keys, "one"))
    second = asyncio.create_task(looked_up(shares, lookups, keys, "two"))
    third = asyncio.create_task(looked_up(shares, lookups, keys, "three"))
    other = asyncio.create_task(looked_up(shares, lookups, [("address:b", 2)], "other"))
    await settle()
    assert lookups.started == ["one", "two", "other"], "a's third waits; b has its own share"
    lookups.end("two")
    assert await second == ["192.0.2.1"]
    await settle()
    assert lookups.started[-1] == "three"
    for host, task in (("one", first), ("three", third), ("other", other)):
        lookups.end(host)
        await task
    assert shares.idle


async def test_every_key_must_have_room_and_a_full_network_holds_its_addresses_back() -> None:
    shares, lookups = KeyedShares(), Lookups()

    def keys(address: str) -> list[tuple[str, int]]:
        return [(f"address:{address}", 1), ("network:n", 2)]

    tasks = [asyncio.create_task(looked_up(shares, lookups, keys(a), a)) for a in "abc"]
    await settle()
    assert lookups.started == ["a", "b"], "the network's two places are taken"
    lookups.end("a")
    await settle()
    assert lookups.started == ["a", "b", "c"]
    for host in "bc":
        lookups.end(host)
    await asyncio.gather(*tasks)
    assert shares.idle


async def test_a_place_is_held_until_the_lookup_ends_not_until_its_caller_gives_up() -> None:
    # getaddrinfo keeps its thread after the caller's timeout: so must the share.
    shares, lookups = KeyedShares(), Lookups()
    keys = [("address:a", 1)]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await looked_up(shares, lookups, keys, "slow")
    waiting = asyncio.create_task(looked_up(shares, lookups, keys, "next"))
    await settle()
    assert lookups.started == ["slow"], "the timed-out lookup still holds a's place"
    lookups.end("slow", OSError("no answer"))  # retrieved by the shares: nobody waits
    await settle()
    assert lookups.started == ["slow", "next"]
    lookups.end("next")
    assert await waiting == ["192.0.2.1"]
    assert shares.idle


async def test_a_take_given_up_while_waiting_gives_back_what_it_took() -> None:
    shares, lookups = KeyedShares(), Lookups()
    holder = asyncio.create_task(
        looked_up(shares, lookups, [("address:a", 1), ("network:n", 1)], "held")
    )
    await settle()
    # b gets its address's place, then waits for the network's and gives up.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await shares.take([("address:b", 1), ("network:n", 1)])
    held = await shares.take([("address:b", 1)])  # b's place was given back
    held.release()
    lookups.end("held")
    await holder
    assert shares.idle


async def test_a_place_not_used_is_given_back_once_and_a_used_one_only_by_its_lookup() -> None:
    shares, lookups = KeyedShares(), Lookups()
    unused = await shares.take([("address:a", 1)])
    unused.release()
    unused.release()  # once only: a second release gives back nothing more
    assert shares.idle
    used = await shares.take([("address:a", 1)])
    task = asyncio.create_task(used.run(lookups.lookup("host")))
    await settle()
    used.release()  # the lookup has it: nothing given back
    assert not shares.idle
    with pytest.raises(RuntimeError):
        await used.run(lookups.lookup("again"))
    lookups.end("host")
    await task
    assert shares.idle
