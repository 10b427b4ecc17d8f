"""The Docker probe when no engine answers: one plain sentence naming the socket, and
no socket left open for a later garbage collection to warn about."""

from __future__ import annotations

import gc
import socket
import warnings
from pathlib import Path

import pytest

from app.runtime.docker.probe import DockerProbe


async def probe_once() -> str | None:
    probe = DockerProbe()
    try:
        status = await probe()
    finally:
        probe.close()
    assert status.reachable is False
    return status.reason


@pytest.mark.parametrize(
    ("make", "why"),
    [(None, "no socket is there"), ("bound", "nothing listens there")],
)
async def test_no_engine_leaves_no_socket_open_and_says_where_it_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: str | None, why: str
) -> None:
    """docker-py drops the socket of a failed connect open; collected later, it warned
    in whatever test ran then (test_cli's test_unreachable_database, with no daemon)."""
    path = tmp_path / "docker.sock"
    listener = socket.socket(socket.AF_UNIX)
    if make == "bound":
        listener.bind(str(path))  # a socket file nobody listens on: a daemon gone
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reason = await probe_once()
            gc.collect()
    finally:
        listener.close()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert reason == f"Docker does not answer at unix://{path} (DOCKER_HOST): {why}."
