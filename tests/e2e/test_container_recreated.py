"""A live experiment whose container disappears from the engine (removed behind the
server's back) gets a new one on its intact workspace, hardened as the first was."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import docker
import httpx2
import pytest
from docker_testkit import HOST_HARDENING, docker_client
from e2e_server import RunningServer, Servers
from mcp_http import run_command, tool

pytestmark = pytest.mark.e2e

HARDENING = HOST_HARDENING


@pytest.fixture
def server(serve: Servers) -> RunningServer:
    return serve(SANDBOX_MCP_PROCESS_STALE_S="3")


def containers_of(engine: docker.DockerClient, experiment_id: str) -> list[dict[str, Any]]:
    found = engine.api.containers(
        all=True, filters={"label": f"io.sandbox-mcp.experiment={experiment_id}"}
    )
    inspected = []
    for container in found:
        # Listed, then gone before its inspection (a removal the engine was finishing):
        # not a container of the experiment's any more.
        with contextlib.suppress(docker.errors.NotFound):
            inspected.append(dict(engine.api.inspect_container(container["Id"])))
    return inspected


async def test_a_removed_container_is_recreated_on_the_same_workspace(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    created = await tool(
        http,
        server,
        "",
        "create_experiment",
        {"name": "phoenix", "files": {"kept.txt": "intact\n"}, "pids": 100},
    )
    assert not created["is_error"], created
    exp = created["experiment_id"]
    engine = docker_client()
    try:
        [before] = await asyncio.to_thread(containers_of, engine, exp)
        await asyncio.to_thread(engine.api.remove_container, before["Id"], force=True)
        after = None
        for _ in range(120):  # recovery rounds every half second; two see it missing
            # Done when the record names the new container (its warning comes with it),
            # not merely when the engine runs one: the record is written just after.
            view = await tool(http, server, "", "get_experiment", {"experiment_id": exp})
            recorded = any("recreated" in warning for warning in view["warnings"])
            found = await asyncio.to_thread(containers_of, engine, exp)
            if recorded and len(found) == 1 and found[0]["State"]["Running"]:
                after = found[0]
                break
            await asyncio.sleep(0.25)
        assert after is not None, f"no single new running container: {found}"
    finally:
        engine.close()
    assert after["Id"] != before["Id"]
    for key in HARDENING:
        assert after["HostConfig"].get(key) == before["HostConfig"].get(key), key
    assert [m["Source"] for m in after["Mounts"]] == [m["Source"] for m in before["Mounts"]]
    assert after["Config"]["User"] == before["Config"]["User"]
    ran = await run_command(http, server, "", exp, "cat kept.txt")
    assert (ran.get("status"), ran.get("stdout")) == ("completed", "intact\n"), ran
    view = await tool(http, server, "", "get_experiment", {"experiment_id": exp})
    assert any("recreated" in warning for warning in view["warnings"]), view
    await tool(http, server, "", "destroy_experiment", {"experiment_id": exp})
