"""Behaviour of the Jail API on ordinary (non-hostile) trees, under both resolvers."""

from __future__ import annotations

import errno
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import pytest
from _jail_testkit import Layout

from jail import Jail, JailError, _syscalls
from jail._resolve import KernelResolver, make_resolver
from jail._walk_resolver import WalkResolver
from jail.fs import PathInfo


def code_of(excinfo: pytest.ExceptionInfo[JailError]) -> str:
    return excinfo.value.code


def test_write_then_read_round_trips(jail: Jail, layout: Layout) -> None:
    jail.write_bytes("notes.txt", b"hello")
    assert jail.read_bytes("notes.txt", max_bytes=100) == b"hello"
    assert (layout.root / "notes.txt").read_bytes() == b"hello"


def test_write_with_make_parents_creates_folders(jail: Jail, layout: Layout) -> None:
    jail.write_bytes("a/b/c.txt", b"x", make_parents=True)
    assert (layout.root / "a" / "b" / "c.txt").read_bytes() == b"x"


def test_write_without_parents_is_not_found(jail: Jail) -> None:
    with pytest.raises(JailError) as excinfo:
        jail.write_bytes("missing/c.txt", b"x")
    assert code_of(excinfo) == "NOT_FOUND"


def test_write_replaces_atomically_and_keeps_mode(jail: Jail, layout: Layout) -> None:
    target = layout.root / "script.sh"
    target.write_bytes(b"old")
    target.chmod(0o750)
    inode_before = target.stat().st_ino
    jail.write_bytes("script.sh", b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert target.stat().st_ino != inode_before  # a new file was renamed over it
    assert sorted(os.listdir(layout.root)) == ["script.sh"]  # no temp file left behind


def test_write_does_not_write_through_a_hard_link(jail: Jail, layout: Layout) -> None:
    original = layout.root / "original.txt"
    original.write_bytes(b"keep")
    os.link(original, layout.root / "alias.txt")
    jail.write_bytes("alias.txt", b"changed")
    assert original.read_bytes() == b"keep"


@pytest.mark.parametrize("path", [".", "folder"])
def test_write_onto_a_folder_is_refused(jail: Jail, layout: Layout, path: str) -> None:
    (layout.root / "folder").mkdir()
    with pytest.raises(JailError) as excinfo:
        jail.write_bytes(path, b"x")
    assert code_of(excinfo) == "IS_A_DIRECTORY"


def test_write_through_an_inside_link_replaces_its_target(jail: Jail, layout: Layout) -> None:
    (layout.root / "real").mkdir()
    (layout.root / "real" / "config.yml").write_bytes(b"old")
    os.symlink("real/config.yml", layout.root / "config.yml")
    os.symlink("../config.yml", layout.root / "real" / "up.yml")  # a chain, with ".."
    jail.write_bytes("real/up.yml", b"new")
    assert (layout.root / "real" / "config.yml").read_bytes() == b"new"
    assert os.readlink(layout.root / "config.yml") == "real/config.yml"  # links intact


def test_read_respects_the_cap(jail: Jail, layout: Layout) -> None:
    (layout.root / "ten.bin").write_bytes(b"0123456789")
    assert jail.read_bytes("ten.bin", max_bytes=10) == b"0123456789"
    with pytest.raises(JailError) as excinfo:
        jail.read_bytes("ten.bin", max_bytes=9)
    assert code_of(excinfo) == "TOO_LARGE"
    assert excinfo.value.details == {"path": "ten.bin", "limit": 9}


def test_read_of_a_folder_is_refused(jail: Jail, layout: Layout) -> None:
    (layout.root / "folder").mkdir()
    with pytest.raises(JailError) as excinfo:
        jail.read_bytes("folder", max_bytes=10)
    assert code_of(excinfo) == "IS_A_DIRECTORY"


def test_read_of_a_missing_file_is_not_found(jail: Jail) -> None:
    with pytest.raises(JailError) as excinfo:
        jail.read_bytes("nope.txt", max_bytes=10)
    assert code_of(excinfo) == "NOT_FOUND"
    assert excinfo.value.details["path"] == "nope.txt"


def test_paths_are_normalised(jail: Jail, layout: Layout) -> None:
    (layout.root / "a").mkdir()
    (layout.root / "a" / "f.txt").write_bytes(b"f")
    assert jail.read_bytes("./a//b/../f.txt", max_bytes=10) == b"f"
    assert jail.stat("a/./f.txt").path == "a/f.txt"


def test_stat_describes_files_folders_and_links(jail: Jail, layout: Layout) -> None:
    (layout.root / "f.txt").write_bytes(b"abc")
    (layout.root / "d").mkdir()
    os.symlink("f.txt", layout.root / "link")
    info = jail.stat("f.txt")
    assert (info.path, info.kind, info.size, info.link_target) == ("f.txt", "file", 3, None)
    assert info.mode == stat.S_IMODE((layout.root / "f.txt").stat().st_mode)
    assert jail.stat("d").kind == "dir"
    assert jail.stat(".").kind == "dir"
    link = jail.stat("link")
    assert (link.kind, link.link_target) == ("symlink", "f.txt")
    followed = jail.stat("link", follow_symlinks=True)
    assert (followed.path, followed.kind, followed.size) == ("link", "file", 3)


def test_list_dir_is_sorted_and_describes_links(jail: Jail, layout: Layout) -> None:
    for name in ("b.txt", "a.txt"):
        (layout.root / name).write_bytes(b"")
    (layout.root / "sub").mkdir()
    os.symlink("a.txt", layout.root / "c")
    listed = jail.list_dir()
    assert [(i.path, i.kind) for i in listed] == [
        ("a.txt", "file"),
        ("b.txt", "file"),
        ("c", "symlink"),
        ("sub", "dir"),
    ]
    assert listed[2].link_target == "a.txt"
    (layout.root / "sub" / "x").write_bytes(b"")
    assert [i.path for i in jail.list_dir("sub")] == ["sub/x"]


def test_list_dir_cap(jail: Jail, layout: Layout) -> None:
    for n in range(5):
        (layout.root / f"{n}.txt").write_bytes(b"")
    assert len(jail.list_dir(max_entries=5)) == 5
    with pytest.raises(JailError) as excinfo:
        jail.list_dir(max_entries=4)
    assert code_of(excinfo) == "TOO_MANY_ENTRIES"


def test_list_dir_of_a_file_is_refused(jail: Jail, layout: Layout) -> None:
    (layout.root / "f").write_bytes(b"")
    with pytest.raises(JailError) as excinfo:
        jail.list_dir("f")
    assert code_of(excinfo) == "NOT_A_DIRECTORY"


def test_make_dirs(jail: Jail, layout: Layout) -> None:
    jail.make_dirs("x/y/z")
    jail.make_dirs("x/y")  # existing: fine
    assert (layout.root / "x" / "y" / "z").is_dir()
    (layout.root / "x" / "file").write_bytes(b"")
    with pytest.raises(JailError) as excinfo:
        jail.make_dirs("x/file")
    assert code_of(excinfo) == "ALREADY_EXISTS"
    with pytest.raises(JailError) as excinfo:
        jail.make_dirs("x/file/sub")
    assert code_of(excinfo) == "NOT_A_DIRECTORY"


def test_make_dirs_through_an_inside_link(jail: Jail, layout: Layout) -> None:
    (layout.root / "real").mkdir()
    os.symlink("real", layout.root / "alias")
    jail.make_dirs("alias/new")
    assert (layout.root / "real" / "new").is_dir()


def test_remove(jail: Jail, layout: Layout) -> None:
    (layout.root / "f").write_bytes(b"")
    (layout.root / "empty").mkdir()
    (layout.root / "full" / "deep").mkdir(parents=True)
    (layout.root / "full" / "deep" / "x").write_bytes(b"")
    jail.remove("f")
    jail.remove("empty")
    with pytest.raises(JailError) as excinfo:
        jail.remove("full")
    assert code_of(excinfo) == "DIRECTORY_NOT_EMPTY"
    jail.remove("full", recursive=True)
    assert os.listdir(layout.root) == []
    for path, code in [("f", "NOT_FOUND"), (".", "INVALID_PATH")]:
        with pytest.raises(JailError) as excinfo:
            jail.remove(path, recursive=True)
        assert code_of(excinfo) == code


def test_rename(jail: Jail, layout: Layout) -> None:
    (layout.root / "a.txt").write_bytes(b"a")
    (layout.root / "b.txt").write_bytes(b"b")
    (layout.root / "d").mkdir()
    jail.rename("a.txt", "d/a.txt")
    assert (layout.root / "d" / "a.txt").read_bytes() == b"a"
    with pytest.raises(JailError) as excinfo:
        jail.rename("d/a.txt", "b.txt")
    assert code_of(excinfo) == "ALREADY_EXISTS"
    assert (layout.root / "b.txt").read_bytes() == b"b"
    jail.rename("d/a.txt", "b.txt", overwrite=True)
    assert (layout.root / "b.txt").read_bytes() == b"a"


@pytest.mark.parametrize(
    ("src", "dst", "code"),
    [
        ("missing", "x", "NOT_FOUND"),
        ("d", "d/inside", "INVALID_PATH"),
        (".", "x", "INVALID_PATH"),
        ("f", ".", "INVALID_PATH"),
    ],
)
def test_rename_refusals(jail: Jail, layout: Layout, src: str, dst: str, code: str) -> None:
    (layout.root / "d").mkdir()
    (layout.root / "f").write_bytes(b"")
    with pytest.raises(JailError) as excinfo:
        jail.rename(src, dst)
    assert code_of(excinfo) == code


def test_walk_is_top_down_and_never_descends_links(jail: Jail, layout: Layout) -> None:
    (layout.root / "a" / "b").mkdir(parents=True)
    (layout.root / "a" / "b" / "f").write_bytes(b"")
    (layout.root / "z").write_bytes(b"")
    os.symlink("a", layout.root / "link_to_a")
    walked = [(i.path, i.kind) for i in jail.walk(max_entries=100)]
    assert walked == [
        ("a", "dir"),
        ("link_to_a", "symlink"),
        ("z", "file"),
        ("a/b", "dir"),
        ("a/b/f", "file"),
    ]
    assert [i.path for i in jail.walk("a", max_entries=100)] == ["a/b", "a/b/f"]


def test_walk_stops_at_the_cap(jail: Jail, layout: Layout) -> None:
    for n in range(10):
        (layout.root / f"{n}").write_bytes(b"")
    seen: list[PathInfo] = []
    with pytest.raises(JailError) as excinfo:
        seen.extend(jail.walk(max_entries=4))
    assert code_of(excinfo) == "TOO_MANY_ENTRIES"
    assert len(seen) == 4
    assert len(list(jail.walk(max_entries=10))) == 10


def test_open_fd(jail: Jail, layout: Layout) -> None:
    (layout.root / "f").write_bytes(b"data")
    fd = jail.open_fd("f", os.O_RDONLY)
    try:
        assert os.read(fd, 10) == b"data"
        assert os.get_blocking(fd)
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)
    fd = jail.open_fd("new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    assert stat.S_IMODE((layout.root / "new").stat().st_mode) == 0o600
    os.close(jail.open_fd(".", os.O_RDONLY | os.O_DIRECTORY))


def test_closed_jail_refuses_work(layout: Layout) -> None:
    jail = Jail.open(layout.root)
    jail.close()
    jail.close()  # idempotent
    assert jail.closed
    with pytest.raises(JailError) as excinfo:
        jail.read_bytes("x", max_bytes=1)
    assert code_of(excinfo) == "JAIL_CLOSED"


def test_open_refuses_a_missing_or_non_folder_root(tmp_path: Path) -> None:
    with pytest.raises(JailError) as excinfo:
        Jail.open(tmp_path / "missing")
    assert code_of(excinfo) == "NOT_FOUND"
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(JailError) as excinfo:
        Jail.open(tmp_path / "file")
    assert code_of(excinfo) == "NOT_A_DIRECTORY"
    assert str(tmp_path) not in str(excinfo.value)


def test_jail_error_shape() -> None:
    err = JailError("NOT_FOUND", "'x' does not exist.", {"path": "x"})
    assert str(err) == err.message == "'x' does not exist."
    assert (err.code, err.details) == ("NOT_FOUND", {"path": "x"})
    assert JailError("IO_ERROR", "m").details == {}
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.code, copy.message, copy.details) == (err.code, err.message, err.details)


