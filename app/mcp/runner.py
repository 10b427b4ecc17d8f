"""The tool runner: what happens around every MCP tool call and resource read.

For each call it works out who is calling (the sandbox key, never an IP
address), builds the call's ``CallContext`` and passes it to the body (explicit
passing is the one way the context travels; nothing reads it from ambient
state), turns domain errors into ``isError`` results with a stable code and a
sentence the agent can act on, records the call in the audit trail and the
metrics, and makes sure no traceback ever reaches the client. Resource reads go
through the same runner (``read``), so they get the same identity, audit row,
idle-clock touch and metrics as tools.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import structlog
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.types import CallToolResult
from pydantic import BaseModel

from app.errors import DatabaseUnavailable, ServiceError
from app.experiments.disk_budget import DiskBudget
from app.mcp.call_sampling import CallKey, CallSampling
from app.mcp.envelope import ToolFailure, error_result, ok_result
from app.sampling import ThrottledLog, Unwritten
from app.tenancy.calls_in_flight import DEFAULT_PER_ADDRESS, DEFAULT_PER_SANDBOX, CallsInFlight
from app.tenancy.threads import TenantThreads
from auth.grants import SIGNIN_CLAIM
from jail.context import CallContext, SandboxMemory, new_call_context
from jail.errors import JailError
from pool.errors import PoolError
from pool.leases import Lease, Queued, SlotPool
from pool.state import NoteKind

log = structlog.get_logger(__name__)
# The standard logger behind ``log``: asked whether a ``tool.call`` line would be written
# before one is built (metrics count calls through ``on_call``, whatever the level).
_std_log = logging.getLogger(__name__)

T = TypeVar("T")

# The key of the one implicit user of local mode (SANDBOX_MCP_AUTH=none).
LOCAL_SANDBOX_KEY = "local"


def note_text(kind: NoteKind, idle_timeout_s: int) -> str:
    if kind == "ready":
        return "Your sandbox is ready: a slot was freed for you while you waited in the queue."
    return (
        f"Your previous sandbox was emptied after {idle_timeout_s} s without activity, so this "
        "is a new, empty sandbox. Your sign-in is still valid; recreate what you need."
    )


Progress = Callable[[float, float | None, str | None], Awaitable[None]]


class Identity(Protocol):
    def sandbox_key(self) -> str | None:
        """The caller's sandbox key, or ``None`` when the call is not authenticated."""

    def signin_address(self) -> str | None:
        """The budget key of the address the caller signed in from, shared by that
        address's sandboxes; ``None`` when there is none (local mode)."""


@dataclass(frozen=True)
class LocalIdentity:
    """Local mode: one implicit user."""

    key: str = LOCAL_SANDBOX_KEY

    def sandbox_key(self) -> str | None:
        return self.key

    def signin_address(self) -> str | None:
        return None


class TokenIdentity:
    """Hosted mode: the sandbox key is the subject of the verified bearer token."""

    def sandbox_key(self) -> str | None:
        token = get_access_token()
        return token.subject if token is not None else None

    def signin_address(self) -> str | None:
        token = get_access_token()
        claims = (token.claims or {}) if token is not None else {}
        address = claims.get(SIGNIN_CLAIM)
        return address if isinstance(address, str) else None


def describe_failure(exc: BaseException) -> ToolFailure | None:
    """The agent-facing view of a domain error, or ``None`` for a crash.

    Every package's base error carries ``code``, ``message`` and ``details``;
    anything else is a bug and is reported as ``INTERNAL_ERROR`` by the caller.
    """
    if isinstance(exc, ServiceError | JailError | Queued):
        return ToolFailure(exc.code, exc.message, dict(exc.details))
    if isinstance(exc, PoolError):
        # Storage trouble (a zfs command, a folder): the operator's problem, told in the
        # log; its details may name host paths, so the agent gets a generic sentence.
        log.error("pool.failed", code=exc.code, message=exc.message, **exc.details)
        return ToolFailure(
            "SANDBOX_UNAVAILABLE",
            "Your sandbox could not be prepared right now; retry in a minute.",
            {},
        )
    return None


ToolBody = Callable[[CallContext], Awaitable[BaseModel]]


class _RequestIds:
    """Request ids: 32 hex digits, as ``uuid4().hex`` wrote them, in the order they are
    made: the wall clock's milliseconds (12 digits), a random number of this process
    (8), and the process's counter (12, from a random start).

    Every audit row carries one and the ``request_id`` column is indexed: random ids
    put each row of a batch in another leaf page of that index, anywhere in it, so a
    commit of 8 rows wrote some 10 scattered pages to the WAL (and their checkpoints
    later). In order they all go to its last page: on a table of 300,000 rows, the
    writer thread's CPU for a batch of 8 fell from 226 to 83 us. Unique without a
    random draw per call: the counter within a process, the process's number between
    processes (drawn again in a forked child, which would otherwise repeat its parent's).
    An id tells the operator when and which process; it grants nothing, and nothing
    looks anything up by it but an operator reading the audit trail.
    """

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._process = secrets.randbits(32)
        self._counter = itertools.count(secrets.randbits(40))

    def __call__(self) -> str:
        count = next(self._counter) & 0xFFFF_FFFF_FFFF
        return f"{time.time_ns() // 1_000_000:012x}{self._process:08x}{count:012x}"


