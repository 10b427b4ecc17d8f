"""inspect(): a real workspace against a real baseline copied with shutil.copytree.

Files are written, copied the way ``workspace.prepare`` copies them (so mtimes
match), then changed. Same-size rewrites get an explicit later mtime: within
one clock tick the kernel would otherwise stamp the same time.

Every test runs twice: against the baseline folder (experiments made before packs)
and against that folder packed (jail/pack.py, what ``workspace.prepare`` keeps now),
made just before the inspection.
"""

from __future__ import annotations

import difflib
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.experiments.workspace import changes
from app.experiments.workspace import diff as _diff
from app.experiments.workspace.changes import ChangeReport, FileChange
from jail import Jail, PathInfo
from jail._syscalls import RENAME_EXCHANGE, renameat2
from jail.pack import Pack, pack_tree

pytestmark = pytest.mark.timeout(60)

SECRET = b"OUTSIDE-SECRET-5d1e"


def _write(root: Path, files: Mapping[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def _project(tmp_path: Path, files: Mapping[str, str | bytes]) -> tuple[Path, Path]:
    ws, base = tmp_path / "workspace", tmp_path / "baseline"
    ws.mkdir()
    _write(ws, files)
    shutil.copytree(ws, base, symlinks=True)
    return ws, base


def _rewrite(path: Path, content: str | bytes) -> None:
    before = path.stat().st_mtime_ns
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    os.utime(path, ns=(before + 10**9, before + 10**9))


@pytest.fixture(autouse=True, params=["folder", "pack"])
def baseline_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(_BASELINE, "kind", request.param)
    return str(request.param)


_BASELINE = {"kind": "folder"}


def _inspect(ws: Path, base: Path, **kwargs: Any) -> ChangeReport:
    if _BASELINE["kind"] == "pack":
        pack = base.with_name(base.name + ".pack")
        pack.unlink(missing_ok=True)
        pack_tree(base, pack)
        base = pack
    return changes.inspect(ws, base, **{"include_diff": True, **kwargs})


def _by_path(items: list[FileChange]) -> dict[str, FileChange]:
    return {c.path: c for c in items}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path read through a Jail (whole-file reads and raw descriptors) or a pack."""
    seen: list[str] = []
    read_bytes, open_fd = Jail.read_bytes, Jail.open_fd

    def spy_read(self: Jail, path: str, *, max_bytes: int) -> bytes:
        seen.append(path)
        return read_bytes(self, path, max_bytes=max_bytes)

    def spy_open(self: Jail, path: str, flags: int, mode: int = 0o644) -> int:
        seen.append(path)
        return open_fd(self, path, flags, mode)

    monkeypatch.setattr(Jail, "read_bytes", spy_read)
    monkeypatch.setattr(Jail, "open_fd", spy_open)
    # A packed baseline is read through the pack.
    pack_read, pack_chunks = Pack.read_bytes, Pack.chunks

    def spy_pack_read(self: Pack, path: str, *, max_bytes: int) -> bytes:
        seen.append(path)
        return pack_read(self, path, max_bytes=max_bytes)

    def spy_pack_chunks(self: Pack, path: str, chunk: int) -> Iterator[bytes]:
        seen.append(path)
        return pack_chunks(self, path, chunk)

    monkeypatch.setattr(Pack, "read_bytes", spy_pack_read)
    monkeypatch.setattr(Pack, "chunks", spy_pack_chunks)
    return seen


def _after_first_listing(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """Run ``action`` once, right after the first folder listing (the workspace root)."""
    list_dir = Jail.list_dir
    done: list[bool] = []

    def racing(self: Jail, path: str = ".", *, max_entries: int = 10_000) -> list[PathInfo]:
        infos = list_dir(self, path, max_entries=max_entries)
        if not done:
            done.append(True)
            action()
        return infos

    monkeypatch.setattr(Jail, "list_dir", racing)


# Created, modified, deleted


def test_created_modified_deleted_with_exact_counts(tmp_path: Path) -> None:
    ws, base = _project(
        tmp_path,
        {"a.py": "1\n2\n3\n", "same.txt": "keep\n", "c/d.txt": "gone\nbye\n"},
    )
    (ws / "a.py").write_text("1\nTWO\n3\n4\n")
    _write(ws, {"new.txt": "n1\nn2\n", "pkg/deep/new.py": "x = 1\n"})
    (ws / "c" / "d.txt").unlink()

    report = _inspect(ws, base)

    assert [c.path for c in report.created] == ["new.txt", "pkg/deep/new.py"]
    assert [c.path for c in report.modified] == ["a.py"]
    assert [c.path for c in report.deleted] == ["c/d.txt"]
    created, (mod,), (gone,) = _by_path(report.created), report.modified, report.deleted
    assert (created["new.txt"].insertions, created["new.txt"].deletions) == (2, 0)
    assert (mod.insertions, mod.deletions, mod.kind, mod.binary) == (2, 1, "file", False)
    assert (mod.size_before, mod.size_after) == (6, 10)
    assert (gone.insertions, gone.deletions, gone.size_before, gone.size_after) == (0, 2, 9, None)
    assert (report.insertions, report.deletions, report.files_changed) == (5, 3, 4)
    assert report.notes == []
    assert not report.diff_truncated
    expected_a = "".join(
        difflib.unified_diff(
            ["1\n", "2\n", "3\n"], ["1\n", "TWO\n", "3\n", "4\n"], "a/a.py", "b/a.py"
        )
    )
    assert report.diff is not None
    assert expected_a in report.diff
    assert "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+n1\n+n2\n" in report.diff
    assert "--- a/c/d.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-gone\n-bye\n" in report.diff
    assert "same.txt" not in report.diff
    ChangeReport.model_validate_json(report.model_dump_json())


def test_counts_without_a_diff(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {"a.txt": "a\nb\nc\n"})
    (ws / "a.txt").write_text("a\nc\nd\ne\n")

    report = _inspect(ws, base, include_diff=False)

    assert report.diff is None
    assert not report.diff_truncated
    assert (report.modified[0].insertions, report.modified[0].deletions) == (2, 1)


def test_missing_final_newline_is_marked(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {"a.txt": "a\nb"})
    (ws / "a.txt").write_text("a\nb\n")

    report = _inspect(ws, base)

    assert (report.insertions, report.deletions) == (1, 1)
    assert report.diff is not None
    assert "-b\n\\ No newline at end of file\n+b\n" in report.diff


def test_only_newline_ends_a_line(tmp_path: Path) -> None:
    # A form feed or CR is part of a line, as for git; splitlines() would miscount.
    ws, base = _project(tmp_path, {"a.txt": "x\n"})
    (ws / "a.txt").write_text("x\fy\rz\n")

    change = _inspect(ws, base).modified[0]

    assert (change.insertions, change.deletions) == (1, 1)


def test_empty_project(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {})

    report = _inspect(ws, base)

    assert report == ChangeReport(
        created=[], modified=[], deleted=[], insertions=0, deletions=0, files_changed=0,
        diff="", diff_truncated=False, notes=[],
    )  # fmt: skip


# Modes, touches and the size+mtime fast path


def test_mode_change_only(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {"run.sh": "echo hi\n"})
    (ws / "run.sh").chmod(0o755)

    report = _inspect(ws, base)

    (change,) = report.modified
    assert change.mode_change == "100644 -> 100755"
    assert (change.insertions, change.deletions, change.kind) == (0, 0, "file")
    assert report.files_changed == 1
    assert report.diff == ""


def test_unchanged_files_with_equal_size_and_mtime_are_not_read(
    tmp_path: Path, reads: list[str]
) -> None:
    ws, base = _project(tmp_path, {f"src/m{i}.py": f"v = {i}\n" for i in range(50)})
    (ws / "src" / "m7.py").write_text("v = 'seven'\n")

    report = _inspect(ws, base)

    assert [c.path for c in report.modified] == ["src/m7.py"]
    assert sorted(reads) == ["src/m7.py", "src/m7.py"]  # baseline and workspace side


def test_touched_file_is_read_but_not_reported(tmp_path: Path, reads: list[str]) -> None:
    ws, base = _project(tmp_path, {"a.txt": "same\n"})
    _rewrite(ws / "a.txt", "same\n")

    report = _inspect(ws, base)

    assert report.modified == []
    assert reads == ["a.txt", "a.txt"]


def test_same_size_edit_with_a_new_mtime_is_found(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {"a.txt": "abc\n"})
    _rewrite(ws / "a.txt", "xyz\n")

    report = _inspect(ws, base)

    assert (report.modified[0].insertions, report.modified[0].deletions) == (1, 1)


def test_same_size_edit_with_restored_mtime_is_missed(tmp_path: Path) -> None:
    # The documented price of the fast path (what `cp -p` or `touch -r` can do).
    ws, base = _project(tmp_path, {"a.txt": "abc\n"})
    st = (ws / "a.txt").stat()
    (ws / "a.txt").write_text("xyz\n")
    os.utime(ws / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))

    assert _inspect(ws, base).modified == []


# Symbolic links


def test_symlink_created_retargeted_and_removed(tmp_path: Path, reads: list[str]) -> None:
    ws, base = _project(tmp_path, {"a.txt": "a\n", "b.txt": "b\n"})
    for root in (ws, base):
        os.symlink("a.txt", root / "moved")
        os.symlink("a.txt", root / "removed")
        os.symlink("a.txt", root / "kept")
    os.symlink("b.txt", ws / "new")
    (ws / "moved").unlink()
    os.symlink("b.txt", ws / "moved")
    (ws / "removed").unlink()

    report = _inspect(ws, base)

    assert [(c.path, c.kind, c.link_change) for c in report.created] == [
        ("new", "symlink", "(none) -> b.txt")
    ]
    assert [(c.path, c.kind, c.link_change) for c in report.modified] == [
        ("moved", "symlink", "a.txt -> b.txt")
    ]
    assert [(c.path, c.kind, c.link_change) for c in report.deleted] == [
        ("removed", "symlink", "a.txt -> (none)")
    ]
    assert report.files_changed == 3
    assert reads == []  # links are compared by their text, never followed


def test_file_became_a_link_and_back(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {"f.txt": "one\ntwo\n", "target.txt": "t\n"})
    os.symlink("target.txt", base / "l")
    (ws / "f.txt").unlink()
    os.symlink("target.txt", ws / "f.txt")
    _write(ws, {"l": "now\na\nfile\n"})

    report = _inspect(ws, base)

    changed = _by_path(report.modified)
    assert changed["f.txt"].kind == "symlink"
    assert changed["f.txt"].link_change == "(file) -> target.txt"
    assert (changed["f.txt"].deletions, changed["f.txt"].size_before) == (2, 8)
    assert changed["l"].kind == "file"
    assert changed["l"].link_change == "target.txt -> (file)"
    assert changed["l"].insertions == 3
    assert report.notes == ["f.txt became a symbolic link", "l became a regular file"]


def test_link_out_of_the_workspace_is_never_read(tmp_path: Path, reads: list[str]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    ws, base = _project(tmp_path, {"config.txt": "mine\n", "sub/x.txt": "x\n"})
    os.symlink("/etc/passwd", ws / "passwd")
    os.symlink(outside / "secret.txt", ws / "abs")
    os.symlink("../outside/secret.txt", ws / "rel")
    os.symlink("../../outside", ws / "sub" / "dir")
    (ws / "config.txt").unlink()
    os.symlink("/etc/passwd", ws / "config.txt")

    report = _inspect(ws, base)

    created = _by_path(report.created)
    assert created["passwd"].link_change == "(none) -> /etc/passwd"
    assert {c.kind for c in report.created} == {"symlink"}
    assert set(created) == {"passwd", "abs", "rel", "sub/dir"}
    assert report.modified[0].link_change == "(file) -> /etc/passwd"
    dumped = report.model_dump_json()
    assert SECRET.decode() not in dumped
    assert "root:" not in dumped
    assert reads == ["config.txt"]  # the baseline's file, for its deleted lines


# Races and special files


@pytest.mark.timeout(10)
def test_fifo_does_not_block_and_is_noted(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {"was_file": "text\n"})
    os.mkfifo(ws / "pipe")
    (ws / "was_file").unlink()
    os.mkfifo(ws / "was_file")

    report = _inspect(ws, base)

    assert report.created == []
    assert [c.path for c in report.deleted] == ["was_file"]
    assert any("pipe" in n and "special file" in n for n in report.notes)
    assert any("was_file" in n and "special file" in n for n in report.notes)


@pytest.mark.timeout(10)
def test_file_swapped_for_a_link_or_fifo_after_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, base = _project(tmp_path, {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"})
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text("changed\n")

    def swap() -> None:
        (ws / "a.txt").unlink()
        os.symlink("/etc/passwd", ws / "a.txt")
        (ws / "b.txt").unlink()
        os.mkfifo(ws / "b.txt")
        (ws / "c.txt").unlink()

    _after_first_listing(monkeypatch, swap)
    report = _inspect(ws, base)

    assert "root:" not in report.model_dump_json()
    assert any("a.txt" in n and "SYMLINK_ESCAPE" in n for n in report.notes)
    assert any("b.txt" in n and "NOT_A_REGULAR_FILE" in n for n in report.notes)
    assert any("c.txt" in n and "NOT_FOUND" in n for n in report.notes)


def test_folder_swapped_for_a_link_out_after_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: list[str]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    ws, base = _project(tmp_path, {"src/secret.txt": "inside\n"})
    (ws / "src" / "secret.txt").write_text("inside, changed\n")

    def swap() -> None:
        (ws / "src").rename(ws / "src.real")
        os.symlink(outside, ws / "src")

    _after_first_listing(monkeypatch, swap)
    report = _inspect(ws, base)

    assert SECRET.decode() not in report.model_dump_json()
    assert any("src" in n and "SYMLINK_ESCAPE" in n for n in report.notes)
    # An unlistable folder proves nothing about its baseline files: none is "deleted".
    assert report.deleted == []
    assert reads == []


# The race runs until it was real (inspections that met the folder and ones that met the
# link, swaps meanwhile), bounded by a generous time: a fixed number of inspections on a
# busy machine could all see one state and prove nothing, or fail for speed alone.
MIN_INSPECTIONS = 200
MIN_DISTINCT_REPORTS = 2
RACE_DEADLINE_S = 120


@pytest.mark.timeout(RACE_DEADLINE_S + 60)
@pytest.mark.parametrize("target", ["../outside", "{outside}"])
def test_folder_and_link_swapped_in_a_loop_never_leak(tmp_path: Path, target: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET + b"\n")
    ws, base = _project(tmp_path, {"d/secret.txt": "inside\n"})
    (ws / "d" / "secret.txt").write_text("inside, edited\n")
    os.symlink(target.format(outside=outside), ws / "d_link")
    stop = threading.Event()

    swaps = 0

    def swap() -> None:
        nonlocal swaps
        # renameat2(RENAME_EXCHANGE): at every instant "d" is the folder or the link.
        fd = os.open(ws, os.O_PATH | os.O_DIRECTORY)
        try:
            while not stop.is_set():
                renameat2(fd, b"d", fd, b"d_link", RENAME_EXCHANGE)
                swaps += 1
        finally:
            os.close(fd)

    def race_was_real() -> bool:
        return (
            len(reports) >= MIN_INSPECTIONS
            and len(set(reports)) >= MIN_DISTINCT_REPORTS
            and swaps >= MIN_INSPECTIONS
        )

    reports: list[str] = []
    swapper = threading.Thread(target=swap, daemon=True)
    deadline = time.monotonic() + RACE_DEADLINE_S
    swapper.start()
    try:
        while not race_was_real() and time.monotonic() < deadline:
            report = _inspect(ws, base).model_dump_json()
            assert SECRET.decode() not in report, report
            reports.append(report)
    finally:
        stop.set()
        swapper.join()

    # The swaps did land mid-inspection: the folder and the link were both met.
    assert race_was_real(), (
        f"in {RACE_DEADLINE_S} s: {len(reports)} inspections, {swaps} swaps, "
        f"{len(set(reports))} distinct reports"
    )


def test_notes_are_capped(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {})
    for i in range(changes.MAX_NOTES + 10):
        os.mkfifo(ws / f"p{i:03d}")

    report = _inspect(ws, base)

    assert len(report.notes) == changes.MAX_NOTES + 1
    assert report.notes[-1] == "... and 10 more notes"


# Binary and large files


def test_binary_files(tmp_path: Path) -> None:
    ws, base = _project(
        tmp_path, {"img.bin": b"\x00\x01\x02", "latin1.txt": "caf\xe9\n".encode("latin-1")}
    )
    (ws / "img.bin").write_bytes(b"\x00\x01\x02\x03")
    (ws / "latin1.txt").write_bytes("caf\xe9s\n".encode("latin-1"))
    _write(ws, {"new.bin": b"\x7fELF\x00\x00"})

    report = _inspect(ws, base)

    changed = _by_path(report.modified + report.created)
    for path in ("img.bin", "latin1.txt", "new.bin"):
        assert changed[path].binary
        assert (changed[path].insertions, changed[path].deletions) == (0, 0)
    assert report.diff is not None
    assert "Binary files a/img.bin and b/img.bin differ\n" in report.diff
    assert "Binary files /dev/null and b/new.bin differ\n" in report.diff
    assert "caf" not in report.diff


def test_large_files_are_compared_but_not_diffed(tmp_path: Path, reads: list[str]) -> None:
    big = changes.READ_LIMIT + 10
    ws, base = _project(
        tmp_path,
        {"same.log": b"x" * big, "tail.log": b"x" * big, "grown.log": b"x" * big},
    )
    _rewrite(ws / "same.log", b"x" * big)  # touched: compared in full, unchanged
    _rewrite(ws / "tail.log", b"x" * (big - 1) + b"y")
    (ws / "grown.log").write_bytes(b"x" * (big + 1))
    _write(ws, {"new.bin": b"\x00" * big})

    report = _inspect(ws, base)

    assert [c.path for c in report.modified] == ["grown.log", "tail.log"]
    assert [(c.path, c.binary) for c in report.created] == [("new.bin", True)]
    assert all(c.insertions == c.deletions == 0 for c in report.modified + report.created)
    assert not any(c.binary for c in report.modified)
    assert report.diff is not None
    assert "Files a/tail.log and b/tail.log differ (not diffed)\n" in report.diff
    assert any("grown.log" in n and "not line-counted" in n for n in report.notes)
    assert reads.count("grown.log") == 1  # sizes differ: only an 8 KB sniff for "binary"


# Exclusions, folders, depth, limits


def test_excluded_folders_are_not_walked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws, base = _project(tmp_path, {"app.js": "1\n", "build": "a file named build\n"})
    _write(ws, {f"node_modules/pkg{i // 100}/f{i}.js": "x\n" for i in range(1000)})
    _write(ws, {"web/node_modules/a.js": "", "my.egg-info/PKG-INFO": "", "__pycache__/a.pyc": ""})
    (ws / "build").write_text("a file named build, edited\n")
    listed: list[str] = []
    list_dir = Jail.list_dir

    def spy(self: Jail, path: str = ".", *, max_entries: int = 10_000) -> list[PathInfo]:
        listed.append(path)
        return list_dir(self, path, max_entries=max_entries)

    monkeypatch.setattr(Jail, "list_dir", spy)
    report = _inspect(ws, base, max_entries=500)

    assert report.created == []
    assert [c.path for c in report.modified] == ["build"]  # only folders are excluded
    assert report.notes == []
    assert not any("node_modules" in p or "egg-info" in p for p in listed)


def test_custom_exclusions(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {})
    _write(ws, {"out/a.txt": "a\n", "node_modules/b.js": "b\n"})

    report = _inspect(ws, base, excluded_dirs=frozenset({"ou?"}))

    assert [c.path for c in report.created] == ["node_modules/b.js"]


def test_empty_folders_created_deleted_and_replaced(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {"full/a.txt": "a\n", "swap/x.txt": "x\n", "f": "f\n"})
    (base / "old_empty").mkdir()
    (base / "was_empty").mkdir()
    (ws / "new_empty" / "inner").mkdir(parents=True)
    shutil.rmtree(ws / "swap")
    (ws / "swap").write_text("now a file\n")
    (ws / "was_empty").write_text("now a file\n")
    (ws / "f").unlink()
    (ws / "f").mkdir()

    report = _inspect(ws, base)

    assert [(c.path, c.kind) for c in report.created] == [
        ("f", "dir"),
        ("new_empty/inner", "dir"),
        ("swap", "file"),
        ("was_empty", "file"),
    ]
    assert [(c.path, c.kind) for c in report.deleted] == [
        ("f", "file"),
        ("old_empty", "dir"),
        ("swap/x.txt", "file"),
        ("was_empty", "dir"),
    ]
    assert report.files_changed == 4


def test_deep_tree(tmp_path: Path) -> None:
    deep = "/".join(f"d{i}" for i in range(80))
    ws, base = _project(tmp_path, {f"{deep}/leaf.txt": "a\n"})
    (ws / deep / "leaf.txt").write_text("a\nb\n")
    (ws / deep / "more").mkdir()

    report = _inspect(ws, base)

    assert [(c.path, c.insertions) for c in report.modified] == [(f"{deep}/leaf.txt", 1)]
    assert [c.path for c in report.created] == [f"{deep}/more"]


def test_too_many_entries_reports_no_false_changes(tmp_path: Path) -> None:
    files = {f"a/f{i}.txt": "a\n" for i in range(5)} | {f"z/f{i}.txt": "z\n" for i in range(100)}
    ws, base = _project(tmp_path, files)

    report = _inspect(ws, base, max_entries=50)

    assert (report.created, report.modified, report.deleted) == ([], [], [])
    assert any("over 50 entries" in n for n in report.notes)


def test_odd_file_names_stay_serialisable_and_cannot_forge_diff_lines(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {})
    (ws / os.fsdecode(b"bad\xff.txt")).write_text("x\n")
    (ws / "two\n+forged").write_text("y\n")

    report = _inspect(ws, base)

    assert sorted(c.path for c in report.created) == ["bad\\xff.txt", "two\n+forged"]
    assert report.diff is not None
    assert '+++ "b/two\\n+forged"\n' in report.diff
    assert "\n+forged" not in report.diff
    ChangeReport.model_validate_json(report.model_dump_json())


# Diff caps


def test_per_file_cap_cuts_with_a_marker_but_counts_everything(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {"big.txt": "", "small.txt": "s\n"})
    (ws / "big.txt").write_text("".join(f"line {i}\n" for i in range(5000)))
    (ws / "small.txt").write_text("s\nt\n")

    report = _inspect(ws, base, max_diff_bytes_per_file=1000)

    assert report.diff_truncated
    assert report.modified[0].insertions == 5000
    assert report.diff is not None
    head, marker, rest = report.diff.partition("[... diff of big.txt cut here: per-file limit")
    assert marker
    assert len(head.encode()) <= 1000
    assert "--- a/small.txt\n+++ b/small.txt\n" in rest


def test_total_cap_drops_later_files_with_a_marker(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {f"f{i:02d}.txt": "" for i in range(20)})
    for i in range(20):
        (ws / f"f{i:02d}.txt").write_text("x" * 90 + "\n")

    report = _inspect(ws, base, max_diff_bytes_total=1000)

    assert report.diff_truncated
    assert report.insertions == 20
    assert report.diff is not None
    body, _, _ = report.diff.partition("[... ")
    assert len(body.encode()) <= 1000
    assert "total limit of 1000 bytes" in report.diff
    assert report.diff.endswith("not shown: the diff reached its limit of 1000 bytes ...]\n")
    assert "f19.txt" not in report.diff


# The hunk writer itself


def _apply(a: list[str], hunk_lines: Iterator[str]) -> list[str]:
    """Apply unified hunks to ``a`` (enough of patch(1) to check our output)."""
    out: list[str] = []
    pos = 0
    for line in hunk_lines:
        if line.startswith("@@"):
            first, _, length = line.split()[1][1:].partition(",")
            start = int(first) - 1 if length != "0" else int(first)
            out.extend(a[pos:start])
            pos = start
        elif line.startswith("\\"):
            continue
        elif line[0] in " -":
            assert a[pos].rstrip("\n") == line[1:].rstrip("\n")
            if line[0] == " ":
                out.append(a[pos])
            pos += 1
        elif line[0] == "+":
            out.append(line[1:])
    return out + a[pos:]


def test_hunks_rebuild_the_new_text_and_match_the_counts() -> None:
    rng = random.Random(7)
    for _ in range(500):
        a = [f"{rng.randrange(rng.choice((4, 40)))}\n" for _ in range(rng.randrange(40))]
        b = list(a)
        for _ in range(rng.randrange(1, 8)):
            at = rng.randrange(len(b) + 1)
            if b and rng.random() < 0.5:
                del b[min(at, len(b) - 1)]
            else:
                b.insert(at, f"{rng.randrange(50)}\n")
        ops, exact = _diff.line_opcodes(a, b)
        ours = list(_diff.hunks(a, b, ops))
        assert exact
        assert _apply(a, iter(ours)) == b
        plus = sum(1 for line in ours if line.startswith("+"))
        minus = sum(1 for line in ours if line.startswith("-"))
        assert _diff.count_changes(ops) == (plus, minus)


@pytest.mark.timeout(20)
def test_scattered_edits_in_a_large_file_stay_fast() -> None:
    # difflib.SequenceMatcher alone needs about a minute for this one.
    a = [f"line {i} of a generated file\n" for i in range(60_000)]
    b = [line if i % 10 else "edited\n" for i, line in enumerate(a)]

    ops, exact = _diff.line_opcodes(a, b)

    assert exact
    assert _diff.count_changes(ops) == (6000, 6000)


def test_matching_work_is_capped_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_diff, "_WORK_BUDGET", 100)
    ws, base = _project(tmp_path, {"a.txt": "".join(f"{i}\n" for i in range(200))})
    (ws / "a.txt").write_text("".join(f"{i}\n" if i % 7 else "x\n" for i in range(201)))

    report = _inspect(ws, base)

    change = report.modified[0]
    assert change.insertions - change.deletions == 1
    assert change.deletions > 200 // 7 + 1  # unmatched gaps count as replaced
    assert report.notes == ["a.txt: too many scattered edits, counts are high"]


def test_special_files_count_towards_the_entry_limit(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {})
    for i in range(100):
        os.mkfifo(ws / f"p{i:03d}")

    report = _inspect(ws, base, max_entries=50)

    assert report.notes == ["workspace: over 50 entries, the rest not compared"]


def test_max_files_with_diff_caps_the_diffed_files_not_the_listing(tmp_path: Path) -> None:
    ws, base = _project(tmp_path, {f"f{i}.txt": f"{i}\n" for i in range(5)})
    for i in range(5):
        _rewrite(ws / f"f{i}.txt", f"{i} changed\n")
    report = _inspect(ws, base, include_diff=True, max_files_with_diff=2)
    assert len(report.modified) == 5
    assert report.insertions == 5
    assert report.diff is not None
    assert report.diff.count("+++ b/") == 2
    assert "3 more changed file(s) not shown" in report.diff
    assert "max_files_with_diff" in report.diff
    assert report.diff_truncated
    uncapped = _inspect(ws, base, include_diff=True)
    assert uncapped.diff is not None
    assert uncapped.diff.count("+++ b/") == 5
    assert not uncapped.diff_truncated
