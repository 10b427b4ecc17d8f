"""The per-call context: which sandbox a tool call acts for, set by the tool wrapper.

Tools take identity only from ``current_call()``, never from their arguments.
The value lives in a ``ContextVar``, so concurrent asyncio tasks each see their
own, and ``asyncio.to_thread`` carries it into the worker thread. With no
context bound, ``current_call()`` fails closed (NO_CALL_CONTEXT) rather than
falling back to some default sandbox.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from jail.errors import JailError
from jail.memory import EditState, ProjectMapCache, SandboxMemory

__all__ = [
    "CallContext",
    "EditState",
    "ProjectMapCache",
    "SandboxMemory",
    "bind_call",
    "current_call",
    "new_call_context",
]


@dataclass(frozen=True)
class CallContext:
    """Everything one tool call may know about who it acts for.

    Attributes:
        sandbox_key: the caller's sandbox key (from its bearer token).
        request_id: correlates logs and audit rows of this call.
        slot_root: the leased slot's folder, or None before a slot is leased.
        edit_state: the sandbox's edit state (shared across its calls).
        project_map: the sandbox's cached project map (shared across its calls).
    """

    sandbox_key: str
    request_id: str
    slot_root: Path | None
    edit_state: EditState
    project_map: ProjectMapCache


_current: ContextVar[CallContext | None] = ContextVar("sandbox_mcp_call", default=None)


def current_call() -> CallContext:
    """The context of the tool call in progress.

    Raises:
        JailError: NO_CALL_CONTEXT when called outside ``bind_call``.
    """
    ctx = _current.get()
    if ctx is None:
        raise JailError(
            "NO_CALL_CONTEXT",
            "This operation ran outside a tool call, so it has no sandbox; it was refused.",
        )
    return ctx


@contextmanager
def bind_call(ctx: CallContext) -> Iterator[CallContext]:
    """Make ``ctx`` the current call for the duration of the ``with`` block."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def new_call_context(
    memory: SandboxMemory, sandbox_key: str, *, request_id: str, slot_root: Path | None
) -> CallContext:
    """A CallContext wired to the sandbox's shared edit state and project map."""
    edit_state, project_map = memory.get(sandbox_key)
    return CallContext(
        sandbox_key=sandbox_key,
        request_id=request_id,
        slot_root=slot_root,
        edit_state=edit_state,
        project_map=project_map,
    )
