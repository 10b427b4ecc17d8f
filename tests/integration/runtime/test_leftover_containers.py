"""The tests' cleanup of what stopped servers leave (``remove_containers_mounting``, used
by the ``serve`` fixtures' end and the session's sweep of its basetemp), on the real
engine: every container mounting below the folder goes, running or not, and a
neighbour's (another worker's ``popen-gw10`` beside ``popen-gw1``) stays."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from docker_testkit import BACKEND_PREFIX, remove_containers_mounting

pytestmark = pytest.mark.integration

IMAGE = "sandbox-mcp/base:bookworm"


def container_mounting(engine: docker.DockerClient, source: Path, *, start: bool) -> str:
    """A container bind-mounting ``source`` (labelled for the session's own cleanup)."""
    source.mkdir(parents=True)
    container_id = engine.api.create_container(
        IMAGE,
        ["sleep", "600"],
        labels={f"{BACKEND_PREFIX}.managed": "1"},
        host_config=engine.api.create_host_config(
            binds={str(source): {"bind": "/workspace", "mode": "ro"}}, network_mode="none"
        ),
    )["Id"]
    if start:
        engine.api.start(container_id)
    return str(container_id)


def exists(engine: docker.DockerClient, container_id: str) -> bool:
    return any(c["Id"] == container_id for c in engine.api.containers(all=True))


def test_every_container_mounting_below_the_folder_goes_and_a_neighbours_stays(
    tmp_path: Path, engine: docker.DockerClient
) -> None:
    mine = tmp_path / "popen-gw1"
    running = container_mounting(engine, mine / "state/slots/slot-000/exp-a/workspace", start=True)
    created = container_mounting(engine, mine / "state/slots/.warm-b/workspace", start=False)
    neighbour = container_mounting(engine, tmp_path / "popen-gw10/state/workspace", start=True)
    try:
        assert remove_containers_mounting(mine) == 2
        assert not exists(engine, running)
        assert not exists(engine, created)
        assert exists(engine, neighbour)
        assert remove_containers_mounting(mine) == 0
    finally:
        engine.api.remove_container(neighbour, force=True)
