"""`sandbox-mcp check` against the real Docker engine that .ci/run starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_check_is_ok_when_docker_and_the_database_answer() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "check"], capture_output=True, text=True, timeout=60
    )
    report = json.loads(done.stdout)
    assert report["runtime"]["reachable"] is True, (
        f"Docker must be running for integration tests: {report['runtime']}"
    )
    assert report["runtime"]["version"]
    assert report["database"] == {"ok": True}
    assert report["ok"] is True
    assert done.returncode == 0
