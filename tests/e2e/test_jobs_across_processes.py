"""Two server processes on one PostgreSQL and one state dir: a job is the same job
whichever process is asked (issue 14, jobs and containers from any process)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx2
import pytest
from db_testkit import fresh_postgres_blocking
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import job_end, post_rpc, read_jsonrpc, run_command, tool

pytestmark = pytest.mark.e2e

# Distinct sleeps, so the engine's process list tells the job's processes apart.
TREE = "setsid sleep 7301 & nohup sleep 7302 >/dev/null 2>&1 & (sleep 7303 &); sleep 7304"
MARKERS = ("sleep 7301", "sleep 7302", "sleep 7303", "sleep 7304")


class Pair:
    """Two processes; ``restart(i)`` stops one and starts a new one in its place."""

    def __init__(self, state_dir: Path, database_url: str) -> None:
        self._state_dir = state_dir
        self._env = {
            "SANDBOX_MCP_DATABASE_URL": database_url,
            "SANDBOX_MCP_SYNC_WAIT_S": "5",
            "SANDBOX_MCP_PROCESS_STALE_S": "6",
        }
        # One after the other: the first migrates the schema.
        self.servers = [self._start(), self._start()]

    def _start(self) -> RunningServer:
        return start_server(self._state_dir, **self._env)

    def restart(self, index: int) -> None:
        stop_server(self.servers[index])
        self.servers[index] = self._start()

    def stop(self) -> None:
        for server in self.servers:
            stop_server(server)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """One pair for the module (starting two processes is most of its time)."""
    with fresh_postgres_blocking() as url:
        running = Pair(tmp_path_factory.mktemp("pair") / "state", url)
        try:
            yield running
        finally:
            running.stop()


def job_processes(engine: docker.DockerClient, experiment_id: str) -> list[str]:
    """The command lines of the job's processes still alive in the experiment's container,
    as the engine lists them."""
    [container] = engine.containers.list(
        filters={"label": f"io.sandbox-mcp.experiment={experiment_id}"}
    )
    top = container.top(ps_args="-eo pid,args")
    return [proc[-1] for proc in top["Processes"] if proc[-1] in MARKERS]


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 120) -> None:
    """Poll ``check`` until it holds or ``timeout_s`` passed (the caller asserts): the
    engine lists a tree's processes some time after its start, and its killed ones
    a moment after the cancel answered, longer on a busy machine."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await check() or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.1)


async def equals(value: Awaitable[Any], expected: Any) -> bool:
    return await value == expected


async def differs(value: Awaitable[Any], other: Any) -> bool:
    return await value != other


async def listed(engine: docker.DockerClient, exp: str) -> int:
    return len(await asyncio.to_thread(job_processes, engine, exp))


async def test_a_job_is_read_and_cancelled_through_another_process(
    http: httpx2.AsyncClient, pair: Pair, engine: docker.DockerClient
) -> None:
    created = await tool(http, pair.servers[0], "", "create_experiment", {"name": "two"})
    assert not created["is_error"], created
    exp = created["experiment_id"]
    job = await run_command(http, pair.servers[0], "", exp, TREE, background=True)
    job_id = job["job_id"]
    # The tree has started once all four sleeps are listed.
    await until(lambda: equals(listed(engine, exp), 4))
    assert await listed(engine, exp) == 4

    # Through the other process: status, and a bounded wait, both see it running.
    other = pair.servers[1]
    assert (await tool(http, other, "", "get_job_status", {"job_id": job_id}))["status"] == (
        "running"
    )
    waited = await tool(http, other, "", "get_job_result", {"job_id": job_id, "wait_s": 1})
    assert waited["status"] == "running"

    # Restarting the other process does not take the job of a live process for lost.
    await asyncio.to_thread(pair.restart, 1)
    other = pair.servers[1]
    for server in pair.servers:
        status = await tool(http, server, "", "get_job_status", {"job_id": job_id})
        assert status["status"] == "running", status
    assert len(await asyncio.to_thread(job_processes, engine, exp)) == 4

    # Cancelled through the process that did not start it: its whole tree dies.
    cancelled = await tool(http, other, "", "cancel_job", {"job_id": job_id})
    assert cancelled["status"] == "cancelled", cancelled
    await until(lambda: equals(listed(engine, exp), 0))
    assert await asyncio.to_thread(job_processes, engine, exp) == []
    seen = await tool(http, pair.servers[0], "", "get_job_result", {"job_id": job_id, "wait_s": 0})
    assert seen["status"] == "cancelled"

    # A job's output is read through the other process, waiting there for it to end.
    quick = await run_command(
        http, pair.servers[0], "", exp, "sleep 2; echo made-by-the-first", background=True
    )
    result = await job_end(http, other, "", quick["job_id"])
    assert (result["status"], result["stdout"]) == ("completed", "made-by-the-first\n")
    await tool(http, other, "", "destroy_experiment", {"experiment_id": exp})


DECLARES_TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


async def rpc(
    http: httpx2.AsyncClient, server: RunningServer, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    name = params.get("name") if method == "tools/call" else params.get("taskId")
    response = await post_rpc(
        http, server.mcp_url, method, params, name=name, capabilities=DECLARES_TASKS
    )
    answer = read_jsonrpc(response)
    assert "result" in answer, answer
    return dict(answer["result"])


async def task_state(http: httpx2.AsyncClient, server: RunningServer, task_id: str) -> str:
    return str((await rpc(http, server, "tasks/get", {"taskId": task_id}))["status"])


async def test_an_mcp_task_is_polled_and_cancelled_through_another_process(
    http: httpx2.AsyncClient, pair: Pair, engine: docker.DockerClient
) -> None:
    first, other = pair.servers
    exp = (await tool(http, first, "", "create_experiment", {"name": "tasks"}))["experiment_id"]

    def execute(command: str) -> dict[str, Any]:
        arguments = {"experiment_id": exp, "command": command}
        return {"name": "execute_experiment", "arguments": arguments}

    # Long enough to be seen working through the other process on a busy machine.
    started = await rpc(http, first, "tools/call", execute("sleep 10; echo via-task"))
    assert started["resultType"] == "task", started
    assert await task_state(http, other, started["taskId"]) == "working"
    await until(lambda: differs(task_state(http, other, started["taskId"]), "working"))
    done = await rpc(http, other, "tasks/get", {"taskId": started["taskId"]})
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"]["stdout"] == "via-task\n"

    long = await rpc(http, first, "tools/call", execute(TREE))
    await until(lambda: equals(listed(engine, exp), 4))
    assert await listed(engine, exp) == 4
    await rpc(http, other, "tasks/cancel", {"taskId": long["taskId"]})
    assert await task_state(http, other, long["taskId"]) == "cancelled"
    assert await task_state(http, first, long["taskId"]) == "cancelled"
    await until(lambda: equals(listed(engine, exp), 0))
    assert await asyncio.to_thread(job_processes, engine, exp) == []
    await tool(http, other, "", "destroy_experiment", {"experiment_id": exp})
