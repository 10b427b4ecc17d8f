"""Change-inspection benchmark (a script, not a test): uv run python tests/bench/bench_changes.py

A generated 5,000-file workspace (log-normal sizes, 100 B to 64 KB, median about
3 KB, three to four levels deep) and its baseline, copied the way
``workspace.prepare`` copies it (``shutil.copytree(symlinks=True)``: copy2 keeps
mtimes, so unchanged files take the size+mtime fast path). Then 10 changes: 4
edits (one of the same size, with a new mtime, so it must be read), 2 files
created, 2 deleted, 1 chmod +x and 1 new symbolic link.

Prints the median of 10 runs of ``inspect(include_diff=True)`` (target: under
1 s), the same without the diff, and a bare ``os.walk`` + ``lstat`` of both trees
for reference; then again with a 20,000-file node_modules added to the
workspace (excluded, so it should cost nothing). Runs on ext4 under /var/tmp
and, when ``zfs list`` works and BENCH_ZFS_DIR names a folder on a mounted
dataset, there too.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.experiments.workspace.changes import ChangeReport, inspect

FILES = 5000
RUNS = 10
NODE_MODULES = 20_000
WORDS = ("def", "return", "self", "value", "items", "result", "config", "path", "data", "yield")


def _source(rng: random.Random, size: int) -> bytes:
    lines, total = [], 0
    while total < size:
        line = "    " * rng.randrange(3) + " ".join(rng.choices(WORDS, k=rng.randrange(2, 10)))
        lines.append(line + "\n")
        total += len(line) + 1
    return "".join(lines).encode()


def _relpath(i: int) -> str:
    deeper = f"/level{i % 3}" if i % 2 else ""
    return f"src/pkg{i % 25:02d}/mod{(i // 25) % 8}{deeper}/file{i:04d}.py"


def make_project(top: Path) -> tuple[Path, Path, int]:
    rng = random.Random(2024)
    ws, base = top / "workspace", top / "baseline"
    total = 0
    for i in range(FILES):
        path = ws / _relpath(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _source(rng, int(min(64_000, max(100, rng.lognormvariate(8.0, 1.0)))))
        path.write_bytes(data)
        total += len(data)
    shutil.copytree(ws, base, symlinks=True)
    return ws, base, total


def make_changes(ws: Path) -> None:
    edit = ws / _relpath(10)
    lines = edit.read_text().splitlines(keepends=True)
    edit.write_text("".join([*lines[:5], "    changed = True\n", *lines[6:]]))
    (ws / _relpath(11)).write_text((ws / _relpath(11)).read_text() + "appended = 1\n" * 5)
    same = ws / _relpath(12)
    data = same.read_bytes()
    mtime = same.stat().st_mtime_ns
    same.write_bytes(b"X" + data[1:])  # same size: only the new mtime gives it away
    os.utime(same, ns=(mtime + 10**9, mtime + 10**9))
    shorter = ws / _relpath(13)
    shorter.write_text("".join(shorter.read_text().splitlines(keepends=True)[::2]))
    (ws / "src" / "new_module.py").write_text("def new():\n    return 1\n")
    (ws / "src" / "pkg00" / "new_test.py").write_text("def test_new():\n    assert True\n")
    (ws / _relpath(20)).unlink()
    (ws / _relpath(21)).unlink()
    (ws / _relpath(30)).chmod(0o755)
    os.symlink("pkg00", ws / "src" / "alias")


def add_node_modules(ws: Path) -> None:
    for i in range(NODE_MODULES):
        path = ws / "node_modules" / f"dep{i // 100:03d}" / f"index{i % 100}.js"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"module.exports = 1;\n")


def _median_ms(fn: Callable[[], object]) -> tuple[float, float]:
    runs = []
    for _ in range(RUNS):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs) * 1000, max(runs) * 1000


def _stat_walk(*tops: Path) -> int:
    count = 0
    for top in tops:
        for folder, dirs, files in os.walk(top):
            for name in dirs + files:
                os.lstat(os.path.join(folder, name))
                count += 1
    return count


def _check(report: ChangeReport) -> None:
    found = (len(report.created), len(report.modified), len(report.deleted))
    assert found == (3, 5, 2), (found, report.notes)
    assert report.notes == [], report.notes
    assert report.diff is not None
    assert "changed = True" in report.diff


def bench(label: str, top: Path) -> None:
    ws, base, total = make_project(top)
    make_changes(ws)
    print(f"{label}: {FILES} files, {total / 1e6:.1f} MB, 10 changes")
    for extra in ("", f" + {NODE_MODULES}-file node_modules"):
        if extra:
            add_node_modules(ws)
        _check(inspect(ws, base, include_diff=True))
        with_diff, worst = _median_ms(lambda: inspect(ws, base, include_diff=True))
        no_diff, _ = _median_ms(lambda: inspect(ws, base, include_diff=False))
        walk, _ = _median_ms(lambda: _stat_walk(ws, base))
        print(
            f"  inspect{extra}: with diff median {with_diff:6.1f} ms (worst {worst:6.1f}),"
            f" without diff {no_diff:6.1f} ms;  bare os.walk+lstat of both trees {walk:6.1f} ms"
        )


def _zfs_dir() -> Path | None:
    folder = os.environ.get("BENCH_ZFS_DIR")
    if not folder or shutil.which("zfs") is None:
        return None
    listed = subprocess.run(["zfs", "list"], capture_output=True, check=False)
    return Path(folder) if listed.returncode == 0 and Path(folder).is_dir() else None


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-changes-", dir="/var/tmp") as tmp:
        bench("ext4 (/var/tmp)", Path(tmp))
    zfs = _zfs_dir()
    if zfs is None:
        print("zfs: skipped (set BENCH_ZFS_DIR to a folder on a mounted zfs dataset)")
        return
    with tempfile.TemporaryDirectory(prefix="bench-changes-", dir=zfs) as tmp:
        bench(f"zfs ({zfs})", Path(tmp))


if __name__ == "__main__":
    main()
