"""What ``/health`` says of network "restricted"'s proxy on a process that does not run
Squid itself (``serve --workers``): the truth about the Squid on the shared folder,
whichever process runs it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.egress.owner import SquidOwner
from app.egress.squid import SquidFolder
from pool.watchdog import SoleWatchdog


@pytest.fixture
def proxy(tmp_path: Path) -> SquidOwner:
    """This process's side, Squid not run here; ``tmp_path`` is the folder another
    process runs Squid on."""
    return SquidOwner(SquidFolder(tmp_path), SoleWatchdog(), "proc_b")


@pytest.fixture
def squid_like(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    # A process whose command line names the folder's squid.conf, as Squid's does.
    conf = str(tmp_path / "squid.conf")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", conf])
    # Popen can return before the child's exec: wait until its command line is the new one.
    cmdline = Path(f"/proc/{child.pid}/cmdline")
    deadline = time.monotonic() + 10
    while conf.encode() not in cmdline.read_bytes().split(b"\0"):
        assert time.monotonic() < deadline, "the child never ran"
        time.sleep(0.01)
    yield child
    child.kill()
    child.wait()


def test_another_process_s_running_squid_is_reported_ok(
    proxy: SquidOwner, squid_like: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    owner = {"process_id": "proc_a", "pid": 1, "squid_pid": squid_like.pid}
    SquidFolder.write_json(tmp_path / "owner.json", owner)
    assert proxy.health() == {"ok": True, "proxy": "squid", "run_by": "proc_a"}


def test_a_squid_gone_with_its_process_is_reported_until_another_takes_over(
    proxy: SquidOwner, squid_like: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    SquidFolder.write_json(
        tmp_path / "owner.json", {"process_id": "p", "squid_pid": squid_like.pid}
    )
    squid_like.kill()
    squid_like.wait()
    health = proxy.health()
    assert health["ok"] is False
    assert "no server process runs the egress proxy (squid) at the moment" in health["reason"]
    assert "another takes it over" in health["reason"]


def test_a_squid_that_died_in_its_living_process_is_reported_with_its_code(
    proxy: SquidOwner, tmp_path: Path
) -> None:
    SquidFolder.write_json(tmp_path / "owner.json", {"process_id": "proc_a", "exit_code": 1})
    health = proxy.health()
    assert health["ok"] is False
    assert "the egress proxy (squid) exited with code 1" in health["reason"]
