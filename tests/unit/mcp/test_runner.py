"""The tool wrapper: identity, per-call context, error mapping, notes, audit."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from pool_fakes import FakeSlotStore, MemoryPoolState
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import InvalidArgument
from app.http.metrics import Metrics
from app.mcp.envelope import ToolOutput
from app.mcp.runner import LocalIdentity, ToolRunner
from app.observability import configure_logging
from app.storage.audit import AuditTrail
from app.storage.db import Repository
from jail import CallContext, JailError, SandboxMemory
from pool.errors import PoolError
from pool.leases import SlotPool


@dataclass
class Nobody:
    def sandbox_key(self) -> str | None:
        return None

    def signin_address(self) -> str | None:
        return None


@pytest.fixture
async def parts(tmp_path: Path, sqlite_engine: AsyncEngine) -> tuple[Repository, SlotPool]:
    pool = SlotPool(MemoryPoolState(), FakeSlotStore(tmp_path), size=1, idle_timeout_s=600)
    await pool.open()
    return Repository(sqlite_engine), pool


def runner(parts: tuple[Repository, SlotPool], key: str = "k1") -> ToolRunner:
    repository, pool = parts
    audit = AuditTrail(repository.engine)
    return ToolRunner(LocalIdentity(key), audit, SandboxMemory(), pool, queue_wait_s=0)


async def test_success_carries_the_sandbox_lifetime_and_passes_the_context(
    parts: tuple[Repository, SlotPool],
) -> None:
    seen: list[CallContext] = []

    async def body(call: CallContext) -> ToolOutput:
        seen.append(call)
        return ToolOutput()

    result = await runner(parts).run("t", body, takes_slot=True)
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["idle_expiry_s"] == 600
    assert seen[0].sandbox_key == "k1"
    assert seen[0].slot_root is not None
    rows = await parts[0].tool_calls("k1")
    assert [(r.tool, r.outcome) for r in rows] == [("t", "ok")]


@pytest.mark.parametrize(
    ("error", "code", "message_part"),
    [
        (InvalidArgument("Bad thing; do X.", field="x"), "INVALID_ARGUMENT", "do X"),
        (JailError("SYMLINK_ESCAPE", "A link leads outside."), "SYMLINK_ESCAPE", "outside"),
        (
            PoolError("ZFS_COMMAND_FAILED", "zfs said /tank/secret/path"),
            "SANDBOX_UNAVAILABLE",
            "retry in a minute",
        ),
        (RuntimeError("boom /etc/shadow"), "INTERNAL_ERROR", "report request id"),
    ],
)
async def test_errors_become_stable_codes_without_tracebacks_or_host_paths(
    parts: tuple[Repository, SlotPool], error: Exception, code: str, message_part: str
) -> None:
    async def body(call: CallContext) -> ToolOutput:
        raise error

    result = await runner(parts).run("t", body, takes_slot=False)
    assert result.is_error
    assert result.structured_content is not None
    failure = result.structured_content["error"]
    assert failure["code"] == code
    assert message_part in failure["message"]
    text = result.content[0].text  # type: ignore[union-attr]
    for leak in ("Traceback", "/tank/secret", "/etc/shadow", 'File "'):
        assert leak not in text
    assert result.structured_content["request_id"]
    assert [r.outcome for r in await parts[0].tool_calls("k1")] == [code]


async def test_queued_callers_get_position_and_wait(parts: tuple[Repository, SlotPool]) -> None:
    async def body(call: CallContext) -> ToolOutput:
        return ToolOutput()

    await runner(parts, "holder").run("t", body, takes_slot=True)
    result = await runner(parts, "waiter").run("t", body, takes_slot=True)
    assert result.is_error
    assert result.structured_content is not None
    error = result.structured_content["error"]
    assert (error["code"], error["position"]) == ("SANDBOX_QUEUED", 1)
    assert error["estimated_wait_s"] > 0


async def test_no_identity_fails_closed(parts: tuple[Repository, SlotPool]) -> None:
    repository, pool = parts
    called = []

    async def body(call: CallContext) -> ToolOutput:
        called.append(call)
        return ToolOutput()

    result = await ToolRunner(
        Nobody(), AuditTrail(repository.engine), SandboxMemory(), pool, queue_wait_s=0
    ).run("t", body, takes_slot=True)
    assert result.is_error
    assert result.structured_content is not None
    assert result.structured_content["error"]["code"] == "UNAUTHENTICATED"
    assert called == []
    assert pool.stats().busy == 0


async def test_a_one_time_note_survives_a_failing_call(parts: tuple[Repository, SlotPool]) -> None:
    _, pool = parts

    async def ok(call: CallContext) -> ToolOutput:
        return ToolOutput()

    async def fails(call: CallContext) -> ToolOutput:
        raise InvalidArgument("nope")

    await runner(parts, "a").run("t", ok, takes_slot=True)
    await runner(parts, "b").run("t", ok, takes_slot=True)  # queued
    await pool.release("a")
    result = await runner(parts, "b").run("t", fails, takes_slot=True)
    assert result.structured_content is not None
    assert "ready" in result.structured_content["error"]["notes"][0]


async def test_a_resource_read_goes_through_the_runner(
    parts: tuple[Repository, SlotPool],
) -> None:
    """Same identity, audit row, idle-clock touch and error mapping as a tool call."""
    repository, pool = parts
    await pool.acquire("k1")
    seen: list[CallContext] = []

    async def body(call: CallContext) -> str:
        seen.append(call)
        return "content"

    assert await runner(parts).read("resource:x", body) == "content"
    assert seen[0].sandbox_key == "k1"
    assert seen[0].slot_root is not None  # the slot the caller holds, never a new one

    async def refused(call: CallContext) -> str:
        raise InvalidArgument("No such experiment in your sandbox.")

    async def crashed(call: CallContext) -> str:
        raise RuntimeError("boom /etc/shadow")

    with pytest.raises(ResourceNotFoundError, match="No such experiment"):
        await runner(parts).read("resource:x", refused)
    with pytest.raises(ResourceNotFoundError) as caught:
        await runner(parts).read("resource:x", crashed)
    assert "/etc/shadow" not in str(caught.value)
    rows = await repository.tool_calls("k1")
    assert [(r.tool, r.outcome) for r in rows] == [
        ("resource:x", "ok"),
        ("resource:x", "INVALID_ARGUMENT"),
        ("resource:x", "INTERNAL_ERROR"),
    ]
    with pytest.raises(ResourceNotFoundError, match="Sign in"):
        await ToolRunner(
            Nobody(), AuditTrail(repository.engine), SandboxMemory(), pool, queue_wait_s=0
        ).read("resource:x", body)


async def test_a_call_that_never_sees_the_slot_skips_its_lookup(
    parts: tuple[Repository, SlotPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sandbox_status`` reads the pool itself: on a shared pool the runner's own
    lookup of the held slot was one more database round trip per call (issue 13)."""
    pool = parts[1]
    await pool.acquire("k1")
    lookups: list[str] = []
    holding = pool.holding

    async def counted(key: str) -> object:
        lookups.append(key)
        return await holding(key)

    monkeypatch.setattr(pool, "holding", counted)
    seen: list[CallContext] = []

    async def body(call: CallContext) -> ToolOutput:
        seen.append(call)
        return ToolOutput()

    await runner(parts).run("t", body, takes_slot=False)
    await runner(parts).run("t", body, takes_slot=False, sees_slot=False)
    assert lookups == ["k1"]
    assert seen[0].slot_root is not None
    assert seen[1].slot_root is None
    assert [r.outcome for r in await parts[0].tool_calls("k1")] == ["ok", "ok"]


