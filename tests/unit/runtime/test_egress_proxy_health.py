"""What ``/health`` says of network "restricted"'s proxy on a process that does not run
Squid itself (``serve --workers``): the truth about the Squid on the shared folder,
whichever process runs it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from egress_fakes import MemoryUsage

from app.runtime.egress_proxy import EgressConfig, EgressProxy
from app.runtime.egress_squid import SquidFolder


@pytest.fixture
def proxy(tmp_path: Path) -> EgressProxy:
    made = EgressProxy(
        EgressConfig(ceiling=("pypi.org",), max_bytes=10, deployment="d"), usage=MemoryUsage()
    )
    made._folder = SquidFolder(tmp_path)  # the folder another process runs Squid on
    return made


@pytest.fixture
def squid_like(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    # A process whose command line names the folder's squid.conf, as Squid's does.
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / "squid.conf")]
    )
    yield child
    child.kill()
    child.wait()


def test_another_process_s_running_squid_is_reported_ok(
    proxy: EgressProxy, squid_like: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    owner = {"process_id": "proc_a", "pid": 1, "squid_pid": squid_like.pid}
    SquidFolder.write_json(tmp_path / "owner.json", owner)
    assert proxy.health() == {"ok": True, "proxy": "squid", "run_by": "proc_a"}


def test_a_squid_gone_with_its_process_is_reported_until_another_takes_over(
    proxy: EgressProxy, squid_like: subprocess.Popen[bytes], tmp_path: Path
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
    proxy: EgressProxy, tmp_path: Path
) -> None:
    SquidFolder.write_json(tmp_path / "owner.json", {"process_id": "proc_a", "exit_code": 1})
    health = proxy.health()
    assert health["ok"] is False
    assert "the egress proxy (squid) exited with code 1" in health["reason"]
