"""Shared fixtures: a sandbox root with an outside canary and a sibling sandbox next to it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _jail_testkit import CANARY_SECRET, SIBLING_SECRET, Layout, tree_state

from jail import Jail
from jail._syscalls import openat2_available


def _plant(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    # atime older than mtime: under relatime, any read of this file now updates
    # its atime, which tree_state compares. That is how tests prove "not read".
    mtime = path.stat().st_mtime_ns
    os.utime(path, ns=(0, mtime))


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    root = tmp_path / "sandbox"
    canary = tmp_path / "canary"
    sibling = tmp_path / "sibling"
    for folder in (root, canary / "sub", sibling):
        folder.mkdir(parents=True)
    _plant(canary / "secret.txt", CANARY_SECRET)
    _plant(canary / "sub" / "deep.txt", CANARY_SECRET)
    os.mkfifo(canary / "fifo")
    _plant(sibling / "file.txt", SIBLING_SECRET)
    return Layout(base=tmp_path, root=root, canary=canary, sibling=sibling)


RESOLVERS = [
    pytest.param(
        True,
        id="openat2",
        marks=pytest.mark.skipif(not openat2_available(), reason="kernel without openat2"),
    ),
    pytest.param(False, id="walk"),
]


@pytest.fixture(params=RESOLVERS)
def use_openat2(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def jail(layout: Layout, use_openat2: bool) -> Iterator[Jail]:
    with Jail.open(layout.root, use_openat2=use_openat2) as opened:
        yield opened


@pytest.fixture
def outside_unchanged(layout: Layout) -> Iterator[None]:
    """Assert that nothing outside the sandbox was read, written, created or removed."""
    before = {place: tree_state(place) for place in (layout.canary, layout.sibling)}
    names_before = sorted(p.name for p in layout.base.iterdir())
    yield
    for place, state in before.items():
        assert tree_state(place) == state, f"{place.name} changed"
    assert sorted(p.name for p in layout.base.iterdir()) == names_before
