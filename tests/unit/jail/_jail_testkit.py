"""Helpers shared by the jail tests (imported by name: pytest puts this folder on sys.path).

Kept out of conftest.py so that test modules never ``import conftest``, which
would pick up whichever conftest another test folder loaded last.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

CANARY_SECRET = b"OUTSIDE-CANARY-SECRET-7f3a"
SIBLING_SECRET = b"SIBLING-SANDBOX-SECRET-91c2"

TreeState = dict[str, tuple[object, ...]]


@dataclass(frozen=True)
class Layout:
    base: Path
    root: Path  # the sandbox under test
    canary: Path  # outside every sandbox
    sibling: Path  # another tenant's sandbox


def tree_state(top: Path) -> TreeState:
    """Everything observable beneath ``top``: kinds, content hashes, modes, mtimes, atimes.

    Files are read with O_NOATIME, so taking the state does not itself look like
    a read; any other read of a canary file moves its atime (see ``layout``).
    """
    state: TreeState = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            st = path.lstat()
            rel = str(path.relative_to(top))
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(path, os.O_RDONLY | os.O_NOATIME)
                with os.fdopen(fd, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                state[rel] = ("file", digest, st.st_mode, st.st_mtime_ns, st.st_atime_ns)
            else:
                state[rel] = ("other", st.st_mode, st.st_mtime_ns)
    return state
