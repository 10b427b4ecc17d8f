"""File tools' core on real folders, through the real jail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.errors import ServiceError
from app.experiments.workspace import files
from jail import EditState, JailError

EXP = "exp_1"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "app.py").write_text("one\ntwo\nthree\ntwo\n")
    (workspace / "data.bin").write_bytes(b"\x00\x01\x02binary")
    return workspace


def test_read_whole_and_a_line_range(ws: Path) -> None:
    edits = EditState()
    whole = files.read_file(ws, "app.py", edits, EXP)
    assert whole.content == "one\ntwo\nthree\ntwo\n"
    assert whole.total_lines == 4
    part = files.read_file(ws, "app.py", edits, EXP, start_line=2, end_line=3)
    assert (part.content, part.start_line, part.end_line) == ("two\nthree\n", 2, 3)


def test_binary_files_are_reported_not_dumped(ws: Path) -> None:
    result = files.read_file(ws, "data.bin", EditState(), EXP)
    assert result.binary
    assert result.content is None


def test_reads_are_capped(ws: Path) -> None:
    (ws / "big.txt").write_text("x" * 5000)
    result = files.read_file(ws, "big.txt", EditState(), EXP, max_bytes=100)
    assert result.truncated
    assert len(result.content or "") == 100


def test_write_creates_parents_and_allows_an_edit_without_rereading(ws: Path) -> None:
    edits = EditState()
    files.write_file(ws, "pkg/sub/new.py", "a = 1\n", edits, EXP)
    assert (ws / "pkg" / "sub" / "new.py").read_text() == "a = 1\n"
    files.edit_file(ws, "pkg/sub/new.py", "a = 1", "a = 2", edits, EXP)
    assert (ws / "pkg" / "sub" / "new.py").read_text() == "a = 2\n"


def test_edit_needs_a_read_and_refuses_stale_and_ambiguous_edits(ws: Path) -> None:
    edits = EditState()
    with pytest.raises(JailError) as caught:
        files.edit_file(ws, "app.py", "one", "ONE", edits, EXP)
    assert caught.value.code == "EDIT_WITHOUT_READ"
    files.read_file(ws, "app.py", edits, EXP)
    with pytest.raises(ServiceError) as ambiguous:
        files.edit_file(ws, "app.py", "two", "TWO", edits, EXP)
    assert ambiguous.value.code == "EDIT_NOT_UNIQUE"
    assert ambiguous.value.details["occurrences"] == 2
    with pytest.raises(ServiceError) as absent:
        files.edit_file(ws, "app.py", "four", "FOUR", edits, EXP)
    assert absent.value.code == "EDIT_NOT_FOUND"
    done = files.edit_file(ws, "app.py", "two", "TWO", edits, EXP, replace_all=True)
    assert done.replacements == 2
    # Something in the container changes the file: the next edit is stale.
    (ws / "app.py").write_text("changed by the container\n")
    with pytest.raises(JailError) as stale:
        files.edit_file(ws, "app.py", "changed", "x", edits, EXP)
    assert stale.value.code == "STALE_EDIT"
    assert (ws / "app.py").read_text() == "changed by the container\n"


def test_edit_state_is_per_experiment(ws: Path) -> None:
    edits = EditState()
    files.read_file(ws, "app.py", edits, "exp_other")
    with pytest.raises(JailError):
        files.edit_file(ws, "app.py", "one", "ONE", edits, EXP)


def test_links_out_of_the_workspace_are_refused(ws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.symlink(secret, ws / "leak")
    os.symlink("../secret.txt", ws / "leak2")
    for name in ("leak", "leak2"):
        with pytest.raises(JailError) as caught:
            files.read_file(ws, name, EditState(), EXP)
        assert caught.value.code == "SYMLINK_ESCAPE"
        assert "host secret" not in caught.value.message
    with pytest.raises(JailError):
        files.write_file(ws, "leak", "overwrite", EditState(), EXP)
    assert secret.read_text() == "host secret"


def test_list_is_bounded_and_skips_dependency_folders(ws: Path) -> None:
    (ws / "node_modules" / "dep").mkdir(parents=True)
    (ws / "node_modules" / "dep" / "index.js").write_text("x")
    for i in range(30):
        (ws / f"f{i}.txt").write_text("x")
    tree = files.list_files(ws, max_entries=10)
    assert tree.truncated
    assert len(tree.entries) == 10
    full = files.list_files(ws, max_entries=500)
    assert not any("index.js" in e.path for e in full.entries)
    assert any(e.path == "app.py" and e.size == 18 for e in full.entries)


def test_search_finds_lines_and_refuses_bad_patterns(ws: Path) -> None:
    (ws / "pkg").mkdir()
    (ws / "pkg" / "mod.py").write_text("def two():\n    return 2\n")
    result = files.search(ws, r"\btwo\b")
    assert {(m.path, m.line) for m in result.matches} == {
        ("app.py", 2),
        ("app.py", 4),
        ("pkg/mod.py", 1),
    }
    with pytest.raises(ServiceError):
        files.search(ws, "(unclosed")