_request_id = _RequestIds()


class AuditSink(Protocol):
    """Where the runner's audit rows go (``app.storage.audit.AuditTrail``: group commits)."""

    async def record(
        self,
        *,
        request_id: str,
        sandbox_key: str,
        tool: str,
        started: float,
        outcome: str,
        calls: int = 1,
    ) -> None:
        """Append one row standing for ``calls`` calls; returns once committed.

        Raises:
            DatabaseUnavailable: the commit that carried this row failed.
        """
        ...


class ToolRunner:
    """Runs one tool body inside the per-call context, whatever the tool."""

    def __init__(
        self,
        identity: Identity,
        audit: AuditSink,
        memory: SandboxMemory,
        pool: SlotPool,
        *,
        queue_wait_s: float,
        progress_every_s: float = 15.0,
        on_call: Callable[[str, str, float], None] | None = None,
        disk_budget: DiskBudget | None = None,
        threads: TenantThreads | None = None,
        max_calls_per_sandbox: int = DEFAULT_PER_SANDBOX,
        max_calls_per_address: int = DEFAULT_PER_ADDRESS,
        sampling: CallSampling | None = None,
    ) -> None:
        """``on_call(tool, outcome, seconds)`` hears of every call (metrics): it, not the
        ``tool.call`` log line, is what counts calls, so a level that filters the line
        costs a call no log record. ``sampling`` decides which calls get their line and
        audit row (the others are counted); by default every call does."""
        self._identity = identity
        self._on_call = on_call
        self._audit_trail = audit
        self._memory = memory
        self._pool = pool
        self._queue_wait_s = queue_wait_s
        self._progress_every_s = progress_every_s
        self._disk_budget = disk_budget
        # Each call's blocking work runs within its sandbox's share of the tenant threads.
        self.threads = threads or TenantThreads()
        # One sandbox's waiting calls must not hold every connection the server accepts.
        self.calls_in_flight = CallsInFlight(max_calls_per_sandbox, max_calls_per_address)
        self._sampling = sampling
        # The database away fails every call's row: one line a minute per reason.
        self._warnings = ThrottledLog(log)

    async def close(self) -> None:
        """Write the counts of calls not written one by one (at shutdown, before the
        audit trail closes)."""
        if self._sampling is not None:
            await self._write_counts(self._sampling.drain())
            await self._sampling.give_back()

    async def run(
        self,
        tool: str,
        body: ToolBody,
        *,
        takes_slot: bool,
        progress: Progress | None = None,
        sees_slot: bool = True,
    ) -> CallToolResult:
        """Run ``body`` for the calling sandbox key; ``takes_slot`` leases (or queues) first.

        ``sees_slot=False``: the body never touches the slot's files (``sandbox_status``
        reads the pool itself), so the held slot is not looked up for its context: on a
        shared pool that lookup is a database round trip.
        """
        request_id = _request_id()
        started = time.time()
        key = self._identity.sandbox_key()
        if key is None:
            # Fails closed: the bearer middleware should have refused the call already.
            failure = ToolFailure(
                "UNAUTHENTICATED", "Sign in again: this call has no identity.", {}
            )
            return error_result(failure, request_id)
        outcome = "ok"
        lease: Lease | None = None
        admitted = False
        address = self._identity.signin_address()
        try:
            # Before anything that waits (the queue, the body): a refused call answers at once.
            self.calls_in_flight.enter(key, address)
            admitted = True
            lease = await self._take_slot(key, progress) if takes_slot else None
            if self._disk_budget is not None:
                await self._disk_budget.before(tool, key)
            # A call that takes no slot still sees the one the caller holds, if any.
            held = lease.slot if lease else await self._pool.holding(key) if sees_slot else None
            slot_root = held.root if held else None
            ctx = new_call_context(
                self._memory,
                key,
                request_id=request_id,
                slot_root=slot_root,
                in_thread=self.threads.for_sandbox(key, address),
                signin_address=address,
            )
            output = await self._alive(tool, body(ctx), progress)
            self._pool.touch(key)  # every call is activity, however long it ran
            if lease is None:
                return ok_result(output)
            idle = int(self._pool.idle_timeout_s)
            notes = [note_text(kind, idle) for kind in lease.notes]
            return ok_result(output, notes=notes, idle_expiry_s=idle)
        except Exception as exc:
            described = describe_failure(exc)
            if described is None:
                log.exception("tool.crashed", tool=tool, request_id=request_id)
            failure = described or ToolFailure(
                "INTERNAL_ERROR",
                f"The server failed unexpectedly; retry, and report request id {request_id} "
                "if it happens again.",
                {},
            )
            outcome = failure.code
            if lease is not None and lease.notes:
                # One-time notes are gone from the pool once handed out: keep them visible.
                idle = int(self._pool.idle_timeout_s)
                failure.details["notes"] = [note_text(kind, idle) for kind in lease.notes]
            return error_result(failure, request_id)
        finally:
            if admitted:
                self.calls_in_flight.leave(key, address)
            if self._disk_budget is not None and admitted:
                self._disk_budget.after(tool, key)
            await self._finish(request_id, key, tool, started, outcome, address)

    async def read(self, resource: str, body: Callable[[CallContext], Awaitable[T]]) -> T:
        """Read a resource for the calling sandbox key; never takes a slot.

        Raises:
            ResourceNotFoundError: no identity, or the domain refused; another key's
                experiment reads exactly like one that never existed.
        """
        request_id = _request_id()
        started = time.time()
        key = self._identity.sandbox_key()
        if key is None:
            raise ResourceNotFoundError("Sign in to read sandbox resources.")
        outcome = "ok"
        address = self._identity.signin_address()
        admitted = False
        try:
            # A read holds memory until it is answered (an artifact's part, a log page):
            # counted with the calls in flight, so an address holds a bounded number.
            self.calls_in_flight.enter(key, address)
            admitted = True
            held = await self._pool.holding(key)
            ctx = new_call_context(
                self._memory,
                key,
                request_id=request_id,
                slot_root=held.root if held else None,
                in_thread=self.threads.for_sandbox(key, address),
            )
            value = await body(ctx)
            self._pool.touch(key)
            return value
        except Exception as exc:
            described = describe_failure(exc)
            if described is None:
                log.exception("resource.crashed", resource=resource, request_id=request_id)
                outcome = "INTERNAL_ERROR"
                raise ResourceNotFoundError(
                    f"The server failed unexpectedly; report request id {request_id}."
                ) from None
            outcome = described.code
            raise ResourceNotFoundError(described.message) from None
        finally:
            if admitted:
                self.calls_in_flight.leave(key, address)
            await self._finish(request_id, key, resource, started, outcome, address)

    async def _finish(
        self,
        request_id: str,
        key: str,
        name: str,
        started: float,
        outcome: str,
        address: str | None,
    ) -> None:
        elapsed = time.time() - started
        if self._on_call is not None:
            self._on_call(name, outcome, elapsed)
        sampling = self._sampling
        if sampling is not None:
            if ended := sampling.ended():
                await self._write_counts(ended)
            if not await sampling.admit(key, name, outcome, address):
                return
        if _std_log.isEnabledFor(logging.INFO):
            log.info(
                "tool.call",
                tool=name,
                request_id=request_id,
                outcome=outcome,
                ms=round(elapsed * 1000, 1),
            )
        await self._audit(request_id, key, name, started, outcome)

    async def _write_counts(self, counts: list[Unwritten[CallKey]]) -> None:
        """One line and one audit row for each count of calls not written one by one."""
        for count in counts:
            key, tool, outcome = count.key
            request_id = _request_id()
            log.info(
                "tool.calls_not_recorded",
                tool=tool,
                outcome=outcome,
                calls=count.count,
                in_s=round(count.until - count.since),
                request_id=request_id,
            )
            await self._audit(request_id, key, tool, count.since, outcome, calls=count.count)

    async def _alive(self, tool: str, work: Awaitable[T], progress: Progress | None) -> T:
        """Await ``work``, telling a client that asked for progress every ``progress_every_s``
        that the call is alive: clients reset their idle timer on each notification
        (Claude Code gives up on a silent call). If the client goes away, the call is
        cancelled; a command it started runs on as a job (``get_job_status`` finds it)."""
        if progress is None:
            return await work
        task = asyncio.ensure_future(work)
        started = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._progress_every_s)
                if done:
                    return task.result()
                waited = int(time.monotonic() - started)
                await progress(0, None, f"Still working on {tool}: {waited} s so far.")
        finally:
            if not task.done():
                task.cancel()

    async def _take_slot(self, key: str, progress: Progress | None) -> Lease:
        """Lease a slot, or wait in the queue up to ``queue_wait_s`` telling the client.

        MCP clients give up after about a minute, so the wait is bounded and the
        caller gets its queue position as a result rather than a hung call.
        """
        deadline = time.monotonic() + self._queue_wait_s
        while True:
            try:
                return await self._pool.acquire(key)
            except Queued as queued:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                if progress is not None:
                    await progress(
                        0,
                        None,
                        f"Waiting for a sandbox: number {queued.position} in the queue, "
                        f"about {queued.estimated_wait_s} s.",
                    )
                await self._pool.wait_until_granted(key, min(remaining, 5.0))

    async def _audit(
        self, request_id: str, key: str, tool: str, started: float, outcome: str, calls: int = 1
    ) -> None:
        try:
            await self._audit_trail.record(
                request_id=request_id,
                sandbox_key=key,
                tool=tool,
                started=started,
                outcome=outcome,
                calls=calls,
            )
        except DatabaseUnavailable as exc:
            # The result is already decided; losing one audit row must not fail the call.
            reason = exc.details["reason"]
            self._warnings.warning(
                "audit.write_failed", reason, request_id=request_id, reason=reason
            )
