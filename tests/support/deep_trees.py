"""Folder trees too deep for pathlib: ``root/d/d/.../d`` built with relative opens."""

from __future__ import annotations

import os
from pathlib import Path


def build_deep_tree(
    root: Path,
    depth: int,
    *,
    file_at_each_level: bool = False,
    bottom_file: tuple[str, bytes] | None = None,
) -> None:
    """``depth`` nested folders named ``d`` under the existing ``root``.

    Relative opens, because pathlib and ``os.makedirs`` recurse once per level and the
    full path is far beyond PATH_MAX. ``file_at_each_level`` adds an empty ``f`` beside
    every ``d``; ``bottom_file`` is a (name, content) written in the deepest folder.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            if file_at_each_level:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        if bottom_file is not None:
            name, content = bottom_file
            file_fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
            try:
                os.write(file_fd, content)
            finally:
                os.close(file_fd)
    finally:
        os.close(fd)
