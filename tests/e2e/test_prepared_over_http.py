"""A sandbox's prepared container over HTTP, on the real engine: after each create, one
container is made in the background for the sandbox's next create, which runs in it
(checked by the container's identity: a file a command leaves in it, and its name once
handed over), and nothing is left of it when the lease ends (idle expiry) or the
server stops."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import httpx2
import pytest
from docker_testkit import remove_labelled_containers
from e2e_server import RunningServer, Servers
from mcp_http import run_command, tool
from oauth_browser import ManualClient

pytestmark = pytest.mark.e2e

PREFIX = f"io.sandbox-mcp-prepared-e2e-{uuid.uuid4().hex[:8]}"
IDLE_PREFIX = f"{PREFIX}-idle"
SETTINGS = {
    "SANDBOX_MCP_AUTH": "oauth",
    "SANDBOX_MCP_POOL_SIZE": "3",
    "SANDBOX_MCP_MAX_CONTAINERS": "16",  # Alice's four experiments leave Bob room for his
    # No warm pool of their own, but a budget prepared containers may use.
    "SANDBOX_MCP_WARM_CONTAINERS": "0",
    "SANDBOX_MCP_WARM_MAX_CONTAINERS": "4",
    "SANDBOX_MCP_QUEUE_WAIT_S": "0",
    "SANDBOX_MCP_SIGNINS_PER_MINUTE": "100",
}


def remove_all(prefix: str) -> None:
    """A stopped server leaves its experiments' containers: the test removes its own."""
    with contextlib.closing(docker.from_env()) as engine:
        remove_labelled_containers(engine, f"{prefix}.managed")


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> Iterator[RunningServer]:
    running = serve_module(SANDBOX_MCP_LABEL_PREFIX=PREFIX, **SETTINGS)
    yield running
    serve_module.stop(running)
    remove_all(PREFIX)


def prepared(engine: docker.DockerClient, prefix: str) -> list[dict[str, Any]]:
    """The prepared containers not handed over yet."""
    found = engine.api.containers(all=True, filters={"label": f"{prefix}.prepared=1"})
    return [c for c in found if c["Names"][0].lstrip("/").startswith("smcp-prepared-")]


def of_sandbox(engine: docker.DockerClient, prefix: str, label: str) -> list[str]:
    """Every container of the sandbox ``label``: by its label, or (a handed-over warm
    one, labelled for its slot) by the name it took."""
    found = engine.api.containers(all=True, filters={"label": f"{prefix}.managed"})
    return [
        c["Id"]
        for c in found
        if c["Labels"].get(f"{prefix}.sandbox") == label
        or c["Names"][0].lstrip("/").startswith(f"smcp-handed-{label}-")
    ]


