"""count_cloned_files: counts a clone without recursing and refuses trees the copy cannot take."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.experiments.core.errors import ProjectSourceError
from app.experiments.workspace.dirs import MAX_CLONE_DEPTH, MAX_CLONE_PATH, count_cloned_files


def nest(root: Path, depth: int, name: str = "d") -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def test_files_are_counted_without_git_metadata(tmp_path: Path) -> None:
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "a.py").write_text("")
    (tmp_path / "README").write_text("")
    (tmp_path / "link").symlink_to("/etc")  # a link is a file here, never followed
    assert count_cloned_files(tmp_path) == 3


def test_the_deepest_allowed_tree_is_counted(tmp_path: Path) -> None:
    nest(tmp_path, MAX_CLONE_DEPTH)
    assert count_cloned_files(tmp_path) == 0


@pytest.mark.parametrize("depth", [MAX_CLONE_DEPTH + 1, 5_000])
def test_a_tree_deeper_than_the_limit_is_refused(tmp_path: Path, depth: int) -> None:
    nest(tmp_path, depth)
    with pytest.raises(ProjectSourceError, match="levels deep"):
        count_cloned_files(tmp_path)
    from jail.tree_delete import delete_tree

    for entry in tmp_path.iterdir():
        delete_tree(entry)  # pytest's own cleanup would recurse


def test_a_path_longer_than_the_limit_is_refused(tmp_path: Path) -> None:
    nest(tmp_path, MAX_CLONE_PATH // 200 + 1, name="x" * 199)
    with pytest.raises(ProjectSourceError, match="longer than"):
        count_cloned_files(tmp_path)
