"""delete_tree: deep trees, links never followed, locked folders, stop."""

from __future__ import annotations

import os
import resource
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from deep_trees import build_deep_tree

from jail.tree_delete import DeleteStopped, delete_tree, delete_tree_at


@pytest.fixture(autouse=True)
def _no_deep_leftovers(tmp_path: Path) -> Iterator[None]:
    # pytest deletes old tmp dirs with shutil.rmtree, which a deep tree left by a
    # failed test would break for every later run on this machine.
    yield
    for entry in tmp_path.iterdir():
        delete_tree(entry)


def _deep_tree(top: Path, depth: int) -> None:
    """``top/d/d/.../d`` with a file at every level."""
    top.mkdir()
    build_deep_tree(top, depth, file_at_each_level=True)


@pytest.mark.parametrize("depth", [1_500, 5_000])
def test_deletes_a_tree_deeper_than_recursion_and_descriptor_limits(
    tmp_path: Path, depth: int
) -> None:
    top = tmp_path / "deep"
    _deep_tree(top, depth)
    if depth == 5_000:
        # Deeper than the recursion limit and the descriptor limit: rmtree fails.
        assert depth > sys.getrecursionlimit()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    delete_tree(top)
    assert not top.exists()
    assert list(tmp_path.iterdir()) == []
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft


def test_stdlib_rmtree_fails_on_the_same_tree(tmp_path: Path) -> None:
    # The reason this module exists: if rmtree ever copes, it can replace it.
    top = tmp_path / "deep"
    _deep_tree(top, 1_500)
    with pytest.raises((RecursionError, OSError)):
        shutil.rmtree(top)
    delete_tree(top)
    assert not top.exists()


def test_links_are_removed_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    top = tmp_path / "tree"
    (top / "a").mkdir(parents=True)
    (top / "a" / "to_dir").symlink_to(outside, target_is_directory=True)
    (top / "to_file").symlink_to(outside / "keep.txt")
    (top / "dangling").symlink_to(tmp_path / "nowhere")
    delete_tree(top)
    assert not top.exists()
    assert (outside / "keep.txt").read_text() == "precious"


def test_top_level_link_to_a_folder_removes_only_the_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(outside)
    delete_tree(link)
    assert not link.is_symlink()
    assert (outside / "keep.txt").exists()


def _as_unprivileged_owner(top: Path, action: Callable[[int], None]) -> None:
    """Run ``action(parent_fd)`` in a child process as the uid owning ``top``
    (root bypasses modes, so the unlock path is only exercised without it)."""
    uid = 65534
    if os.geteuid() == 0:
        for base, folders, names in os.walk(top):
            for name in [*folders, *names]:
                os.chown(os.path.join(base, name), uid, uid, follow_symlinks=False)
        os.chown(top, uid, uid)
    parent_fd = os.open(top.parent, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            if os.geteuid() == 0:
                os.setgid(uid)
                os.setuid(uid)
            action(parent_fd)
            code = 0
        except BaseException as exc:
            print("child failed:", repr(exc))
        finally:
            os._exit(code)
    os.close(parent_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_locked_folders_are_unlocked_and_deleted(tmp_path: Path) -> None:
    home = tmp_path / "home"  # the unprivileged owner may remove entries here
    home.mkdir()
    if os.geteuid() == 0:
        os.chown(home, 65534, 65534)
    top = home / "tree"
    (top / "readonly" / "inner").mkdir(parents=True)
    (top / "readonly" / "file").write_text("x")
    (top / "readonly" / "inner" / "file").write_text("x")
    (top / "sealed").mkdir()
    (top / "sealed" / "file").write_text("x")
    os.chmod(top / "readonly" / "inner", 0o500)
    os.chmod(top / "readonly", 0o500)
    os.chmod(top / "sealed", 0o000)
    _as_unprivileged_owner(top, lambda fd: delete_tree_at(fd, "tree"))
    assert not top.exists()


def test_unprivileged_delete_of_another_users_tree_raises_oserror(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    (top / "sealed").mkdir(parents=True)
    (top / "sealed" / "file").write_text("x")
    os.chmod(top / "sealed", 0o000)
    if os.geteuid() != 0:
        pytest.fail("needs root to own the tree as someone else")  # the suite runs as root

    def attempt(fd: int) -> None:
        os.setgid(65533)
        os.setuid(65533)
        try:
            delete_tree_at(fd, "tree")
        except OSError:
            return
        raise AssertionError("deleted a tree it does not own")

    pid = os.fork()
    parent_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            attempt(parent_fd)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    os.close(parent_fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (top / "sealed" / "file").exists()


def test_locked_folders_are_deleted_as_root_too(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    (top / "sealed").mkdir(parents=True)
    (top / "sealed" / "file").write_text("x")
    os.chmod(top / "sealed", 0o000)
    os.chmod(top, 0o500)
    delete_tree(top)
    assert not top.exists()


def test_missing_path_is_fine_and_files_are_unlinked(tmp_path: Path) -> None:
    delete_tree(tmp_path / "absent")
    (tmp_path / "plain").write_text("x")
    delete_tree(tmp_path / "plain")
    assert list(tmp_path.iterdir()) == []


def test_wide_folder_is_linear(tmp_path: Path) -> None:
    top = tmp_path / "wide"
    top.mkdir()
    for i in range(3_000):
        (top / f"d{i}").mkdir()
    delete_tree(top)
    assert not top.exists()


def test_stop_leaves_the_rest_on_disk(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    _deep_tree(top, 50)
    stop = threading.Event()
    stop.set()
    with pytest.raises(DeleteStopped):
        delete_tree(top, stop=stop)
    assert top.exists()
    delete_tree(top)
    assert not top.exists()


def test_relative_to_an_open_folder(tmp_path: Path) -> None:
    (tmp_path / "x" / "y").mkdir(parents=True)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        delete_tree_at(fd, "x")
    finally:
        os.close(fd)
    assert not (tmp_path / "x").exists()


def test_jail_recursive_remove_of_a_deep_tree(tmp_path: Path) -> None:
    from jail import Jail

    _deep_tree(tmp_path / "deep", 1_500)
    with Jail.open(tmp_path) as jail:
        jail.remove("deep", recursive=True)
    assert not (tmp_path / "deep").exists()
