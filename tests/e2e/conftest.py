from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import docker
import httpx2
import pytest
from e2e_server import RunningServer, Servers
from egress_testkit import OutsideWorld, outside_world
from mcp_http import tool
from oauth_browser import new_user


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    """An HTTP client with a timeout long enough for a queued or synchronous tool call."""
    async with httpx2.AsyncClient(timeout=120) as client:
        yield client


@pytest.fixture
def server(serve: Servers) -> RunningServer:
    return serve()


@pytest.fixture
async def signed_in(http: httpx2.AsyncClient, server: RunningServer) -> tuple[str, str]:
    """A new user of the module's ``server`` and an empty experiment of theirs."""
    token = await new_user(http, server.base_url)
    experiment = (await tool(http, server, token, "create_experiment", {}))["experiment_id"]
    return token, experiment


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OutsideWorld]:
    """The restricted-egress tests' outside world (a registry with a public-looking
    address in a network namespace: tests/support/egress_testkit.py), one a module."""
    if os.geteuid() != 0:
        pytest.fail("network 'restricted' and these tests need root (iptables, ip netns)")
    with outside_world(tmp_path_factory.mktemp("outside")) as made:
        yield made


@pytest.fixture
def engine() -> Iterator[docker.DockerClient]:
    """The real Docker engine, its client closed after the test: an unclosed client's
    sockets are collected later, as a ResourceWarning in whatever test runs then."""
    client = docker.from_env()
    try:
        yield client
    finally:
        client.close()
