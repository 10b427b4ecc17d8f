"""A test's servers leave no container behind: the ``serve`` fixtures' end (``Servers.close``)
removes every container mounting their state dirs, which a stopped server keeps for a
restart to adopt. Without that, a CI run piled up a hundred running experiment
containers on a 2-core machine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import docker
import httpx2
import pytest
from e2e_server import Servers
from mcp_http import tool

pytestmark = pytest.mark.e2e


def mounting(engine: docker.DockerClient, folder: Path) -> list[str]:
    """Names of the containers, running or not, with a mount from below ``folder``."""
    return [
        container["Names"][0]
        for container in engine.api.containers(all=True)
        if any(
            (mount.get("Source") or "").startswith(f"{folder}/")
            for mount in container.get("Mounts") or []
        )
    ]


async def test_closing_the_servers_removes_the_containers_a_stopped_server_keeps(
    tmp_path: Path, http: httpx2.AsyncClient, engine: docker.DockerClient
) -> None:
    servers = Servers(tmp_path)
    try:
        server = servers()
        created = await tool(http, server, "", "create_experiment", {})
        assert not created["is_error"], created
        await asyncio.to_thread(servers.stop_all)
        # Stopped, the server kept its experiment's container (a restart would adopt it):
        # what the test's end has to remove.
        assert mounting(engine, tmp_path), "the stopped server kept no container"
    finally:
        await asyncio.to_thread(servers.close)
    assert mounting(engine, tmp_path) == []