async def wait_for_prepared(
    engine: docker.DockerClient, prefix: str, besides: set[str]
) -> dict[str, Any]:
    """A prepared container not in ``besides``, once the server has made one (a
    background creation: it waits while real ones run, so the bound is generous)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        fresh = [
            c for c in await asyncio.to_thread(prepared, engine, prefix) if c["Id"] not in besides
        ]
        if fresh:
            return fresh[0]
        await asyncio.sleep(0.2)
    raise AssertionError("no prepared container was made within 120 s")


def has_file(engine: docker.DockerClient, container_id: str, path: str) -> bool:
    run = engine.api.exec_create(container_id, ["test", "-e", path])
    engine.api.exec_start(run["Id"])
    return engine.api.exec_inspect(run["Id"])["ExitCode"] == 0


def name_of(engine: docker.DockerClient, container_id: str) -> str:
    return str(engine.api.inspect_container(container_id)["Name"]).lstrip("/")


async def create(
    http: httpx2.AsyncClient, server: RunningServer, token: str, **arguments: object
) -> str:
    made = await tool(http, server, token, "create_experiment", arguments)
    assert not made["is_error"], made
    return str(made["experiment_id"])


async def test_each_next_create_runs_in_the_container_prepared_for_it(
    http: httpx2.AsyncClient, server: RunningServer, engine: docker.DockerClient
) -> None:
    client = await ManualClient.register(http, server.base_url)
    alice = await client.access_token(http)
    await create(http, server, alice, files={"a.py": "print(1)\n"})
    seen: set[str] = set()
    for n in (2, 3, 4):  # the seed's baseline plus fixes: each next create
        ready = await wait_for_prepared(engine, PREFIX, seen)
        seen.add(ready["Id"])
        experiment = await create(http, server, alice, files={"a.py": f"print({n})\n"})
        ran = await run_command(http, server, alice, experiment, f"touch /tmp/run{n}; python3 a.py")
        assert (ran["exit_code"], ran["stdout"]) == (0, f"{n}\n")  # its own files
        assert has_file(engine, ready["Id"], f"/tmp/run{n}")  # it ran in the prepared one
        assert name_of(engine, ready["Id"]).startswith("smcp-handed-")  # and counts as hers
    # One per sandbox: after the fourth create, exactly one waits for Alice's fifth.
    await wait_for_prepared(engine, PREFIX, seen)
    await asyncio.sleep(1)
    label = ready["Labels"][f"{PREFIX}.sandbox"]
    mine = [c for c in prepared(engine, PREFIX) if c["Labels"][f"{PREFIX}.sandbox"] == label]
    assert len(mine) == 1


async def test_a_request_it_cannot_serve_removes_it_and_starts_cold(
    http: httpx2.AsyncClient, server: RunningServer, engine: docker.DockerClient
) -> None:
    client = await ManualClient.register(http, server.base_url)
    bob = await client.access_token(http)
    others = {c["Id"] for c in prepared(engine, PREFIX)}  # the module's other sandboxes'
    await create(http, server, bob)
    ready = await wait_for_prepared(engine, PREFIX, others)
    label = ready["Labels"][f"{PREFIX}.sandbox"]
    # An environment is fixed at creation: the prepared one cannot serve it.
    experiment = await create(http, server, bob, env=["GREETING=hi"])
    ran = await run_command(http, server, bob, experiment, "echo $GREETING")
    assert ran["stdout"] == "hi\n"
    assert ready["Id"] not in {c["Id"] for c in engine.api.containers(all=True)}  # removed
    # Nor is a container with the tenant's environment made ahead; the next plain
    # create goes cold, and the one after it gets the container prepared then.
    await asyncio.sleep(2)
    assert [c for c in prepared(engine, PREFIX) if c["Labels"][f"{PREFIX}.sandbox"] == label] == []
    await create(http, server, bob)
    fresh = await wait_for_prepared(engine, PREFIX, others | {ready["Id"]})
    assert fresh["Labels"][f"{PREFIX}.sandbox"] == label
    experiment = await create(http, server, bob)
    ran = await run_command(http, server, bob, experiment, "touch /tmp/warm")
    assert has_file(engine, fresh["Id"], "/tmp/warm")


async def test_nothing_of_a_sandbox_is_left_after_its_lease_ends_or_the_server_stops(
    http: httpx2.AsyncClient, serve: Servers, engine: docker.DockerClient
) -> None:
    running = serve(
        SANDBOX_MCP_LABEL_PREFIX=IDLE_PREFIX, SANDBOX_MCP_IDLE_TIMEOUT_S="10", **SETTINGS
    )
    stopped = False
    try:
        client = await ManualClient.register(http, running.base_url)
        carol, dave = await client.access_token(http), await client.access_token(http)
        await create(http, running, carol)
        carols = await wait_for_prepared(engine, IDLE_PREFIX, set())
        label = carols["Labels"][f"{IDLE_PREFIX}.sandbox"]
        assert of_sandbox(engine, IDLE_PREFIX, label)
        # Carol goes idle: her slot is emptied, her experiment's container and her
        # prepared one go with it.
        deadline = time.monotonic() + 120
        while of_sandbox(engine, IDLE_PREFIX, label):
            assert time.monotonic() < deadline, "Carol's containers are still there after 120 s"
            await asyncio.sleep(0.5)
        # Dave's prepared container waits when the server stops: the stop removes it.
        await create(http, running, dave)
        daves = await wait_for_prepared(engine, IDLE_PREFIX, {carols["Id"]})
        serve.stop(running)
        stopped = True
        assert prepared(engine, IDLE_PREFIX) == []
        assert daves["Id"] not in {c["Id"] for c in engine.api.containers(all=True)}
    finally:
        if not stopped:
            serve.stop(running)
        remove_all(IDLE_PREFIX)
