"""The MCP Tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663): long calls
answer at once with a task the client polls, instead of holding the line.

When a 2026-07-28 client declares the extension in its request's capabilities, a
long call becomes a task: ``execute_experiment`` (unless ``background``, which
answers at once anyway), ``run_tests``, and ``create_experiment`` with
``setup_commands``. The call goes on in the background, to its command's own
timeout (no ``SYNC_WAIT_S`` cut-off: nobody is waiting on the line), and
``tasks/get`` answers how it stands and, once done, the ``CallToolResult`` the
call would have returned. ``tasks/cancel`` cancels the call, which kills its
command. Every other call, and every call from a client that did not declare the
extension, is served as before.

A task is scoped to its caller's sandbox key like a job: another key's task id
reads exactly like one that never existed (``-32602``, "Task not found").

The call learns it runs as a task from a context variable set here, read by the
tool layer (``running_as_task``) to wait to the end and send no progress (the
response that would carry it is gone). Like the bearer token the caller's
identity is read from, it reaches the background call because ``asyncio``
copies the context into the task it creates.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

import structlog
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolRequestParams, RequestParams
from mcp_types.methods import serialize_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

from app.mcp.runner import Identity
from app.mcp.tasks.mirror import TaskMirror
from app.mcp.tasks.store import TaskRecord, TaskStore

log = structlog.get_logger(__name__)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

# What tasks/get suggests between polls: a command's result is rarely needed sooner.
POLL_INTERVAL_MS = 2000
# How long tasks/cancel waits for the call to wind down (its command killed, recorded).
CANCEL_WAIT_S = 15.0

_as_task: contextvars.ContextVar[bool] = contextvars.ContextVar("as_task", default=False)


def running_as_task() -> bool:
    """Whether the current tool call is served as an MCP task."""
    return _as_task.get()


# The long calls, and when each is long enough to be a task (by its arguments).
LONG_CALLS: Mapping[str, Callable[[Mapping[str, Any]], bool]] = {
    "execute_experiment": lambda arguments: arguments.get("background") is not True,
    "run_tests": lambda arguments: True,
    "create_experiment": lambda arguments: bool(arguments.get("setup_commands")),
}

TaskId = Annotated[str, Field(min_length=1, max_length=100)]


class TaskParams(RequestParams):
    task_id: TaskId


class UpdateTaskParams(RequestParams):
    task_id: TaskId
    input_responses: dict[str, Any]


class TasksExtension(Extension):
    identifier = TASKS_EXTENSION

    def __init__(
        self, identity: Identity, store: TaskStore, mirror: TaskMirror | None = None
    ) -> None:
        self._identity = identity
        self._store = store
        self._mirror = mirror  # tasks of the other server processes on this database

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", TaskParams, self._get, modern),
            MethodBinding("tasks/update", UpdateTaskParams, self._update, modern),
            MethodBinding("tasks/cancel", TaskParams, self._cancel, modern),
        ]

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        key = self._identity.sandbox_key()
        if key is None or not _wants_task(params, ctx):
            return await call_next(ctx)
        record = self._store.open(key, params.name)
        if record is None:
            # No room for one more (see TaskStore): the call is served on the line.
            log.info("task.store_full", tool=params.name)
            return await call_next(ctx)
        token = _as_task.set(True)
        try:
            # The context (bearer token, _as_task) is copied into the task here.
            work = asyncio.create_task(
                self._drive(record, ctx, call_next), name=f"task-{record.task_id[:8]}"
            )
        finally:
            _as_task.reset(token)
        record.work = work
        # A task cancelled before it ever ran never reaches _drive's handlers.
        work.add_done_callback(lambda _: self._store.finish(record, "cancelled"))
        if self._mirror is not None:
            await self._mirror.opened(record)
        log.info("task.created", task=record.task_id[:8], tool=params.name)
        return {"resultType": "task", **self._wire(record)}

    async def _drive(
        self, record: TaskRecord, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> None:
        try:
            outcome = await call_next(ctx)
            result = serialize_server_result("tools/call", ctx.protocol_version, _dump(outcome))
        except asyncio.CancelledError:
            self._store.finish(
                record, "cancelled", message="Cancelled; its command, if any, was killed."
            )
            return
        except MCPError as exc:
            error = exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)
            self._store.finish(record, "failed", error=error, message=exc.error.message)
            return
        except Exception:
            log.exception("task.crashed", task=record.task_id[:8], tool=record.tool)
            self._store.finish(
                record,
                "failed",
                error={"code": INTERNAL_ERROR, "message": "Internal error"},
                message="The server failed unexpectedly; retry the call.",
            )
            return
        self._store.finish(record, "completed", result=result)
        log.info("task.completed", task=record.task_id[:8], tool=record.tool)

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        record = await self._lookup(ctx, params.task_id)
        answer: dict[str, Any] = {"resultType": "complete", **self._wire(record)}
        if record.status == "completed":
            answer["result"] = record.result
        elif record.status == "failed":
            answer["error"] = record.error
        return answer

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> dict[str, Any]:
        # Our tasks never ask for input, so no key is ever outstanding: the spec says
        # to ignore responses to keys that are not, and to acknowledge.
        await self._lookup(ctx, params.task_id)
        return {"resultType": "complete"}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> dict[str, Any]:
        record = await self._lookup(ctx, params.task_id)
        work = record.work
        if work is None and not record.finished and self._mirror is not None:
            # Served by another process: it cancels when it sees the request.
            await self._mirror.cancel_elsewhere(record.sandbox_key, record.task_id, CANCEL_WAIT_S)
            log.info("task.cancel_requested", task=record.task_id[:8], tool=record.tool)
        elif work is not None and not record.finished:
            work.cancel()
            # Answer once the command is dead where possible (asyncio.wait never
            # cancels what it waits on); cancellation stays eventually consistent.
            await asyncio.wait({work}, timeout=CANCEL_WAIT_S)
            log.info("task.cancelled", task=record.task_id[:8], tool=record.tool)
        return {"resultType": "complete"}

    async def _lookup(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> TaskRecord:
        require_client_extension(ctx, TASKS_EXTENSION)
        key = self._identity.sandbox_key()
        record = self._store.get(key, task_id) if key is not None else None
        if record is None and key is not None and self._mirror is not None:
            record = await self._mirror.lookup(key, task_id)
        if record is None:
            keep = int(self._store.keep_s)
            raise MCPError(
                code=INVALID_PARAMS,
                message=(
                    "Failed to retrieve task: Task not found. A finished task is kept "
                    f"{keep} s; its command's job is still listed by get_experiment."
                ),
            )
        return record

    def _wire(self, record: TaskRecord) -> dict[str, Any]:
        """The spec's ``Task`` fields."""
        ttl = self._store.ttl_s(record)
        task: dict[str, Any] = {
            "taskId": record.task_id,
            "status": record.status,
            "createdAt": _iso(record.created_at),
            "lastUpdatedAt": _iso(record.updated_at),
            "ttlMs": None if ttl is None else int(ttl * 1000),
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        if record.status_message is not None:
            task["statusMessage"] = record.status_message
        return task


def _wants_task(params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any]) -> bool:
    """A long call, from a client that declared the extension on this request (the
    result shape is 2026-07-28 vocabulary: an older wire cannot carry it)."""
    long_enough = LONG_CALLS.get(params.name)
    if long_enough is None or ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    declared = (capabilities.extensions if capabilities else None) or {}
    return TASKS_EXTENSION in declared and long_enough(params.arguments or {})


def _dump(outcome: HandlerResult) -> dict[str, Any]:
    if isinstance(outcome, BaseModel):
        return outcome.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(outcome or {})


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")
