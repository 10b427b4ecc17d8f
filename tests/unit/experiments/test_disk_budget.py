"""Measuring a slot for its byte budget: allocated blocks, hard links once, bounded walks."""

from __future__ import annotations

import os
from pathlib import Path

from app.experiments.disk_budget import measure_tree


def test_a_sparse_file_counts_what_it_holds(tmp_path: Path) -> None:
    with (tmp_path / "sparse").open("wb") as f:
        f.truncate(1 << 30)
    (tmp_path / "real").write_bytes(b"x" * 1_048_576)
    usage = measure_tree(tmp_path, 100)
    assert 1_048_576 <= usage.bytes < 2 * 1_048_576
    assert not usage.truncated


def test_hard_links_count_once_and_symlinks_are_not_followed(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1_048_576)
    for i in range(5):
        os.link(tmp_path / "a", tmp_path / f"link{i}")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * 4 * 1_048_576)
    (tmp_path / "out").symlink_to(outside, target_is_directory=True)
    assert measure_tree(tmp_path, 100).bytes < 2 * 1_048_576


def test_a_walk_stops_at_its_entry_bound_and_counts_as_over(tmp_path: Path) -> None:
    deep = tmp_path
    for i in range(50):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    for i in range(50):
        (tmp_path / f"f{i}").touch()
    usage = measure_tree(tmp_path, 40)
    assert usage.truncated
    assert usage.over(1 << 40)
    assert measure_tree(tmp_path, 1000).entries == 100  # iterative: depth is no problem
