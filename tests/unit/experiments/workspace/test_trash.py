"""Destroyed experiments' folders: moved aside at once, deleted in the background, and
what a stopped server left in a slot's trash is deleted at the next start."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from app.experiments.workspace.trash import TRASH, Trash
from jail.tree_delete import delete_tree


def tree(root: Path, files: int = 50) -> Path:
    (root / "workspace" / "src").mkdir(parents=True)
    for i in range(files):
        (root / "workspace" / "src" / f"f{i}.py").write_text("x\n")
    (root / "workspace" / "out").symlink_to(root.parent.parent / "outside")  # never followed
    return root


def outside_kept(tmp_path: Path) -> bool:
    return (tmp_path / "outside" / "keep").exists()


async def test_discard_answers_before_the_deletion_ends(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("not the tenant's")
    slot = tmp_path / "slot-000"
    root = tree(slot / "exp-a")
    release, started = threading.Event(), threading.Event()

    def held(path: Path, stop: threading.Event) -> None:
        started.set()
        release.wait(30)  # the deletion cannot finish until the test says so
        delete_tree(path, stop=stop)

    trash = Trash(delete=held)
    await trash.discard(root)
    assert not root.exists()  # gone from its place when discard returns...
    (aside,) = (slot / TRASH).iterdir()
    assert (aside / "workspace" / "src" / "f0.py").exists()  # ...though not deleted yet
    assert started.wait(10)
    release.set()
    await trash.idle()
    assert list((slot / TRASH).iterdir()) == []
    assert outside_kept(tmp_path)  # the link in the tree was not followed
    await trash.close()


async def test_a_restart_deletes_what_the_last_run_left(tmp_path: Path) -> None:
    slots = [tmp_path / f"slot-{i:03d}" for i in range(3)]
    for slot in slots:
        slot.mkdir()
    tree(slots[1] / TRASH / "exp-b.123.abc")  # a deletion the stopped server never finished
    tree(slots[2] / "exp-live")  # a live experiment: untouched
    trash = Trash()
    trash.sweep(slots)
    await trash.idle()
    assert list((slots[1] / TRASH).iterdir()) == []
    assert (slots[2] / "exp-live" / "workspace" / "src" / "f0.py").exists()
    await trash.close()


async def test_close_stops_a_long_deletion_and_leaves_it_for_the_next_start(
    tmp_path: Path,
) -> None:
    slot = tmp_path / "slot-000"
    root = tree(slot / "exp-a")
    entered = threading.Event()

    def slow(path: Path, stop: threading.Event) -> None:
        entered.set()
        stop.wait(30)  # as a huge tree would: until close() asks it to stop
        delete_tree(path, stop=stop)

    trash = Trash(delete=slow, close_timeout_s=0.1)
    await trash.discard(root)
    assert entered.wait(10)
    await trash.close()
    (left,) = (slot / TRASH).iterdir()  # stopped: the next start's sweep deletes it
    again = Trash()
    again.sweep([slot])
    await again.idle()
    assert not left.exists()
    await again.close()


async def test_a_folder_is_deleted_only_once_its_container_is_gone(tmp_path: Path) -> None:
    """A live container still mounts the folder: its deletion waits for the removal,
    and the slot counts it as pending meanwhile (the disk budget waits for it)."""
    slot = tmp_path / "slot-000"
    root = tree(slot / "exp-a")
    trash = Trash()
    removal: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    await trash.discard(root, after=removal)
    assert not root.exists()
    (aside,) = (slot / TRASH).iterdir()
    assert await trash.settled(slot, 0)  # pending in its slot, from the move on
    for _ in range(20):
        await asyncio.sleep(0)
    assert (aside / "workspace" / "src" / "f0.py").exists()  # the container is not gone
    removal.set_result(True)
    await trash.idle()
    assert list((slot / TRASH).iterdir()) == []
    await trash.close()


async def test_a_folder_whose_container_may_still_live_is_left_to_the_next_start(
    tmp_path: Path,
) -> None:
    slot = tmp_path / "slot-000"
    root = tree(slot / "exp-a")
    trash = Trash()
    removal: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    await trash.discard(root, after=removal)
    removal.set_result(False)  # the engine never removed it
    await trash.idle()
    (left,) = (slot / TRASH).iterdir()
    assert (left / "workspace" / "src" / "f0.py").exists()
    await trash.close()
    again = Trash()
    again.sweep([slot])  # after the start-up's orphan sweep has removed the container
    await again.idle()
    assert not left.exists()
    await again.close()