def test_a_token_s_signin_claim_is_the_call_s_address() -> None:
    from mcp.server.auth.middleware.auth_context import auth_context_var
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    from app.mcp.runner import TokenIdentity
    from auth.grants import SIGNIN_CLAIM

    identity = TokenIdentity()
    assert identity.signin_address() is None  # no token: no address
    for claims, address in (({SIGNIN_CLAIM: "203.0.113.7"}, "203.0.113.7"), (None, None)):
        token = AccessToken(token="t", client_id="c", scopes=[], subject="k", claims=claims)
        reset = auth_context_var.set(AuthenticatedUser(token))
        try:
            assert identity.sandbox_key() == "k"
            assert identity.signin_address() == address
        finally:
            auth_context_var.reset(reset)


@pytest.mark.parametrize("level", ["WARNING", "INFO"])
async def test_calls_are_counted_once_whether_or_not_the_level_writes_their_line(
    parts: tuple[Repository, SlotPool], level: str
) -> None:
    repository, pool = parts
    metrics = Metrics()
    stream = io.StringIO()
    configure_logging(level, stream=stream, count_events=metrics.count_event)
    try:
        calls = ToolRunner(
            LocalIdentity("k1"),
            AuditTrail(repository.engine),
            SandboxMemory(),
            pool,
            queue_wait_s=0,
            on_call=metrics.tool_call,
        )

        async def ok(_: CallContext) -> ToolOutput:
            return ToolOutput()

        async def refused(_: CallContext) -> ToolOutput:
            raise InvalidArgument("no")

        for body in (ok, ok, refused):
            await calls.run("t", body, takes_slot=False)
    finally:
        configure_logging("INFO", stream=io.StringIO())
    text = metrics.render(None)[0].decode()
    assert 'sandbox_mcp_events_total{event="tool.call",level="info"} 3.0' in text
    assert 'sandbox_mcp_tool_call_seconds_count{outcome="ok",tool="t"} 2.0' in text
    assert 'sandbox_mcp_tool_call_seconds_count{outcome="INVALID_ARGUMENT",tool="t"} 1.0' in text
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    written = [line for line in lines if line["event"] == "tool.call"]
    assert len(written) == (3 if level == "INFO" else 0)


def test_request_ids_are_distinct_and_in_the_order_they_were_made() -> None:
    """In order, so that the audit rows' ``request_id`` index grows at its end (random
    ids scattered every batch's rows over its pages); 32 hex digits, as before."""
    from app.mcp.runner import _request_id

    ids = [_request_id() for _ in range(5_000)]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)


def test_a_forked_child_makes_ids_of_its_own() -> None:
    """A child forked after its parent made ids must not repeat the parent's next ones."""
    import os

    from app.mcp.runner import _request_id

    _request_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one id to the pipe, then out without running any cleanup
        os.write(write, _request_id().encode())
        os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 64).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    parent = _request_id()
    # The same process part would mean the same ids, a counter's step apart.
    assert len(child) == 32
    assert child[12:20] != parent[12:20]
