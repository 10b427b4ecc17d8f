"""The state dir's lock within one process (two real processes: tests/e2e)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from app.root.state_lock import LOCK_FILE, StateDirInUse, hold_state_dir, release_state_dir
from app.settings import load_settings


def test_one_process_may_hold_it_twice_and_the_last_release_unlocks(tmp_path: Path) -> None:
    settings = load_settings().storage
    settings.state_dir.mkdir(parents=True)
    hold_state_dir(settings)  # the CLI
    hold_state_dir(settings)  # the service's start
    lock = settings.state_dir / LOCK_FILE
    assert lock.read_text() == f"{os.getpid()}\n"
    release_state_dir(settings)
    assert not _can_lock(lock), "still held by the first holder"
    release_state_dir(settings)
    assert _can_lock(lock)


def test_a_lock_held_elsewhere_is_refused_with_what_to_do(tmp_path: Path) -> None:
    settings = load_settings().storage
    settings.state_dir.mkdir(parents=True)
    other = os.open(settings.state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)  # another open file: as another process
        os.write(other, b"4242\n")
        with pytest.raises(StateDirInUse) as caught:
            hold_state_dir(settings)
        assert "(pid 4242)" in caught.value.message
        assert "SANDBOX_MCP_STATE_DIR" in caught.value.message
    finally:
        os.close(other)


def test_postgresql_takes_no_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_MCP_DATABASE_URL", "postgresql+asyncpg://u:p@127.0.0.1:1/d")
    settings = load_settings().storage
    hold_state_dir(settings)
    assert not (settings.state_dir / LOCK_FILE).exists()
    release_state_dir(settings)


def _can_lock(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
