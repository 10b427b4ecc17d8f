"""The per-call context: which sandbox a tool call acts for, built by the tool runner.

One mechanism carries it: explicit passing. The runner (``app/mcp/runner.py``)
builds a ``CallContext`` for each call and hands it to the tool's body, which
passes it on to every domain call that needs identity; tools never take identity
from their arguments, and nothing reads it from ambient state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, Protocol, TypeVar

from jail.memory import EditState, ProjectMapCache, SandboxMemory

__all__ = [
    "CallContext",
    "EditState",
    "InThread",
    "ProjectMapCache",
    "SandboxMemory",
    "new_call_context",
]

P = ParamSpec("P")
T = TypeVar("T")


class InThread(Protocol):
    """Runs a blocking callable in a worker thread on behalf of one sandbox."""

    async def __call__(self, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...


async def _default_executor(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Contexts built without a sandbox's thread share (tests): the loop's executor."""
    return await asyncio.to_thread(func, *args, **kwargs)


@dataclass(frozen=True)
class CallContext:
    """Everything one tool call may know about who it acts for.

    Attributes:
        sandbox_key: the caller's sandbox key (from its bearer token).
        request_id: correlates logs and audit rows of this call.
        slot_root: the leased slot's folder, or None before a slot is leased.
        edit_state: the sandbox's edit state (shared across its calls).
        project_map: the sandbox's cached project map (shared across its calls).
        in_thread: runs the call's blocking work (file walks and reads) in a worker
            thread within the sandbox's share (app/tenancy/threads.py), never
            on the loop's default executor, which the server's upkeep keeps.
        signin_address: the budget key of the address the caller signed in from
            (``auth.grants.SIGNIN_CLAIM``), shared by that address's sandboxes; None
            when there is none (local mode).
    """

    sandbox_key: str
    request_id: str
    slot_root: Path | None
    edit_state: EditState
    project_map: ProjectMapCache
    in_thread: InThread = _default_executor
    signin_address: str | None = None


def new_call_context(
    memory: SandboxMemory,
    sandbox_key: str,
    *,
    request_id: str,
    slot_root: Path | None,
    in_thread: InThread = _default_executor,
    signin_address: str | None = None,
) -> CallContext:
    """A CallContext wired to the sandbox's shared edit state, project map and threads."""
    edit_state, project_map = memory.get(sandbox_key)
    return CallContext(
        sandbox_key=sandbox_key,
        request_id=request_id,
        slot_root=slot_root,
        edit_state=edit_state,
        project_map=project_map,
        in_thread=in_thread,
        signin_address=signin_address,
    )
