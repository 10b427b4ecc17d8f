"""sandbox-mcp: jail.

Path confinement, symlink checks, per-call context, snapshot filter and
environment policy. Imports nothing of ours (only the stdlib and structlog).
"""

from jail.context import (
    CallContext,
    EditState,
    ProjectMapCache,
    SandboxMemory,
    new_call_context,
)
from jail.env_policy import is_credential_shaped, resolve_env
from jail.errors import ErrorCode, JailError
from jail.fs import Jail, PathInfo
from jail.snapshot import SnapshotReport, snapshot_copy

__all__ = [
    "CallContext",
    "EditState",
    "ErrorCode",
    "Jail",
    "JailError",
    "PathInfo",
    "ProjectMapCache",
    "SandboxMemory",
    "SnapshotReport",
    "is_credential_shaped",
    "new_call_context",
    "resolve_env",
    "snapshot_copy",
]
