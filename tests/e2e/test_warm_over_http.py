"""Warm sandboxes over HTTP: a new sandbox's first experiment runs in the container
that waited in its slot; another sandbox gets another one; none is ever reused."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator

import docker
import httpx2
import pytest
from docker_testkit import remove_labelled_containers
from e2e_server import RunningServer, Servers
from mcp_http import run_command, tool
from oauth_browser import ManualClient

pytestmark = pytest.mark.e2e

PREFIX = f"io.sandbox-mcp-warm-e2e-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> Iterator[RunningServer]:
    running = serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="3",
        SANDBOX_MCP_WARM_CONTAINERS="1",
        SANDBOX_MCP_LABEL_PREFIX=PREFIX,
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
    )
    yield running
    serve_module.stop(running)
    with contextlib.closing(docker.from_env()) as engine:
        remove_labelled_containers(engine, f"{PREFIX}.managed")


def warm_ids(engine: docker.DockerClient) -> set[str]:
    found = engine.api.containers(filters={"label": f"{PREFIX}.managed"})
    return {c["Id"] for c in found if c["Labels"][f"{PREFIX}.sandbox"].startswith("warm-")}


def wait_for_warm(engine: docker.DockerClient, besides: set[str]) -> str:
    """The id of a warm container not in ``besides``, once the server has started one."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fresh = warm_ids(engine) - besides
        if fresh:
            return fresh.pop()
        time.sleep(0.2)
    raise AssertionError("no warm container was started within 60 s")


def has_file(engine: docker.DockerClient, container_id: str, path: str) -> bool:
    if container_id not in {c["Id"] for c in engine.api.containers()}:
        return False
    run = engine.api.exec_create(container_id, ["test", "-e", path])
    engine.api.exec_start(run["Id"])
    return engine.api.exec_inspect(run["Id"])["ExitCode"] == 0


async def test_each_new_sandbox_gets_its_own_warm_container_never_reused(
    http: httpx2.AsyncClient, server: RunningServer, engine: docker.DockerClient
) -> None:
    client = await ManualClient.register(http, server.base_url)
    alice = await client.access_token(http)
    bob = await client.access_token(http)
    first = wait_for_warm(engine, set())
    made = await tool(http, server, alice, "create_experiment", {"files": {"a.py": "print(1)\n"}})
    assert not made["is_error"], made
    ran = await run_command(
        http, server, alice, made["experiment_id"], "touch /tmp/alice; cat a.py"
    )
    assert (ran["exit_code"], ran["stdout"]) == (0, "print(1)\n")
    assert has_file(engine, first, "/tmp/alice")  # Alice's experiment runs in the warm one
    second = wait_for_warm(engine, {first})  # a replacement, in the next free slot
    theirs = await tool(http, server, bob, "create_experiment", {"files": {"b.py": "2\n"}})
    assert not theirs["is_error"], theirs
    ran = await run_command(http, server, bob, theirs["experiment_id"], "touch /tmp/bob; ls")
    assert ran["stdout"] == "b.py\n"  # Bob's own workspace, not Alice's
    assert has_file(engine, second, "/tmp/bob")
    assert not has_file(engine, first, "/tmp/bob")
    destroyed = await tool(
        http, server, alice, "destroy_experiment", {"experiment_id": made["experiment_id"]}
    )
    assert destroyed["state"] == "DESTROYED"
    # Not reused: removed, just after the answer (app/experiments/removals.py).
    deadline = time.monotonic() + 60  # a bound against a hang, not the verdict
    while first in {c["Id"] for c in engine.api.containers(all=True)}:
        assert time.monotonic() < deadline, "the destroyed experiment's container stayed"
        await asyncio.sleep(0.1)
    again = await tool(http, server, alice, "create_experiment", {"files": {"c.py": "3\n"}})
    assert not again["is_error"], again
    ran = await run_command(http, server, alice, again["experiment_id"], "touch /tmp/again; ls")
    assert ran["stdout"] == "c.py\n"
    assert not has_file(engine, second, "/tmp/again")
