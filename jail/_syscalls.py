"""ctypes bindings for the two Linux syscalls the stdlib lacks: openat2(2), renameat2(2).

Both raise ``OSError`` carrying only an errno (never a path), like ``os`` does.
ctypes foreign calls release the GIL, so they behave like ``os.open`` in threads.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from typing import Any

# include/uapi/linux/openat2.h
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

# include/uapi/linux/fs.h
RENAME_NOREPLACE = 0x1
RENAME_EXCHANGE = 0x2

# openat2 was added (Linux 5.6) after the syscall tables were unified, so it has
# the same number on every architecture.
_SYS_OPENAT2 = 437
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)

_libc = ctypes.CDLL(None, use_errno=True)
_syscall: Any = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
# glibc >= 2.28 wraps renameat2; without it rename_noreplace reports ENOSYS.
_renameat2: Any = getattr(_libc, "renameat2", None)
if _renameat2 is not None:
    _renameat2.restype = ctypes.c_int
    _renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p) * 2 + (ctypes.c_uint,)


class _OpenHow(ctypes.Structure):
    """``struct open_how`` from openat2(2)."""

    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


def _raise_errno() -> None:
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err))


def openat2(dir_fd: int, path: bytes, flags: int, mode: int, resolve: int) -> int:
    """openat2(2). ``mode`` is dropped unless the flags create a file (else EINVAL)."""
    if not (flags & os.O_CREAT or (_O_TMPFILE and flags & _O_TMPFILE == _O_TMPFILE)):
        mode = 0
    how = _OpenHow(flags, mode, resolve)
    fd = int(_syscall(_SYS_OPENAT2, dir_fd, path, ctypes.byref(how), ctypes.sizeof(how)))
    if fd < 0:
        _raise_errno()
    return fd


def renameat2(src_dir_fd: int, src: bytes, dst_dir_fd: int, dst: bytes, flags: int) -> None:
    """renameat2(2); ENOSYS when the C library lacks the wrapper."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    if _renameat2(src_dir_fd, src, dst_dir_fd, dst, flags) != 0:
        _raise_errno()


@functools.cache
def openat2_available() -> bool:
    """Whether this kernel (and any seccomp filter in front of it) allows openat2."""
    try:
        fd = openat2(-100, b".", os.O_PATH | os.O_CLOEXEC, 0, RESOLVE_BENEATH)  # AT_FDCWD
    except OSError as exc:
        # ENOSYS: kernel < 5.6. EPERM: container runtimes whose seccomp profile
        # predates openat2 answer EPERM rather than ENOSYS.
        return exc.errno not in (errno.ENOSYS, errno.EPERM)
    os.close(fd)
    return True
