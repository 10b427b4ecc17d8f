"""workspace.prepare's own copies, on real folders: given files land in the workspace and
the baseline alike (same bytes, modes and mtimes, so inspect_changes reads nothing), and
the baseline is one file (a pack), not a second tree."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from app.experiments.workspace import changes
from app.experiments.workspace import dirs as workspace
from app.experiments.workspace.dirs import ExperimentDirs, Owner
from jail import Jail
from jail import pack as packs
from jail.pack import Pack

FILES = {f"pkg/mod{i}.py": f"VALUE = {i}\n" for i in range(12)} | {"main.py": "print('hi')\n"}


def _tree(root: Path) -> dict[str, tuple[bytes, int, int]]:
    return {
        str(p.relative_to(root)): (
            p.read_bytes(),
            stat.S_IMODE(p.stat().st_mode),
            p.stat().st_mtime_ns,
        )
        for p in root.rglob("*")
        if p.is_file()
    }


def _packed(pack: Path) -> dict[str, tuple[bytes, int, int]]:
    with Pack.open(pack) as opened:
        return {
            info.path: (opened.read_bytes(info.path, max_bytes=1 << 20), info.mode, info.mtime_ns)
            for info in opened.entries()
            if info.kind == "file"
        }


async def test_given_files_are_written_to_both_sides_with_the_same_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs = ExperimentDirs.of(tmp_path, "exp_files")
    report = await workspace.prepare(
        dirs,
        files=FILES,
        project_path=None,
        copy_from=None,
        excludes=(),
        owner=None,
        in_thread=asyncio.to_thread,
    )
    assert (report.source, report.files) == ("files", len(FILES))
    assert _tree(dirs.workspace) == _packed(dirs.pack)
    assert set(_packed(dirs.pack)) == set(FILES)
    assert not dirs.baseline.exists()  # one file, not a second tree
    assert dirs.kept_baseline() == dirs.pack

    seen: list[str] = []
    open_fd = Jail.open_fd
    monkeypatch.setattr(
        Jail,
        "open_fd",
        lambda self, path, *a, **k: seen.append(path) or open_fd(self, path, *a, **k),
    )
    report = changes.inspect(dirs.workspace, dirs.pack, include_diff=True)
    assert report.files_changed == 0
    assert seen == []  # equal size and mtime: nothing read


async def test_the_workspace_is_the_sandbox_users_and_the_baseline_stays_the_servers(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.fail("giving files away takes root: run the tests as root (CI does)")
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "a.py").write_text("a = 1\n")
    os.symlink("a.py", project / "src" / "link.py")
    for source in ("files", "project_path"):
        dirs = ExperimentDirs.of(tmp_path, f"exp_{source}")
        await workspace.prepare(
            dirs,
            files={"src/a.py": "a = 1\n"} if source == "files" else None,
            project_path=project if source == "project_path" else None,
            copy_from=None,
            excludes=(),
            owner=Owner(4321, 4322),
            in_thread=asyncio.to_thread,
        )
        inside = [dirs.workspace, *dirs.workspace.rglob("*")]
        assert {(p.lstat().st_uid, p.lstat().st_gid) for p in inside} == {(4321, 4322)}
        assert dirs.pack.lstat().st_uid == 0


async def test_a_copied_experiment_s_dependencies_are_not_packed_and_its_changes_still_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """from_experiment copies node_modules (build output included) into the workspace; the
    baseline pack leaves its contents out (the diff never walks them), so many of them
    neither cost the pack nor reach its bounds."""
    monkeypatch.setattr(packs, "MAX_PACK_ENTRIES", 50)
    source = ExperimentDirs.of(tmp_path, "exp_source")
    (source.workspace / "node_modules" / "dep").mkdir(parents=True)
    for index in range(200):
        (source.workspace / "node_modules" / "dep" / f"m{index}.js").write_text("x")
    (source.workspace / "app.js").write_text("one\n")
    dirs = ExperimentDirs.of(tmp_path, "exp_copy")
    report = await workspace.prepare(
        dirs,
        files=None,
        project_path=None,
        copy_from=source,
        excludes=(),
        owner=None,
        in_thread=asyncio.to_thread,
    )
    assert report.files == 201
    assert set(_packed(dirs.pack)) == {"app.js"}

    def measured() -> changes.ChangeReport:
        return changes.inspect(
            dirs.workspace, dirs.kept_baseline(), include_diff=False, excluded_dirs=changes.EXCLUDED
        )

    assert measured().files_changed == 0
    (dirs.workspace / "app.js").write_text("two\n")
    (dirs.workspace / "node_modules" / "dep" / "m1.js").write_text("changed")
    assert [c.path for c in measured().modified] == ["app.js"]
