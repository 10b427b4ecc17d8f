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


async def test_the_probe_keeps_one_client_and_drops_it_when_docker_fails() -> None:
    from docker.errors import DockerException

    from app.runtime.docker.probe import DockerProbe

    probe = DockerProbe()
    try:
        first = await probe()
        client = probe._client
        second = await probe()
        assert first.reachable, first
        assert second.reachable, second
        assert probe._client is client is not None  # /health does not connect anew each time

        def broken() -> dict[str, str]:
            raise DockerException("the engine went away")

        client.version = broken  # type: ignore[method-assign, union-attr]
        status = await probe()
        assert not status.reachable
        # One plain sentence naming the socket tried, then what the engine said.
        assert status.reason is not None
        assert status.reason.startswith("Docker does not answer at "), status.reason
        assert status.reason.endswith(": the engine went away."), status.reason
        assert probe._client is None  # so a restarted engine is found again
    finally:
        probe.close()
