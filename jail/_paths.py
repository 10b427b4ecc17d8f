"""Lexical checks on sandbox-relative path strings, before the kernel sees them.

A path is normalised the way ``posixpath.normpath`` would (``a/./b/../c`` ->
``a/c``), so ``..`` never reaches the kernel from a caller: a ``..`` that climbs
above the root is refused here as PATH_OUTSIDE_SANDBOX, and any escape the kernel
reports later can only come from a symbolic link (SYMLINK_ESCAPE). Everything
else, including ``%2e%2e``, backslashes and Unicode look-alikes of ``.`` and
``/``, is a literal file name: Linux gives those bytes no special meaning.

Safety does not rest on this module. Resolution itself is done by the kernel
relative to the root's descriptor (see ``_resolve``); this only yields clearer
errors and a canonical form for edit-state keys.
"""

from __future__ import annotations

import os

from jail.errors import JailError

ROOT = "."
# limits.h: PATH_MAX counts the terminating NUL; NAME_MAX is per component, in bytes.
PATH_MAX = 4096
NAME_MAX = 255
_SHOWN_CHARS = 120


def quote(raw: str) -> str:
    """Render a caller-supplied path for a message: quoted, escaped, truncated."""
    if len(raw) > _SHOWN_CHARS:
        raw = raw[:_SHOWN_CHARS] + "..."
    return repr(raw)


def normalize(raw: str) -> str:
    """Return the canonical sandbox-relative form of ``raw`` ("." for the root).

    Raises:
        JailError: INVALID_PATH (empty, NUL byte, unencodable, over-long path or
            component) or PATH_OUTSIDE_SANDBOX (absolute, or ``..`` above the root).
    """
    if not isinstance(raw, str) or not raw:
        raise _invalid(raw, "is empty or not a string; pass a path relative to the sandbox root")
    if "\x00" in raw:
        raise _invalid(raw, "contains a NUL byte, which no file name can hold")
    try:
        encoded = os.fsencode(raw)
    except UnicodeEncodeError:
        raise _invalid(raw, "contains characters that cannot be encoded as a file name") from None
    if len(encoded) >= PATH_MAX:
        raise _invalid(raw, f"is longer than {PATH_MAX - 1} bytes; use a shorter path")
    if raw.startswith("/"):
        # Not echoed: a message never holds an absolute path, whoever wrote it.
        raise JailError(
            "PATH_OUTSIDE_SANDBOX",
            "Absolute paths are refused; paths are relative to the sandbox root, "
            "so drop the leading '/'.",
        )
    parts: list[str] = []
    for part in raw.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise JailError(
                    "PATH_OUTSIDE_SANDBOX",
                    f"{quote(raw)} climbs above the sandbox root with '..'; "
                    "use a path that stays inside the sandbox.",
                    {"path": raw},
                )
            parts.pop()
            continue
        if len(os.fsencode(part)) > NAME_MAX:
            raise _invalid(raw, f"has a component longer than {NAME_MAX} bytes")
        parts.append(part)
    return "/".join(parts) or ROOT


def split_parent(path: str) -> tuple[str, str]:
    """Split a normalised, non-root path into (parent folder, final name)."""
    parent, _, name = path.rpartition("/")
    return (parent or ROOT, name)


def join(parent: str, name: str) -> str:
    """Join a normalised folder path and an entry name."""
    return name if parent == ROOT else f"{parent}/{name}"


def _invalid(raw: object, reason: str) -> JailError:
    shown = quote(raw) if isinstance(raw, str) and raw else "The path"
    return JailError("INVALID_PATH", f"{shown} {reason}.", {"path": str(raw)[:_SHOWN_CHARS]})
