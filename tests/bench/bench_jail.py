"""Jail benchmarks (a script, not a test): uv run python tests/bench/bench_jail.py

1. A jailed open+read of a small file, as a ratio to plain ``open()`` + ``read()``
   in the same run (target: under 3x), for both resolvers.
2. A snapshot copy of a generated 5,000-file project (target: well under 1 s),
   next to ``shutil.copytree`` of the same tree for reference.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from jail import Jail, snapshot_copy
from jail._syscalls import openat2_available

BATCHES = 25
PER_BATCH = 2000
PROJECT_FILES = 5000
SNAPSHOT_RUNS = 5


def _per_call_us(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    for _ in range(PER_BATCH):
        fn()
    return (time.perf_counter() - started) / PER_BATCH * 1e6


def bench_read(base: Path) -> None:
    root = base / "sandbox"
    (root / "src" / "pkg").mkdir(parents=True)
    small = root / "src" / "pkg" / "small.txt"
    small.write_bytes(os.urandom(512).hex().encode())  # 1 KiB

    def plain() -> bytes:
        with open(small, "rb") as f:
            return f.read()

    resolvers = [True, False] if openat2_available() else [False]
    for use_openat2 in resolvers:
        with Jail.open(root, use_openat2=use_openat2) as jail:

            def jailed(jail: Jail = jail) -> bytes:
                return jail.read_bytes("src/pkg/small.txt", max_bytes=1 << 20)

            assert jailed() == plain()
            plain_runs, jailed_runs = [], []
            for _ in range(BATCHES):  # interleaved, so drift hits both alike
                plain_runs.append(_per_call_us(plain))
                jailed_runs.append(_per_call_us(jailed))
        plain_us, jailed_us = statistics.median(plain_runs), statistics.median(jailed_runs)
        name = "openat2" if use_openat2 else "walk (fallback)"
        print(
            f"read 1 KiB, resolver={name:16} plain open()+read {plain_us:6.2f} us"
            f"  jailed {jailed_us:6.2f} us  ratio {jailed_us / plain_us:4.2f}x"
        )


def _make_project(top: Path) -> int:
    """5,000 source files in 50 folders, plus secrets and build output to skip."""
    payload = (b"def f():\n    return 42\n" * 80)[:2000]
    total = 0
    for d in range(50):
        folder = top / "src" / f"pkg{d:02d}"
        folder.mkdir(parents=True)
        for n in range(PROJECT_FILES // 50):
            (folder / f"mod{n:03d}.py").write_bytes(payload)
            total += len(payload)
    (top / ".env").write_bytes(b"SECRET=1")
    (top / ".ssh").mkdir()
    (top / ".ssh" / "id_rsa").write_bytes(b"key")
    (top / "node_modules" / "dep").mkdir(parents=True)
    for n in range(500):
        (top / "node_modules" / "dep" / f"{n}.js").write_bytes(payload)
    return total


def bench_snapshot(base: Path) -> None:
    project = base / "project"
    total = _make_project(project)
    runs, reference = [], []
    for run in range(SNAPSHOT_RUNS):
        dest = base / f"dest-{run}"
        dest.mkdir()
        started = time.perf_counter()
        report = snapshot_copy(project, dest, home=base / "home")
        runs.append(time.perf_counter() - started)
        assert report.files_copied == PROJECT_FILES, report
        started = time.perf_counter()
        shutil.copytree(project, base / f"copytree-{run}", symlinks=True)
        reference.append(time.perf_counter() - started)
    print(
        f"snapshot_copy {PROJECT_FILES} files ({total / 1e6:.1f} MB, +502 skipped):"
        f" median {statistics.median(runs) * 1000:.0f} ms, best {min(runs) * 1000:.0f} ms"
        f"  (shutil.copytree of the whole tree: median"
        f" {statistics.median(reference) * 1000:.0f} ms)"
    )


def main() -> None:
    # Keep the per-copy log event out of the figures.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    uname = os.uname()
    print(f"kernel {uname.release}, openat2 available: {openat2_available()}")
    with tempfile.TemporaryDirectory(prefix="bench-jail-") as tmp:
        bench_read(Path(tmp))
        bench_snapshot(Path(tmp))


if __name__ == "__main__":
    main()