def test_open_fd_exclusive_create_never_follows_a_link(jail: Jail, layout: Layout) -> None:
    os.symlink("target.txt", layout.root / "link")
    with pytest.raises(JailError) as excinfo:
        jail.open_fd("link", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert code_of(excinfo) == "ALREADY_EXISTS"
    assert not (layout.root / "target.txt").exists()


def test_without_openat2_the_walk_resolver_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_syscalls, "openat2_available", lambda: False)
    assert isinstance(make_resolver(), WalkResolver)
    assert isinstance(make_resolver(use_openat2=True), KernelResolver)


@pytest.mark.parametrize("refusal", [errno.ENOSYS, errno.EPERM])
def test_openat2_probe_treats_enosys_and_seccomp_as_missing(
    monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    def refuse(*args: object) -> int:
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(_syscalls, "openat2", refuse)
    assert _syscalls.openat2_available.__wrapped__() is False


@pytest.mark.skipif(not _syscalls.openat2_available(), reason="kernel without openat2")
def test_eagain_from_openat2_is_retried_then_reported(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    (layout.root / "f").write_bytes(b"ok")
    real = _syscalls.openat2
    failures = iter([True, True, False])

    def flaky(*args: Any) -> int:
        if next(failures, True):
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real(*args)

    monkeypatch.setattr(_syscalls, "openat2", flaky)
    with Jail.open(layout.root, use_openat2=True) as jail:
        assert jail.read_bytes("f", max_bytes=10) == b"ok"  # third attempt succeeds
        with pytest.raises(JailError) as excinfo:
            jail.read_bytes("f", max_bytes=10)  # every attempt fails
    assert code_of(excinfo) == "PATH_BUSY"
