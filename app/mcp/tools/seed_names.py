"""Seed 001's parameter names, translated to ours at the tool layer.

The single-user Sandbox MCP (seed 001) named the same things differently
(``objective`` for ``goal``, ``base_image`` for ``image``, ``timeout`` for
``timeout_s``, ``memory_limit="1g"`` for ``memory_mb=1024``...). Every tool takes
both, so a client written for the seed works unchanged; this module turns the
seed's values into ours, and refuses, with a sentence saying which to keep, a
call that gives both names of one thing with different values.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from app.errors import InvalidArgument, ServiceError
from app.experiments.core.states import State
from app.runtime.backend import WORKSPACE, NetworkMode
from jail import Jail, JailError
from jail.context import InThread

T = TypeVar("T")

SeedNetworkMode = Literal["none", "restricted", "enabled"]
MountStrategy = Literal["COPY_TO_SANDBOX", "READ_ONLY_BIND_MOUNT"]

MEMORY_FORMS = "a number of bytes, or a number with k, m, g or t (e.g. '512m', '1g', '2GB')"
_MEMORY = re.compile(r"(\d{1,12}(?:\.\d{1,6})?)\s*(?:([kmgt])(?:i?b|i)?|b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


class NotOffered(ServiceError):
    """A seed option this server does not offer (yet)."""

    code = "NOT_SUPPORTED"


def pick(ours: tuple[str, T | None], seeds: tuple[str, T | None]) -> T | None:
    """The value given under either name; both names with different values are refused."""
    (our_name, our_value), (seed_name, seed_value) = ours, seeds
    if our_value is not None and seed_value is not None and our_value != seed_value:
        raise InvalidArgument(
            f"{our_name} and {seed_name} are two names for the same setting and were given "
            f"different values; keep one of them ({seed_name} is the single-user Sandbox "
            "MCP's name, accepted for compatibility).",
            field=seed_name,
        )
    return our_value if our_value is not None else seed_value


def timeout(timeout_s: float | None, seed_timeout: float | None) -> float | None:
    """The wall clock asked for as ``timeout_s`` or as the seed's ``timeout``."""
    return pick(("timeout_s", timeout_s), ("timeout", seed_timeout))


def memory_mb(memory_limit: str | int) -> int:
    """``memory_limit`` in whole megabytes (rounded up; 1k = 1024 bytes, as Docker counts)."""
    if isinstance(memory_limit, bool):
        raise _bad_memory()
    if isinstance(memory_limit, int):
        size = float(memory_limit)
    else:
        match = _MEMORY.fullmatch(memory_limit.strip()) if len(memory_limit) <= 32 else None
        if match is None:
            raise _bad_memory()
        size = float(match[1]) * _UNITS[(match[2] or "").lower()]
    if not (math.isfinite(size) and size > 0):
        raise _bad_memory()
    return max(1, math.ceil(size / 1024**2))


def _bad_memory() -> InvalidArgument:
    return InvalidArgument(f"memory_limit must be {MEMORY_FORMS}.", field="memory_limit")


def network(ours: NetworkMode | None, seeds: SeedNetworkMode | None) -> NetworkMode:
    """Our network mode for ``network`` and/or the seed's ``network_mode``."""
    # "restricted" is ours too: egress only to allow-listed names, through the proxy
    # (refused with EGRESS_DISABLED where the server runs none).
    translated: NetworkMode | None = {
        "none": "none",
        "enabled": "egress",
        "restricted": "restricted",
        None: None,
    }[seeds]
    return pick(("network", ours), ("network_mode", translated)) or "none"


def copy_only(mount_strategy: MountStrategy | None) -> None:
    """This server always copies the project in; a read-only bind mount is refused."""
    if mount_strategy == "READ_ONLY_BIND_MOUNT":
        raise NotOffered(
            "mount_strategy 'READ_ONLY_BIND_MOUNT' is not offered: this server always copies "
            "the project into the sandbox (COPY_TO_SANDBOX), so nothing in a sandbox can "
            "reach a host folder; omit mount_strategy or pass 'COPY_TO_SANDBOX'.",
            field="mount_strategy",
        )


def state_filter(status: str | None) -> State | None:
    """The state ``status`` names, in any case; None for no filter."""
    if status is None:
        return None
    try:
        return State(status.strip().upper())
    except ValueError:
        shown = ", ".join(state.value.lower() for state in State)
        raise InvalidArgument(f"status must be one of {shown}.", field="status") from None


def check_labels(labels: Mapping[str, str], experiment_ids: Sequence[str]) -> None:
    strays = [key for key in labels if key not in experiment_ids]
    if strays:
        raise InvalidArgument(
            f"labels names {len(strays)} experiment(s) not in experiment_ids; label only the "
            "experiments you compare.",
            field="labels",
        )


async def in_workdir(
    in_thread: InThread, workspace: Path, workdir: str | None, command: str
) -> str:
    """``command`` made to start in ``workdir``, a folder of the workspace (resolved in
    a thread of the caller's share, ``in_thread``).

    The folder is resolved through the jail (relative, no climbing out, links only
    while they stay inside) and must exist. It is entered by the shell itself
    (``cd``) in the container: if a process there swaps the folder for a link
    meanwhile, the command merely starts where that link leads inside its own
    container, which it could ``cd`` to anyway.
    """
    if workdir is None:
        return command
    folder = await in_thread(_workspace_folder, workspace, workdir)
    if folder == ".":
        return command
    return f"cd -- {shlex.quote(f'{WORKSPACE}/{folder}')} || exit 1\n{command}"


def _workspace_folder(workspace: Path, workdir: str) -> str:
    try:
        with Jail.open(workspace) as jail:
            info = jail.stat(workdir, follow_symlinks=True)
    except JailError as exc:
        if exc.code in ("PATH_OUTSIDE_SANDBOX", "INVALID_PATH", "SYMLINK_ESCAPE"):
            raise InvalidArgument(
                f"workdir: {exc.message} It is a folder relative to /workspace.",
                field="workdir",
                reason=exc.code,
            ) from None
        raise
    if info.kind != "dir":
        raise InvalidArgument(
            "workdir is not a folder of the workspace; list_sandbox_files shows them.",
            field="workdir",
        )
    return info.path
