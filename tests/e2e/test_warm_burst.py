"""A burst of signed-in first calls on the real server and engine: the warm pool grows on
the sign-ins (within its budget), every first call succeeds, and once the signals fade
the pool shrinks back to its floor.

Driven by what the engine shows, polled with generous bounds: the pool's signals fade
on their own clocks (a sign-in counts until its first call, the rate of creates for
WARM_RATE_WINDOW_S), never asserted as a duration.
"""

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

PREFIX = f"io.sandbox-mcp-warm-burst-{uuid.uuid4().hex[:8]}"
SHARED_PREFIX = f"{PREFIX}-shared"  # the second server's, apart from the first's
USERS = 20
FLOOR = 1
BUDGET = 6
# The rate of creates counted over 10 s instead of the default minute (pinned by the docs
# test and tests/unit/runtime/warm/test_demand.py): the same fade, without 50 s of waiting
# for the burst's creates to age out.
RATE_WINDOW_S = 10


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> Iterator[RunningServer]:
    running = serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE=str(USERS + BUDGET),
        SANDBOX_MCP_WARM_CONTAINERS=str(FLOOR),
        SANDBOX_MCP_WARM_MAX_CONTAINERS=str(BUDGET),
        SANDBOX_MCP_WARM_RATE_WINDOW_S=str(RATE_WINDOW_S),
        SANDBOX_MCP_LABEL_PREFIX=PREFIX,
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="1000",
        SANDBOX_MCP_REGISTRATIONS_PER_MINUTE="1000",
    )
    yield running
    serve_module.stop(running)  # before its containers are removed
    with contextlib.closing(docker.from_env()) as engine:
        remove_labelled_containers(engine, f"{PREFIX}.managed")


def waiting_warm(engine: docker.DockerClient, prefix: str) -> int:
    """Warm containers not handed over yet (a handed-over one is renamed)."""
    found = engine.api.containers(all=True, filters={"label": f"{prefix}.managed"})
    return sum(
        1
        for c in found
        if c["Labels"][f"{prefix}.sandbox"].startswith("warm-")
        and not c["Names"][0].lstrip("/").startswith("smcp-handed-")
    )


class Watch:
    """Counts the waiting warm containers every 0.2 s, keeping the most ever seen."""

    def __init__(self, engine: docker.DockerClient, prefix: str = PREFIX) -> None:
        self.engine = engine
        self.prefix = prefix
        self.now = 0
        self.most = 0
        self.stopped = False

    async def run(self) -> None:
        # Stopped by a flag, not cancelled: a cancelled to_thread leaves its engine call
        # running after the test closed the client (a socket the collector finds later).
        while not self.stopped:
            self.now = await asyncio.to_thread(waiting_warm, self.engine, self.prefix)
            self.most = max(self.most, self.now)
            await asyncio.sleep(0.2)

    async def until(self, done: object, bound_s: float, what: str) -> None:
        deadline = time.monotonic() + bound_s
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"{what} within {bound_s} s: {self.now} now"
            await asyncio.sleep(0.2)


async def first_output(http: httpx2.AsyncClient, server: RunningServer, token: str) -> str:
    made = await tool(
        http, server, token, "create_experiment", {"files": {"main.py": "print('hi')\n"}}
    )
    assert not made["is_error"], made
    ran = await run_command(http, server, token, made["experiment_id"], "python3 main.py")
    return str(ran["stdout"])


@pytest.mark.timeout(900)  # its bounds are generous: the pool's signals fade on their own
async def test_a_burst_of_first_calls_meets_a_pool_grown_within_its_budget(
    http: httpx2.AsyncClient, server: RunningServer, engine: docker.DockerClient
) -> None:
    watch = Watch(engine)
    watching = asyncio.create_task(watch.run())
    try:
        await watch.until(lambda: watch.now == FLOOR, 120, "the floor started")
        client = await ManualClient.register(http, server.base_url)
        tokens = [await client.access_token(http) for _ in range(USERS)]
        # Twenty sign-ins whose first call has not come: the pool grows to its budget.
        await watch.until(lambda: watch.now == BUDGET, 180, "grown to the budget")
        outputs = await asyncio.gather(*(first_output(http, server, t) for t in tokens))
        assert outputs == ["hi\n"] * USERS
        # Every sign-in is served and the creates' rate fades within its window: back to
        # the floor, with the last free slots' containers removed.
        await watch.until(lambda: watch.now == FLOOR, 300, "shrunk to the floor")
        assert watch.most <= BUDGET
    finally:
        watch.stopped = True
        await watching


@pytest.fixture
def shared_server(serve: Servers) -> Iterator[RunningServer]:
    """The default shares: one address prefix may spend 5% of every budget."""
    running = serve(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE=str(USERS + BUDGET),
        SANDBOX_MCP_WARM_CONTAINERS=str(FLOOR),
        SANDBOX_MCP_WARM_MAX_CONTAINERS="40",  # 5% of it: 2 sign-ins of one address count
        SANDBOX_MCP_LABEL_PREFIX=SHARED_PREFIX,
        SANDBOX_MCP_ADDRESS_SHARE_PERCENT="5",
        SANDBOX_MCP_NETWORK_SHARE_PERCENT="10",
        SANDBOX_MCP_NEW_SANDBOXES_PER_HOUR="100000",
        SANDBOX_MCP_SANDBOXES_PER_ADDRESS="1000",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="1000",
        SANDBOX_MCP_REGISTRATIONS_PER_MINUTE="1000",
    )
    yield running
    serve.stop(running)  # before its containers are removed
    with contextlib.closing(docker.from_env()) as engine:
        remove_labelled_containers(engine, f"{SHARED_PREFIX}.managed")


async def test_one_address_signing_in_many_times_grows_the_pool_by_its_share_only(
    http: httpx2.AsyncClient, shared_server: RunningServer, engine: docker.DockerClient
) -> None:
    watch = Watch(engine, SHARED_PREFIX)
    watching = asyncio.create_task(watch.run())
    try:
        await watch.until(lambda: watch.now == FLOOR, 120, "the floor started")
        client = await ManualClient.register(http, shared_server.base_url)
        for _ in range(USERS):  # every one from 127.0.0.1
            await client.access_token(http)
        await watch.until(lambda: watch.now == FLOOR + 2, 180, "grown by the address's share")
        # Its twenty sign-ins wait for their first calls (120 s): the pool stays there.
        for _ in range(50):
            await asyncio.sleep(0.2)
        assert watch.most == FLOOR + 2
    finally:
        watch.stopped = True
        await watching
