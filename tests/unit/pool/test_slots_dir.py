"""DirSlotStore and provision_dir against real folders in tmp_path."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from deep_trees import build_deep_tree
from pool_fakes import opened
from timing import fastest, fastest_async

from jail.tree_delete import delete_tree
from pool import slots_dir
from pool.errors import PoolError
from pool.provision import provision_dir
from pool.slots import Slot
from pool.slots_dir import DirSlotStore

FILES = 5_000


def fill(root: Path, count: int = FILES) -> None:
    """A tree shaped like an agent's leftovers: many small files, a few folders."""
    for folder in range(10):
        sub = root / f"pkg{folder}" / "src"
        sub.mkdir(parents=True)
        for i in range(count // 10):
            (sub / f"m{i}.py").write_text("x = 1\n")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[DirSlotStore]:
    await provision_dir(tmp_path, 3, owner=None)
    store = await opened(DirSlotStore(tmp_path))
    yield store
    await store.close()


async def test_provision_creates_slots_and_is_idempotent(tmp_path: Path) -> None:
    first = await provision_dir(tmp_path, 4, owner=None)
    second = await provision_dir(tmp_path, 4, owner=None)

    assert (first.created, first.repaired, first.untouched) == (4, 0, 0)
    assert (second.created, second.repaired, second.untouched) == (0, 0, 4)
    assert sorted(p.name for p in (tmp_path / "slots").iterdir()) == [
        ".trash", "slot-000", "slot-001", "slot-002", "slot-003",
    ]  # fmt: skip
    assert all(mode(tmp_path / "slots" / f"slot-00{i}") == 0o700 for i in range(4))


async def test_provision_grows_the_pool_without_touching_existing_slots(tmp_path: Path) -> None:
    await provision_dir(tmp_path, 2, owner=None)
    (tmp_path / "slots" / "slot-001" / "keep.txt").write_text("work")

    report = await provision_dir(tmp_path, 5, owner=None)

    assert (report.created, report.untouched) == (3, 2)
    assert (tmp_path / "slots" / "slot-001" / "keep.txt").read_text() == "work"


async def test_reprovision_never_empties_or_changes_a_leased_slot(tmp_path: Path) -> None:
    await provision_dir(tmp_path, 3, owner=None)
    leased = tmp_path / "slots" / "slot-001"
    (leased / "results.csv").write_text("a,b\n")
    leased.chmod(0o755)  # wrong, but the sandbox is live: report, don't touch

    report = await provision_dir(tmp_path, 3, owner=None, leased={1})

    assert report.skipped_leased == ("slot-001",)
    assert (report.repaired, report.untouched) == (0, 2)
    assert "mode is 0755" in report.notes[0]
    assert (leased / "results.csv").read_text() == "a,b\n"
    assert mode(leased) == 0o755

    freed = await provision_dir(tmp_path, 3, owner=None)
    assert (freed.repaired, freed.skipped_leased) == (1, ())
    assert mode(leased) == 0o700
    assert (leased / "results.csv").exists()  # repairs fix modes, they never empty


async def test_provision_replaces_a_file_where_a_slot_folder_belongs(tmp_path: Path) -> None:
    await provision_dir(tmp_path, 2, owner=None)
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret").write_text("s")
    slot0, slot1 = tmp_path / "slots" / "slot-000", tmp_path / "slots" / "slot-001"
    slot0.rmdir()
    slot0.symlink_to(target)
    slot1.rmdir()
    slot1.write_text("junk")

    skipped = await provision_dir(tmp_path, 2, owner=None, leased={0, 1})
    assert skipped.skipped_leased == ("slot-000", "slot-001")
    assert slot0.is_symlink()

    report = await provision_dir(tmp_path, 2, owner=None)
    assert report.repaired == 2
    assert slot0.is_dir()
    assert not slot0.is_symlink()
    assert slot1.is_dir()
    assert (target / "secret").exists()  # the link went, never what it pointed to


async def test_provision_refuses_an_unknown_owner(tmp_path: Path) -> None:
    with pytest.raises(PoolError) as caught:
        await provision_dir(tmp_path, 1, owner="no-such-user-here")
    assert caught.value.code == "UNKNOWN_OWNER"
    assert not (tmp_path / "slots").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
async def test_provision_owner_and_reset_keep_it(tmp_path: Path) -> None:
    await provision_dir(tmp_path, 1, owner="nobody")
    store = await opened(DirSlotStore(tmp_path))
    root = store.slot(0).root
    nobody = root.stat().st_uid
    assert nobody != 0

    await store.reset(store.slot(0))
    await store.close()

    assert root.stat().st_uid == nobody
    assert (tmp_path / "slots").stat().st_uid == nobody


async def test_missing_names_absent_and_unusable_slots(tmp_path: Path) -> None:
    await provision_dir(tmp_path, 3, owner=None)
    (tmp_path / "slots" / "slot-001").rmdir()
    (tmp_path / "slots" / "slot-001").write_text("not a folder")
    store = await opened(DirSlotStore(tmp_path))

    assert await store.missing(3) == ["slot-001"]
    assert await store.missing(5) == ["slot-001", "slot-003", "slot-004"]
    await store.close()


async def test_missing_before_any_provisioning_names_every_slot(tmp_path: Path) -> None:
    store = await opened(DirSlotStore(tmp_path))
    assert await store.missing(2) == ["slot-000", "slot-001"]
    assert not (tmp_path / "slots").exists()  # opening the store creates nothing
    await store.close()


def test_slot_is_derived_without_io(tmp_path: Path) -> None:
    store = DirSlotStore(tmp_path / "never-created")
    assert store.slot(7) == Slot(7, "slot-007", tmp_path / "never-created" / "slots" / "slot-007")


async def test_reset_empties_5000_files_fast_and_deletes_them_in_background(
    tmp_path: Path,
) -> None:
    await provision_dir(tmp_path, 1, owner=None)
    store = await opened(DirSlotStore(tmp_path))
    slot = store.slot(0)

    async def reset() -> None:
        await store.reset(slot)
        assert list(slot.root.iterdir()) == []  # visible-empty the moment reset returns
        assert mode(slot.root) == 0o700

    took = await fastest_async(reset, runs=2, before=lambda: fill(slot.root))
    # The floor, measured here: deleting such a tree where it lies, as a reset that
    # did not leave it to the background would.
    twin = tmp_path / "twin"
    deleting = fastest(lambda: shutil.rmtree(twin), runs=1, before=lambda: fill(twin))
    print(f"reset {took * 1000:.1f} ms, deleting the tree {deleting * 1000:.1f} ms")
    assert took < deleting / 4, f"reset took {took * 1000:.0f} ms"
    await store.close()
    assert list(store.trash.iterdir()) == []


async def test_reset_while_a_file_inside_is_open(store: DirSlotStore) -> None:
    slot = store.slot(1)
    fill(slot.root, 100)
    with (slot.root / "log.txt").open("w") as handle:
        handle.write("before")
        await store.reset(slot)
        handle.write("after")  # goes to the old tree, never into the new slot
        handle.flush()
        assert list(slot.root.iterdir()) == []

    await store.close()
    assert list(store.trash.iterdir()) == []
    assert list(slot.root.iterdir()) == []


async def test_reset_recreates_a_vanished_slot(store: DirSlotStore) -> None:
    slot = store.slot(2)
    slot.root.rmdir()

    await store.reset(slot)

    assert slot.root.is_dir()
    assert mode(slot.root) == 0o700


async def test_reset_gives_0700_whatever_the_umask(store: DirSlotStore) -> None:
    previous = os.umask(0o277)
    try:
        await store.reset(store.slot(0))
    finally:
        os.umask(previous)
    assert mode(store.slot(0).root) == 0o700


async def test_reset_after_close_is_refused(tmp_path: Path) -> None:
    await provision_dir(tmp_path, 1, owner=None)
    store = await opened(DirSlotStore(tmp_path))
    await store.close()

    with pytest.raises(PoolError) as caught:
        await store.reset(store.slot(0))
    assert caught.value.code == "SLOT_STORE_CLOSED"


async def test_reset_without_provisioning_says_the_slot_is_missing(tmp_path: Path) -> None:
    store = await opened(DirSlotStore(tmp_path))
    with pytest.raises(PoolError) as caught:
        await store.reset(store.slot(0))
    assert caught.value.code == "SLOT_MISSING"
    assert "provision" in str(caught.value)
    await store.close()


async def test_trash_left_by_a_crash_is_deleted_at_start(tmp_path: Path) -> None:
    await provision_dir(tmp_path, 1, owner=None)
    trash = tmp_path / "slots" / ".trash"
    leftover = trash / "slot-000.1700000000.abcdef"
    fill(leftover, 200)
    locked = leftover / "locked"
    locked.mkdir()
    (locked / "f").write_text("x")
    locked.chmod(0o000)  # agents can leave folders nobody may enter
    (trash / "slot-000.1700000001.stray-file").write_text("x")

    store = await opened(DirSlotStore(tmp_path))
    await store.close()

    assert list(trash.iterdir()) == []


async def test_deletion_never_follows_links_out_of_the_trash(tmp_path: Path) -> None:
    await provision_dir(tmp_path, 1, owner=None)
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "precious").write_text("keep")
    store = await opened(DirSlotStore(tmp_path))
    slot = store.slot(0)
    (slot.root / "escape").symlink_to(outside)
    (slot.root / "sub").mkdir()
    (slot.root / "sub" / "escape").symlink_to(outside / "deep")

    await store.reset(slot)
    await store.close()

    assert (outside / "deep" / "precious").read_text() == "keep"
    assert list(store.trash.iterdir()) == []


