"""Map an errno from a jailed operation to a JailError about a sandbox-relative path.

Only ``exc.errno`` is used; ``exc.filename`` and ``exc.strerror`` may name host
paths and never reach a message.
"""

from __future__ import annotations

import errno

from jail._paths import quote
from jail.errors import ErrorCode, JailError

_MESSAGES: dict[int, tuple[ErrorCode, str]] = {
    # Callers' paths are normalised first (``_paths``), so the only way the
    # kernel sees an escape is through a symbolic link.
    errno.EXDEV: (
        "SYMLINK_ESCAPE",
        "{p} goes through a symbolic link that leads outside the sandbox; "
        "links are followed only while they stay inside.",
    ),
    errno.ELOOP: (
        "SYMLINK_UNRESOLVABLE",
        "{p} goes through a symbolic link that cannot be resolved "
        "(a loop, a chain of more than 40 links, or a kernel magic link).",
    ),
    errno.ENOENT: ("NOT_FOUND", "{p} does not exist; list its folder to see what is there."),
    errno.ENOTDIR: (
        "NOT_A_DIRECTORY",
        "{p}, or a folder on its way, exists but is not a folder.",
    ),
    errno.EISDIR: ("IS_A_DIRECTORY", "{p} is a folder, not a file."),
    # open(2) on a socket, or O_WRONLY|O_NONBLOCK on a FIFO with no reader.
    errno.ENXIO: ("NOT_A_REGULAR_FILE", "{p} is a special file; only regular files are used."),
    errno.EEXIST: ("ALREADY_EXISTS", "{p} already exists; remove it first or pick another name."),
    errno.ENOTEMPTY: (
        "DIRECTORY_NOT_EMPTY",
        "{p} is a folder that is not empty; remove it recursively or empty it first.",
    ),
    errno.EACCES: ("PERMISSION_DENIED", "Permission to {p} was denied."),
    errno.EPERM: ("PERMISSION_DENIED", "The operation on {p} is not permitted."),
    errno.EROFS: ("PERMISSION_DENIED", "{p} is on a read-only file system."),
    errno.ENOSPC: ("NO_SPACE", "The sandbox is out of space; delete files and retry."),
    errno.EDQUOT: ("NO_SPACE", "The sandbox quota is used up; delete files and retry."),
    errno.EFBIG: ("TOO_LARGE", "{p} would exceed the largest file size allowed."),
    errno.EAGAIN: ("PATH_BUSY", "{p} kept changing while it was being opened; retry the call."),
    errno.ENAMETOOLONG: ("INVALID_PATH", "{p} is too long once its links are expanded."),
}


def translate(exc: OSError, path: str) -> JailError:
    """The JailError for ``exc`` raised while working on sandbox path ``path``."""
    return for_errno(exc.errno or 0, path)


def for_errno(code: int, path: str) -> JailError:
    """The JailError an ``errno`` stands for, about sandbox path ``path``."""
    found = _MESSAGES.get(code)
    if found is None:
        name = errno.errorcode.get(code, "unknown error")
        return JailError(
            "IO_ERROR",
            f"{quote(path)} could not be accessed ({name}); retry or use another path.",
            {"path": path, "errno": name},
        )
    error_code, template = found
    return JailError(error_code, template.format(p=quote(path)), {"path": path})
