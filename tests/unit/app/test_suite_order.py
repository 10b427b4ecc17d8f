"""The tests that restart a daemon the machine shares run last in the session
(tests/conftest.py): while such a daemon is down, every test using it would fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parents[2]


def test_a_shared_daemon_restart_is_collected_after_everything_else() -> None:
    # Alphabetically the restart comes first; the mark moves it to the end.
    files = [
        "e2e/test_zfs_fuse_restart.py",
        "e2e/test_zfs_remount_over_http.py",
        "unit/jail/test_fs_race.py",
    ]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    ids = [line for line in collected.splitlines() if "::" in line]
    restart = f"tests/{files[0]}::test_live_experiments_come_back_after_a_zfs_fuse_restart"
    assert ids[-1] == restart, ids
    assert len(ids) > 1, ids
