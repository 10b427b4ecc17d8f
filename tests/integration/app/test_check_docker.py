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


async def test_the_probe_keeps_one_client_and_says_when_docker_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.runtime.probe import DockerProbe

    probe = DockerProbe()
    try:
        first = await probe()
        client = probe._client
        second = await probe()
        assert first.reachable and second.reachable, (first, second)
        assert probe._client is client is not None  # /health does not connect anew each time
    finally:
        probe.close()
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    gone = DockerProbe()
    status = await gone()
    assert not status.reachable
    assert status.reason
    assert gone._client is None  # dropped, so a restarted daemon is found again
