"""The baseline pack: one file holding what the workspace received (facts to the
nanosecond, content, links as text), sparse files kept sparse, its bounds refused
with a stable code, a damaged pack refused, never anything followed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from jail import Jail, JailError, PathInfo, snapshot, snapshot_copy
from jail import pack as packs
from jail.pack import Pack, PackWriter, pack_tree


@pytest.fixture(autouse=True, params=[1, 2], ids=["one-walk", "two-threads"])
def copy_workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(snapshot, "DEFAULT_WORKERS", request.param)
    return int(request.param)


def _project(root: Path) -> Path:
    for folder in ("src/pkg", "docs", "empty/inner"):
        (root / folder).mkdir(parents=True)
    (root / "README.md").write_text("# hello\n")
    (root / "src" / "app.py").write_text("print('hi')\n")
    (root / "src" / "pkg" / "mod.py").write_text("X = 1\n" * 100)
    (root / "src" / "run.sh").write_text("#!/bin/sh\n")
    (root / "src" / "run.sh").chmod(0o755)
    (root / "docs" / "big.bin").write_bytes(os.urandom(300_000))  # past the small-file path
    (root / "docs" / "empty.txt").write_bytes(b"")
    os.symlink("app.py", root / "src" / "link.py")
    return root


def _walk(root: Path) -> dict[str, PathInfo]:
    with Jail.open(root) as jail:
        return {info.path: info for info in jail.walk(".", max_entries=10_000)}


def _packed(path: Path) -> dict[str, PathInfo]:
    with Pack.open(path) as pack:
        return {info.path: info for info in pack.entries()}


def test_the_pack_holds_what_the_workspace_received_to_the_nanosecond(tmp_path: Path) -> None:
    project, dest = _project(tmp_path / "project"), tmp_path / "exp" / "workspace"
    dest.mkdir(parents=True)
    pack = tmp_path / "exp" / "baseline.pack"
    report = snapshot_copy(project, dest, home=tmp_path / "home", pack=pack)
    walked, packed = _walk(dest), _packed(pack)
    assert packed == walked  # kind, size, mode, mtime_ns and link target alike
    assert report.files_copied == sum(info.kind == "file" for info in packed.values())
    with Pack.open(pack) as opened:
        for path, info in packed.items():
            if info.kind == "file":
                assert opened.read_bytes(path, max_bytes=1 << 20) == (dest / path).read_bytes()
                assert b"".join(opened.chunks(path, 4096)) == (dest / path).read_bytes()
        assert [i.path for i in opened.list_dir("src", max_entries=10)] == [
            "src/app.py", "src/link.py", "src/pkg", "src/run.sh",
        ]  # fmt: skip
        assert opened.list_dir("empty/inner", max_entries=10) == []
        with pytest.raises(JailError) as caught:
            opened.list_dir("src", max_entries=3)
        assert caught.value.code == "TOO_MANY_ENTRIES"
        with pytest.raises(JailError) as caught:
            opened.read_bytes("docs/big.bin", max_bytes=1000)
        assert caught.value.code == "TOO_LARGE"
    # One file, not a second tree; the server's alone.
    assert stat.S_IMODE(pack.stat().st_mode) == 0o600


def test_a_sparse_file_stays_sparse_in_the_pack(tmp_path: Path) -> None:
    project, dest = tmp_path / "project", tmp_path / "workspace"
    project.mkdir()
    dest.mkdir()
    with (project / "sparse.bin").open("wb") as out:
        out.write(b"head")
        out.seek(1 << 30)
        out.write(b"tail")
    pack = tmp_path / "baseline.pack"
    snapshot_copy(project, dest, home=tmp_path / "home", pack=pack)
    assert pack.stat().st_blocks * 512 < 1 << 20  # a GB of nothing costs nothing
    with Pack.open(pack) as opened:
        pieces = opened.chunks("sparse.bin", 1 << 20)
        first = next(pieces)
        assert first[:4] == b"head"
        assert not first[4:].strip(b"\0")
        *_, last = pieces
        assert last.endswith(b"tail")


def test_links_are_kept_as_text_and_special_files_left_out(tmp_path: Path) -> None:
    """pack_tree (a clone, given files) records any link as its text, never follows it."""
    root = tmp_path / "workspace"
    root.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    os.symlink(str(outside), root / "abs")
    os.symlink("../outside.txt", root / "up")
    os.mkfifo(root / "fifo")
    (root / "a.txt").write_text("a")
    pack = tmp_path / "baseline.pack"
    assert pack_tree(root, pack) == 1
    packed = _packed(pack)
    assert set(packed) == {"abs", "up", "a.txt"}
    assert packed["abs"].link_target == str(outside)
    with Pack.open(pack) as opened:
        for link in ("abs", "up"):
            with pytest.raises(JailError) as caught:
                opened.read_bytes(link, max_bytes=100)
            assert caught.value.code == "NOT_FOUND"


@pytest.mark.parametrize("bound", ["MAX_PACK_ENTRIES", "MAX_PACK_INDEX_BYTES"])
def test_a_tree_past_the_bounds_is_refused_with_a_stable_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    monkeypatch.setattr(packs, bound, 20 if bound == "MAX_PACK_ENTRIES" else 2_000)
    project = tmp_path / "project"
    project.mkdir()
    for index in range(40):
        (project / f"{'n' * 100}{index}.txt").write_text("x")
    dest = tmp_path / "workspace"
    dest.mkdir()
    for make in (
        lambda: snapshot_copy(project, dest, home=tmp_path / "home", pack=tmp_path / "a.pack"),
        lambda: pack_tree(project, tmp_path / "b.pack"),
    ):
        with pytest.raises(JailError) as caught:
            make()
        assert caught.value.code == "TOO_MANY_ENTRIES"
        assert "baseline keeps at most" in caught.value.message


def test_an_unfinished_or_damaged_pack_is_refused(tmp_path: Path) -> None:
    unfinished = tmp_path / "unfinished.pack"
    writer = PackWriter(unfinished)
    writer.add_data("a.txt", os.stat(tmp_path), b"a")
    writer.release()  # an error mid-way: no index, no trailer
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.txt").write_text("a" * 100)
    whole = tmp_path / "whole.pack"
    pack_tree(root, whole)
    cut = tmp_path / "cut.pack"
    cut.write_bytes(whole.read_bytes()[:-5])
    lying = tmp_path / "lying.pack"
    data = bytearray(whole.read_bytes())
    data[-16:-8] = (10**9).to_bytes(8, "little")  # claims a billion entries
    lying.write_bytes(bytes(data))
    for bad in (unfinished, cut, lying, tmp_path / "missing.pack"):
        with pytest.raises(JailError) as caught:
            Pack.open(bad)
        assert caught.value.code in {"NOT_FOUND", "TOO_MANY_ENTRIES"}


def test_the_writer_never_writes_through_something_already_there(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    planted = tmp_path / "baseline.pack"
    os.symlink(target, planted)
    with pytest.raises(FileExistsError):
        PackWriter(planted)
    assert target.read_text() == "keep"


def test_folders_left_out_are_recorded_without_their_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the diff never walks (node_modules, .git) costs the pack nothing, bounds included."""
    monkeypatch.setattr(packs, "MAX_PACK_ENTRIES", 10)
    project = tmp_path / "project"
    for folder in ("node_modules/pkg", "src/.git/objects"):
        (project / folder).mkdir(parents=True)
    for index in range(30):
        (project / "node_modules" / "pkg" / f"m{index}.js").write_text("x")
        (project / "src" / ".git" / "objects" / f"o{index}").write_text("x")
    (project / "src" / "app.js").write_text("app")
    leave_out = {"node_modules", ".git"}.__contains__
    dest = tmp_path / "workspace"
    dest.mkdir()
    snapshot_copy(
        project,
        dest,
        home=tmp_path / "home",
        include_build_output=True,
        pack=tmp_path / "a.pack",
        pack_leave_out=leave_out,
    )
    assert len(list((dest / "node_modules" / "pkg").iterdir())) == 30  # the workspace has all
    pack_tree(project, tmp_path / "b.pack", leave_out)
    for pack in ("a.pack", "b.pack"):
        assert set(_packed(tmp_path / pack)) == {
            "node_modules", "src", "src/.git", "src/app.js",
        }  # fmt: skip
