"""The folders of containers made ahead (the warm pool's, and a sandbox's prepared one):
made with their identity, checked by it before a hand-over, deleted quietly."""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from jail.tree_delete import delete_tree

log = structlog.get_logger(__name__)


def make_folder(root: Path, owner: tuple[int, int] | None) -> tuple[int, int]:
    """``root`` (0700, the server's) and its empty ``workspace`` (the sandbox user's);
    the identity (device, inode) of ``root``."""
    root.mkdir(mode=0o700)
    workspace = root / "workspace"
    workspace.mkdir(mode=0o755)
    if owner is not None:
        os.chown(workspace, *owner)
    st = os.lstat(root)
    return (st.st_dev, st.st_ino)


def same_folder(root: Path, identity: tuple[int, int]) -> bool:
    """``root`` is still the folder made with ``identity`` (not swapped or gone)."""
    try:
        st = os.lstat(root)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == identity


def delete_quietly(root: Path, event: str) -> None:
    """Delete ``root``; a failure is logged as ``event``, never raised."""
    try:
        delete_tree(root)
    except OSError:
        log.warning(event, path=str(root))
