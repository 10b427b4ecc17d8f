"""Benchmark: how long does it take to empty a slot holding 5,000 small files?

    uv run python tests/bench/bench_slots.py [--zfs-parent slotdev/bench] [--reps 7]

Compares, in one run, over several repetitions (medians printed):

- ``rmtree``: a plain ``rm -rf`` (``shutil.rmtree``) and ``mkdir``, the naive reset;
- ``dir``:    ``DirSlotStore.reset``, rename aside + fresh folder, delete in background;
- ``zfs``:    ``ZfsSlotStore.reset``, ``zfs rollback -r <slot>@empty`` (with --zfs-parent).

For each: the time until ``reset`` returns, the time until the caller sees the slot
empty (``os.listdir`` is ``[]``) and, for ``dir``, until the old tree is really gone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from pool_fakes import opened

from pool import _zfs
from pool.provision import provision_dir, provision_zfs
from pool.slots import Slot
from pool.slots_dir import DirSlotStore
from pool.slots_zfs import ZfsSlotStore


@dataclass
class Figures:
    fill: list[float] = field(default_factory=list)
    returned: list[float] = field(default_factory=list)
    visible_empty: list[float] = field(default_factory=list)
    gone: list[float] = field(default_factory=list)


def fill(root: Path, files: int) -> float:
    """An agent's leftovers: ``files`` small files spread over 50 folders."""
    started = time.perf_counter()
    for i in range(files):
        folder = root / f"pkg{i % 50}"
        if i < 50:
            folder.mkdir()
        (folder / f"mod{i}.py").write_text("x = 1\n")
    return time.perf_counter() - started


async def poll(done: Callable[[], bool], every: float = 0.001, limit: float = 600) -> None:
    """Poll on purpose: a filesystem offers no event for "this folder is now empty"."""
    for _ in range(int(limit / every)):
        if done():
            return
        await asyncio.sleep(every)
    raise TimeoutError(f"not done after {limit} s")


async def measure(
    slot: Slot, files: int, empty: Callable[[], Awaitable[None]], figures: Figures
) -> float:
    figures.fill.append(fill(slot.root, files))
    started = time.perf_counter()
    await empty()
    figures.returned.append(time.perf_counter() - started)
    await poll(lambda: not os.listdir(slot.root))
    figures.visible_empty.append(time.perf_counter() - started)
    return started


async def bench_rmtree(base: Path, files: int, reps: int) -> Figures:
    figures = Figures()
    slot = Slot(0, "slot-000", base / "rmtree" / "slot-000")
    slot.root.mkdir(parents=True, mode=0o700)

    async def empty() -> None:
        shutil.rmtree(slot.root)
        slot.root.mkdir(mode=0o700)

    for _ in range(reps):
        started = await measure(slot, files, empty, figures)
        figures.gone.append(time.perf_counter() - started)
    return figures


async def bench_dir(base: Path, files: int, reps: int) -> Figures:
    figures = Figures()
    state = base / "dir-state"
    await provision_dir(state, 1, owner=None)
    store = await opened(DirSlotStore(state))
    slot = store.slot(0)
    for _ in range(reps):
        started = await measure(slot, files, lambda: store.reset(slot), figures)
        await poll(lambda: not any(store.trash.iterdir()))
        figures.gone.append(time.perf_counter() - started)
    await store.close()
    return figures


async def bench_zfs(parent: str, files: int, reps: int) -> Figures:
    figures = Figures()
    dataset = f"{parent}/bench{uuid.uuid4().hex[:6]}"
    await provision_zfs(dataset, 1, quota=None, owner=None)
    try:
        store = await opened(ZfsSlotStore(dataset))
        slot = store.slot(0)
        for _ in range(reps):
            started = await measure(slot, files, lambda: store.reset(slot), figures)
            figures.gone.append(time.perf_counter() - started)  # rollback frees at once
        await store.close()
    finally:
        await _zfs.destroy(dataset)
    return figures


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values) * 1000:9.1f}"


def spread(values: list[float]) -> str:
    return f"{min(values) * 1000:.1f}-{max(values) * 1000:.1f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zfs-parent", help="dataset to bench the zfs backend under")
    parser.add_argument("--files", type=int, default=5_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="where dir trees go")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    results: dict[str, Figures] = {}
    with tempfile.TemporaryDirectory(prefix="bench-slots-", dir=args.dir) as tmp:
        base = Path(tmp)
        results["rmtree"] = await bench_rmtree(base, args.files, args.reps)
        results["dir"] = await bench_dir(base, args.files, args.reps)
    if args.zfs_parent:
        results["zfs"] = await bench_zfs(args.zfs_parent, args.files, args.reps)

    print(f"Emptying a slot holding {args.files} small files; median of {args.reps} runs, ms.")
    print(f"{'backend':8} {'returns':>9} {'visible-empty':>14} {'tree gone':>10}   "
          f"{'returns min-max':>16} {'fill':>9}")  # fmt: skip
    for name, fig in results.items():
        print(
            f"{name:8} {ms(fig.returned)} {ms(fig.visible_empty):>14} {ms(fig.gone):>10}   "
            f"{spread(fig.returned):>16} {ms(fig.fill)}"
        )
    if not args.zfs_parent:
        print("(zfs skipped: pass --zfs-parent POOL/DATASET to include it)")


if __name__ == "__main__":
    asyncio.run(main())
