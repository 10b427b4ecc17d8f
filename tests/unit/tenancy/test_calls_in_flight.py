"""The runner's bound on one sandbox's tool calls in flight: the call past it is refused
at once with TOO_MANY_CALLS, other sandboxes are not affected, and every way a call ends
(a result, an error, a cancel) gives its place back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pool_fakes import FakeSlotStore, MemoryPoolState
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import InvalidArgument
from app.mcp.envelope import ToolOutput
from app.mcp.runner import Identity, ToolRunner
from app.storage.audit import AuditTrail
from app.storage.db import Repository
from jail import CallContext, SandboxMemory
from pool.leases import SlotPool


class SwitchableIdentity:
    """The caller's key, changed between calls by the test."""

    def __init__(self) -> None:
        self.key = "mallory"
        self.address: str | None = None

    def sandbox_key(self) -> str | None:
        return self.key

    def signin_address(self) -> str | None:
        return self.address


@pytest.fixture
async def setup(
    tmp_path: Path, sqlite_engine: AsyncEngine
) -> tuple[ToolRunner, SwitchableIdentity, Repository]:
    pool = SlotPool(MemoryPoolState(), FakeSlotStore(tmp_path), size=2, idle_timeout_s=600)
    await pool.open()
    identity = SwitchableIdentity()
    caller: Identity = identity
    repository = Repository(sqlite_engine)
    runner = ToolRunner(
        caller,
        AuditTrail(sqlite_engine),
        SandboxMemory(),
        pool,
        queue_wait_s=0,
        max_calls_per_sandbox=2,
        max_calls_per_address=3,
    )
    return runner, identity, repository


async def test_the_call_past_the_bound_is_refused_at_once_and_places_come_back(
    setup: tuple[ToolRunner, SwitchableIdentity, Repository],
) -> None:
    runner, identity, repository = setup
    release, both_started = asyncio.Event(), asyncio.Event()
    started = 0

    async def waits(call: CallContext) -> ToolOutput:
        nonlocal started
        started += 1
        if started == 2:
            both_started.set()
        await release.wait()
        return ToolOutput()

    async def quick(call: CallContext) -> ToolOutput:
        return ToolOutput()

    async def fails(call: CallContext) -> ToolOutput:
        raise InvalidArgument("Bad thing; do X.")

    held = [asyncio.create_task(runner.run("get_job_result", waits, takes_slot=False))]
    held.append(asyncio.create_task(runner.run("get_job_result", waits, takes_slot=False)))
    await both_started.wait()
    refused = await runner.run("get_job_result", quick, takes_slot=False)
    assert refused.is_error
    assert refused.structured_content is not None
    error = refused.structured_content["error"]
    assert error["code"] == "TOO_MANY_CALLS"
    assert "wait for one of them to return" in error["message"]
    assert (error["limit"], error["value"]) == ("calls_per_sandbox", 2)

    identity.key = "alice"  # another sandbox has its own share
    assert not (await runner.run("sandbox_status", quick, takes_slot=False)).is_error

    identity.key = "mallory"
    held[0].cancel()  # a client that goes away gives its place back
    await asyncio.gather(held[0], return_exceptions=True)
    assert runner.calls_in_flight.of("mallory") == 1
    assert (await runner.run("read_file", fails, takes_slot=False)).is_error
    assert runner.calls_in_flight.of("mallory") == 1  # an error gives it back too
    assert not (await runner.run("sandbox_status", quick, takes_slot=False)).is_error
    release.set()
    assert not (await held[1]).is_error
    assert len(runner.calls_in_flight) == 0
    outcomes = [row.outcome for row in await repository.tool_calls("mallory")]
    assert "TOO_MANY_CALLS" in outcomes  # the refusal is in the audit trail


async def test_one_address_s_sandboxes_share_a_bound_and_other_addresses_do_not(
    setup: tuple[ToolRunner, SwitchableIdentity, Repository],
) -> None:
    """Two calls a sandbox, three for one address: mallory's second sandbox gets one
    call in, its next is refused, alice (another address) and bob (none) are served."""
    runner, identity, _ = setup
    release = asyncio.Event()
    started = asyncio.Event()
    count = 0

    async def waits(call: CallContext) -> ToolOutput:
        nonlocal count
        count += 1
        started.set()
        await release.wait()
        return ToolOutput()

    async def quick(call: CallContext) -> ToolOutput:
        return ToolOutput()

    async def start(key: str) -> asyncio.Task[object]:
        identity.key, identity.address = key, "203.0.113.7"
        before = count
        task = asyncio.create_task(runner.run("get_job_result", waits, takes_slot=False))
        while count == before:
            started.clear()
            await started.wait()
        return task

    held = [await start("mallory-1"), await start("mallory-1"), await start("mallory-2")]
    identity.key = "mallory-2"  # its own share has room, its address's has not
    refused = await runner.run("get_job_result", quick, takes_slot=False)
    assert refused.structured_content is not None
    error = refused.structured_content["error"]
    assert error["code"] == "TOO_MANY_CALLS"
    assert (error["limit"], error["value"]) == ("calls_per_address", 3)
    assert "signed in from your address" in error["message"]
    identity.key, identity.address = "alice", "198.51.100.1"
    assert not (await runner.run("sandbox_status", quick, takes_slot=False)).is_error
    identity.key, identity.address = "bob", None
    assert not (await runner.run("sandbox_status", quick, takes_slot=False)).is_error
    release.set()
    await asyncio.gather(*held)
    assert len(runner.calls_in_flight) == 0
    identity.key, identity.address = "mallory-2", "203.0.113.7"
    assert not (await runner.run("sandbox_status", quick, takes_slot=False)).is_error
