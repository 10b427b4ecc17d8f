"""The per-call context: which sandbox a tool call acts for, built by the tool runner.

One mechanism carries it: explicit passing. The runner (``app/mcp/runner.py``)
builds a ``CallContext`` for each call and hands it to the tool's body, which
passes it on to every domain call that needs identity; tools never take identity
from their arguments, and nothing reads it from ambient state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jail.memory import EditState, ProjectMapCache, SandboxMemory

__all__ = [
    "CallContext",
    "EditState",
    "ProjectMapCache",
    "SandboxMemory",
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