async def test_close_is_bounded_and_the_rest_is_swept_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The deletion is held at its start until close() has returned, so a close that
    # waited for it would never return (the generous wait_for fails it), whatever the
    # machine's speed; a clock bound on close() could not tell the two apart.
    await provision_dir(tmp_path, 1, owner=None)
    store = await opened(DirSlotStore(tmp_path, close_timeout=0.0))
    slot = store.slot(0)
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def held(path: Path, *, stop: threading.Event) -> None:
        started.set()
        try:
            release.wait(60)
            delete_tree(path, stop=stop)  # the real deletion, told to stop by close()
        finally:
            finished.set()

    monkeypatch.setattr(slots_dir, "delete_tree", held)
    fill(slot.root, 2_000)
    await store.reset(slot)
    assert await asyncio.to_thread(started.wait, 30)

    await asyncio.wait_for(store.close(), timeout=30)  # returns with the deletion unfinished
    release.set()
    assert await asyncio.to_thread(finished.wait, 30)
    assert list(store.trash.iterdir()) != [], "the deletion went on after close()"

    monkeypatch.undo()
    again = await opened(DirSlotStore(tmp_path))
    await again.close()
    assert list(again.trash.iterdir()) == []


@pytest.mark.parametrize("depth", [1_500, 5_000])
async def test_reset_deletes_a_tree_deeper_than_recursion_allows(
    tmp_path: Path, depth: int
) -> None:
    # shutil.rmtree raised RecursionError here and the trash stayed forever.
    await provision_dir(tmp_path, 1, owner=None)
    store = await opened(DirSlotStore(tmp_path))
    slot = store.slot(0)
    build_deep_tree(slot.root, depth)
    try:
        await store.reset(slot)
        await store.close()
        assert list(store.trash.iterdir()) == []
    finally:
        delete_tree(tmp_path / "slots")  # pytest's own cleanup would choke on it


async def test_a_failed_delete_is_logged_and_retried_at_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pool.slots_dir as slots_dir

    real = slots_dir.delete_tree
    failures: list[Path] = []

    def fail_once(path: Path, **kwargs: object) -> None:
        if not failures:
            failures.append(path)
            raise RecursionError("an unexpected failure in the delete")
        real(path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(slots_dir, "delete_tree", fail_once)
    await provision_dir(tmp_path, 1, owner=None)
    store = await opened(DirSlotStore(tmp_path))
    slot = store.slot(0)
    fill(slot.root, 100)
    await store.reset(slot)  # the failure stays on the worker: reset itself succeeds
    await store.close()
    assert failures
    assert [p.name for p in store.trash.iterdir()] == [failures[0].name]

    again = await opened(DirSlotStore(tmp_path))
    await again.close()
    assert list(again.trash.iterdir()) == []
