"""Measuring a slot for its byte budget: allocated blocks, hard links once, bounded walks,
never through a link (even one swapped in mid-walk), no folder out of reach."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.experiments.disk_budget import measure_tree

MB = 1_048_576


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


def test_a_folder_swapped_for_a_link_mid_walk_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot, outside = tmp_path / "slot", tmp_path / "outside"
    (slot / "d").mkdir(parents=True)
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * 4 * MB)
    real_scandir = os.scandir
    swapped: list[bool] = []

    def swap_after(listing: Iterator[os.DirEntry[str]]) -> Iterator[os.DirEntry[str]]:
        for entry in listing:
            yield entry  # listed and measured as a folder: now swapped before it is opened
            if entry.name == "d" and not swapped:
                (slot / "d").rename(tmp_path / "moved")
                (slot / "d").symlink_to(outside, target_is_directory=True)
                swapped.append(True)

    @contextlib.contextmanager
    def scandir_then_swap(target: Any) -> Iterator[Iterator[os.DirEntry[str]]]:
        with real_scandir(target) as listing:
            yield swap_after(listing)

    monkeypatch.setattr(os, "scandir", scandir_then_swap)
    usage = measure_tree(slot, 100)
    monkeypatch.undo()
    assert swapped
    assert usage.bytes < MB, "the walk followed the link out of the slot"


def test_a_folder_too_deep_to_open_by_path_counts_as_over(tmp_path: Path) -> None:
    name = "n" * 250
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):  # 20 * 251 bytes: past PATH_MAX (4096)
            os.mkdir(name, dir_fd=fd)
            deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        big = os.open("big", os.O_CREAT | os.O_WRONLY, dir_fd=fd)
        os.write(big, b"z" * 2 * MB)
        os.close(big)
    finally:
        os.close(fd)
    usage = measure_tree(tmp_path, 1000)
    assert usage.over(1 << 40), "the bytes beyond PATH_MAX were not counted"
