"""The Docker daemon stops and starts again under a running server (issue 14, faults
below the processes): live experiments come back on their intact workspaces, in the
same containers (so hardened exactly as before), a job that died with the engine is
reported lost with the reason, and nothing refused during the outage counts against
the live-experiment limit.

The daemon that stops is a real dockerd of the test's own (its own socket, data root
and containerd: tests/support/dockerd_control.py), never the machine's shared one:
other work on the machine keeps its engine and its containers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx2
import pytest
from docker_testkit import HOST_HARDENING
from dockerd_control import PrivateDockerd, private_dockerd
from e2e_server import RunningServer, Servers
from mcp_http import run_command, tool

pytestmark = pytest.mark.e2e

HARDENING = (*HOST_HARDENING, "Mounts")  # the same container: its very mounts too
IMAGE = "sandbox-mcp/python:3"


SHARED_PID_FILE = Path("/var/run/docker.pid")  # the machine's dockerd (services.sh)


def _shared_pid() -> str | None:
    return SHARED_PID_FILE.read_text().strip() if SHARED_PID_FILE.exists() else None


@pytest.fixture
def dockerd(tmp_path: Path) -> Iterator[PrivateDockerd]:
    work = tmp_path / "dockerd"
    work.mkdir()
    shared = _shared_pid()
    with private_dockerd(work, images=(IMAGE,)) as daemon:
        yield daemon
    assert _shared_pid() == shared, "the machine's shared dockerd was restarted"


@pytest.fixture
def server(serve: Servers, dockerd: PrivateDockerd) -> RunningServer:
    return serve(
        DOCKER_HOST=dockerd.host,
        SANDBOX_MCP_DEFAULT_IMAGE=IMAGE,
        SANDBOX_MCP_IMAGES=IMAGE,
        SANDBOX_MCP_MAX_EXPERIMENTS="2",
        SANDBOX_MCP_PROCESS_STALE_S="3",  # a recovery round every half second
        SANDBOX_MCP_SYNC_WAIT_S="5",
    )


def container_of(engine: docker.DockerClient, experiment_id: str) -> dict[str, Any]:
    [found] = engine.api.containers(
        all=True, filters={"label": f"io.sandbox-mcp.experiment={experiment_id}"}
    )
    return dict(engine.api.inspect_container(found["Id"]))


async def eventually(check: Any, timeout_s: float, what: str) -> Any:
    """Poll ``check`` (async, returns a truthy value when done) with growing pauses."""
    loop = asyncio.get_running_loop()
    deadline, pause = loop.time() + timeout_s, 0.1
    while True:
        found = await check()
        if found or loop.time() > deadline:
            assert found, what
            return found
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, 2.0)


async def test_live_experiments_survive_a_docker_daemon_restart(
    http: httpx2.AsyncClient, server: RunningServer, dockerd: PrivateDockerd
) -> None:
    created = await tool(
        http,
        server,
        "",
        "create_experiment",
        {"name": "survivor", "files": {"kept.txt": "intact\n"}},
    )
    assert not created["is_error"], created
    exp = created["experiment_id"]
    engine = dockerd.client()
    try:
        await outage_and_return(http, server, dockerd, engine, exp)
    finally:
        engine.close()  # its pooled sockets broke with the daemon


async def outage_and_return(
    http: httpx2.AsyncClient,
    server: RunningServer,
    dockerd: PrivateDockerd,
    engine: docker.DockerClient,
    exp: str,
) -> None:
    before = container_of(engine, exp)
    job = await run_command(http, server, "", exp, "sleep 600", background=True)

    async def started() -> bool:
        top = await asyncio.to_thread(engine.api.top, before["Id"], ps_args="-eo pid,args")
        return any(proc[-1] == "sleep 600" for proc in top["Processes"])

    await eventually(started, 120, "the job never started")

    with dockerd.outage():
        # The job died with its container: lost, with the reason, not "failed".
        async def settled() -> dict[str, Any] | None:
            status = await tool(http, server, "", "get_job_status", {"job_id": job["job_id"]})
            return status if status["status"] != "running" else None

        died = await eventually(settled, 60, "the job never left running")
        assert died["status"] == "lost", (died, server.log()[-4000:])
        assert "Docker engine" in died["reason"]
        # Creations are refused with a clear code; reads keep working.
        for attempt in range(2):
            refused = await tool(http, server, "", "create_experiment", {"name": "during"})
            assert refused["is_error"]
            assert refused["error"]["code"] == "RUNTIME_UNAVAILABLE", refused

            # Recovery retires the refused creation's record (the creation path itself
            # leaving none is another change): it stops counting within a round.
            async def retired(attempt: int = attempt) -> bool:
                listed = (await tool(http, server, "", "list_experiments"))["experiments"]
                during = [e for e in listed if e["name"] == "during"]
                return len(during) == attempt + 1 and all(e["state"] == "DESTROYED" for e in during)

            await eventually(retired, 30, "a refused creation still counts")
        seen = await tool(http, server, "", "get_experiment", {"experiment_id": exp})
        assert seen["state"] != "FAILED", seen

    # The engine is back: the same container runs again, hardened as it was created.
    async def running() -> dict[str, Any] | None:
        now = await asyncio.to_thread(container_of, engine, exp)
        return now if now["State"]["Running"] else None

    after = await eventually(running, 60, "the experiment's container was not started again")
    assert after["Id"] == before["Id"]
    for key in HARDENING:
        assert after["HostConfig"].get(key) == before["HostConfig"].get(key), key
    again = await run_command(http, server, "", exp, "cat kept.txt")
    assert (again["status"], again["stdout"]) == ("completed", "intact\n"), again
    assert (await tool(http, server, "", "get_experiment", {"experiment_id": exp}))[
        "state"
    ] == "COMPLETED"

    # The two refused creations do not count toward MAX_EXPERIMENTS=2.
    second = await tool(http, server, "", "create_experiment", {"name": "after"})
    assert not second["is_error"], second
    listed = (await tool(http, server, "", "list_experiments"))["experiments"]
    live = [e for e in listed if e["state"] != "DESTROYED"]
    assert {e["experiment_id"] for e in live} == {exp, second["experiment_id"]}
    for experiment_id in (exp, second["experiment_id"]):
        await tool(http, server, "", "destroy_experiment", {"experiment_id": experiment_id})
