"""Ask ext2/3/4 to spread a folder's subfolders over the disk (``chattr +T``).

Why: ext4 without a journal (this project's CI disk, many VM images) skips inodes
freed in the last 5-35 seconds when it allocates one (``recently_deleted()`` in
fs/ext4/ialloc.c), scanning past each of them for every new file. A slot runs
experiments one after the other: the destroyed one's 10,000 inodes are freed in
the background while the next one's 10,000 are made in the same block group, so
each create scans all of them and a 5,000-file project takes seconds instead of
a tenth of one. With the "top of directory hierarchy" flag on the slot root,
ext4's Orlov allocator places each new experiment folder in its own block group
(chosen by a hash of its name), away from what was just freed.

Only a placement hint: nothing changes in what the folders hold or who may read
them, and a file system without the flag (ZFS, tmpfs, btrfs, ...) is left as is.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
from pathlib import Path

# include/uapi/linux/fs.h (the kernel reads and writes an int despite the _IOR(long))
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_TOPDIR_FL = 0x00020000

# What a file system without these flags (or a sandboxed ioctl) answers.
_UNSUPPORTED = (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, errno.EPERM)


def spread_subfolders(folder: Path) -> bool:
    """Set the flag on ``folder`` (a folder the server made); True if it is set now.

    Never raises for a file system that lacks the flag; a missing folder raises
    ``FileNotFoundError`` like any other open would.
    """
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        flags = array.array("i", [0])
        try:
            fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
            if flags[0] & FS_TOPDIR_FL:
                return True
            flags[0] |= FS_TOPDIR_FL
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, False)
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                return False
            raise
        return True
    finally:
        os.close(fd)
