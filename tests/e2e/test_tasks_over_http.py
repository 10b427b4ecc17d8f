"""The MCP Tasks extension over HTTP, against the real server and real Docker.

A 2026-07-28 client that declares ``io.modelcontextprotocol/tasks`` gets a task for a
long call and polls it; ``tasks/cancel`` kills the command; another sandbox's task
id reads like one that never existed; a client that did not declare the extension
is served as before.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import post_rpc, read_jsonrpc, run_command, tool
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

TASKS = "io.modelcontextprotocol/tasks"
DECLARES_TASKS = {"extensions": {TASKS: {}}}
SYNC_WAIT_S = 1.5


def gated(name: str, then: str) -> str:
    """A command that runs until the test writes ``/tmp/<name>`` (``release``), then
    ``then``: running for as long as the test needs it to, on any machine, where a
    ``sleep N`` could end before a busy machine's next call arrives."""
    return f"until [ -e /tmp/{name} ]; do sleep 0.1; done; {then}"


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="20",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
        SANDBOX_MCP_REGISTRATIONS_PER_MINUTE="100",
        # A synchronous call gives up waiting after 1.5 s: a task must not.
        SANDBOX_MCP_SYNC_WAIT_S=str(SYNC_WAIT_S),
        SANDBOX_MCP_MAX_TASKS_PER_SANDBOX="2",
    )


async def rpc(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    method: str,
    params: dict[str, Any],
    *,
    declares: bool = True,
) -> dict[str, Any]:
    """One JSON-RPC request; the whole answer (``result`` or ``error``)."""
    name = params.get("name") if method == "tools/call" else params.get("taskId")
    response = await post_rpc(
        http,
        server.mcp_url,
        method,
        params,
        token=token,
        name=name,
        capabilities=DECLARES_TASKS if declares else {},
    )
    answer = read_jsonrpc(response)
    # The SDK sends some JSON-RPC errors (a missing capability) with HTTP 400.
    assert response.status_code == (200 if "result" in answer else 400) or "error" in answer
    return answer


async def call(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    name: str,
    arguments: dict[str, Any],
    *,
    declares: bool = True,
) -> dict[str, Any]:
    answer = await rpc(
        http, server, token, "tools/call", {"name": name, "arguments": arguments}, declares=declares
    )
    assert "result" in answer, answer
    return dict(answer["result"])


async def execute(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    experiment: str,
    command: str,
    *,
    declares: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """``execute_experiment`` of ``command``: a task handle or an ordinary result."""
    arguments = {"experiment_id": experiment, "command": command, **extra}
    return await call(http, server, token, "execute_experiment", arguments, declares=declares)


async def release(
    http: httpx2.AsyncClient, server: RunningServer, token: str, experiment: str, name: str
) -> None:
    """Let the ``gated`` commands waiting for ``name`` go on (the file is written even if
    a busy machine makes the call outlast SYNC_WAIT_S; the gated commands' ends say so)."""
    done = await execute(http, server, token, experiment, f"touch /tmp/{name}", declares=False)
    assert not done.get("isError"), done


async def ordinary_output(
    http: httpx2.AsyncClient, server: RunningServer, token: str, result: dict[str, Any]
) -> str:
    """The stdout of an ordinary (not task) command result: at once, or, when a busy
    machine made it outlast SYNC_WAIT_S, from its job."""
    assert "taskId" not in result
    assert result.get("resultType", "complete") == "complete"
    ran = result["structuredContent"]
    job = {"job_id": ran["job_id"], "wait_s": 30}
    for _ in range(4):  # each wait returns within 30 s
        if ran["status"] != "running":
            break
        ran = await tool(http, server, token, "get_job_result", job)
    assert ran["status"] == "completed", ran
    return str(ran["stdout"])


async def get_task(
    http: httpx2.AsyncClient, server: RunningServer, token: str, task_id: str
) -> dict[str, Any]:
    answer = await rpc(http, server, token, "tasks/get", {"taskId": task_id})
    assert "result" in answer, answer
    return dict(answer["result"])


async def poll(
    http: httpx2.AsyncClient, server: RunningServer, token: str, task_id: str, limit_s: float = 90
) -> tuple[dict[str, Any], list[str]]:
    """Poll until the task ends: its last state, and every status seen on the way."""
    seen: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        task = await get_task(http, server, token, task_id)
        seen.append(task["status"])
        if task["status"] in ("completed", "failed", "cancelled"):
            return task, seen
        await asyncio.sleep(0.5)
    raise AssertionError(f"task {task_id} still {seen[-1]} after {limit_s} s")


async def completed(
    http: httpx2.AsyncClient, server: RunningServer, token: str, task_id: str
) -> dict[str, Any]:
    """Poll until the task ends; asserts it completed and returns the tool's structured result."""
    task, _ = await poll(http, server, token, task_id)
    assert task["status"] == "completed", task
    return dict(task["result"]["structuredContent"])


def assert_task_handle(result: dict[str, Any]) -> str:
    assert result["resultType"] == "task", result
    assert result["status"] == "working"
    assert "content" not in result
    assert "structuredContent" not in result
    assert result["ttlMs"] is None  # a running task is never discarded
    assert result["pollIntervalMs"] > 0
    assert result["createdAt"].endswith("+00:00")
    assert result["lastUpdatedAt"]
    uuid.UUID(result["taskId"])  # unguessable: 122 random bits
    return str(result["taskId"])


async def test_the_server_advertises_the_tasks_extension(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    answer = await rpc(http, server, token, "server/discover", {})
    assert answer["result"]["capabilities"]["extensions"][TASKS] == {}, answer


async def test_a_command_becomes_a_task_that_runs_past_the_sync_wait(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    token, experiment = signed_in
    # The command waits for a file the test writes only once the handle is here: a
    # server that answered after the command would never answer (the generous
    # wait_for fails it), however fast or busy the machine, where a clock bound
    # against a 5 s command left a busy machine 1 s of margin.
    command = gated("go", "echo done")
    handle = await asyncio.wait_for(execute(http, server, token, experiment, command), 60)
    task_id = assert_task_handle(handle)
    await asyncio.sleep(2 * SYNC_WAIT_S)  # the command runs past SYNC_WAIT_S ...
    assert (await get_task(http, server, token, task_id))["status"] == "working"
    await release(http, server, token, experiment, "go")
    task, _ = await poll(http, server, token, task_id)  # ... and to its end
    assert task["status"] == "completed", task
    assert task["resultType"] == "complete"
    result = task["result"]
    # The whole command ran, past SYNC_WAIT_S: no "continues in the background" job id.
    assert result["isError"] is False
    assert result["structuredContent"]["status"] == "completed"
    assert result["structuredContent"]["stdout"] == "done\n"
    assert not any("still running" in note for note in result["structuredContent"]["notes"])
    assert "done" in result["content"][0]["text"]
    # Kept for a while once finished: ttlMs now counts from creation to the end of keeping.
    assert task["ttlMs"] >= 3_000 + 3600 * 1000
    again = await get_task(http, server, token, task_id)
    assert again["result"] == result


async def test_a_client_that_does_not_declare_tasks_is_served_as_before(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    token, experiment = signed_in
    quick = await execute(http, server, token, experiment, "echo plain", declares=False)
    assert await ordinary_output(http, server, token, quick) == "plain\n"
    slow = await execute(http, server, token, experiment, gated("later", "true"), declares=False)
    # Today's behaviour: past SYNC_WAIT_S the call returns its job id, still running.
    assert "taskId" not in slow
    assert slow["structuredContent"]["status"] == "running"
    await release(http, server, token, experiment, "later")
    refused = await rpc(
        http, server, token, "tasks/get", {"taskId": str(uuid.uuid4())}, declares=False
    )
    assert refused["error"]["code"] == -32021, refused
    assert TASKS in refused["error"]["data"]["requiredCapabilities"]["extensions"]


async def test_short_calls_and_background_commands_stay_ordinary_results(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    token, experiment = signed_in
    background = await execute(http, server, token, experiment, "sleep 1", background=True)
    assert background["resultType"] == "complete"
    assert background["structuredContent"]["job_id"].startswith("job_")
    listed = await call(http, server, token, "list_experiments", {})
    assert listed["resultType"] == "complete"
    assert "structuredContent" in listed


async def test_run_tests_becomes_a_task(http: httpx2.AsyncClient, server: RunningServer) -> None:
    token = await new_user(http, server.base_url)
    files = {
        "test_sum.py": "import time\n\ndef test_sum():\n    time.sleep(2)\n    assert 1 + 1 == 2\n"
    }
    created = await tool(http, server, token, "create_experiment", {"files": files})
    handle = await call(
        http, server, token, "run_tests", {"experiment_id": created["experiment_id"]}
    )
    job = await completed(http, server, token, assert_task_handle(handle))
    assert job["status"] == "completed", job
    assert job["tests"]["passed"] == 1, job["tests"]
    assert job["tests"]["failed"] == 0


async def test_create_with_setup_commands_is_a_task_and_without_is_not(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    plain = await call(http, server, token, "create_experiment", {"name": "plain"})
    assert plain["resultType"] == "complete"
    assert plain["structuredContent"]["experiment_id"].startswith("exp_")
    handle = await call(
        http,
        server,
        token,
        "create_experiment",
        {"name": "set up", "setup_commands": ["sleep 2", "echo ready > ready.txt"]},
    )
    created = await completed(http, server, token, assert_task_handle(handle))
    assert [job["status"] for job in created["setup"]] == ["completed", "completed"]
    read = await run_command(http, server, token, created["experiment_id"], "cat ready.txt")
    assert read["stdout"] == "ready\n"


async def test_a_tool_error_completes_the_task_with_is_error(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    handle = await execute(http, server, token, "exp_000000000000", "true")
    task, _ = await poll(http, server, token, assert_task_handle(handle))
    # The spec: a tool result with isError is "completed", never "failed".
    assert task["status"] == "completed", task
    assert task["result"]["isError"] is True
    assert task["result"]["structuredContent"]["error"]["code"] == "NOT_FOUND"


async def sleepers(
    http: httpx2.AsyncClient, server: RunningServer, token: str, experiment: str
) -> str:
    """The pids of the container's ``sleep 60`` (or ``sleep 600``), or "none"."""
    found = await run_command(http, server, token, experiment, "pgrep -f 'sleep 6[0]' || echo none")
    assert found["status"] == "completed", found
    return str(found["stdout"])


async def test_cancelling_a_task_kills_its_command(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    token, experiment = signed_in
    handle = await execute(http, server, token, experiment, "sleep 600; echo never")
    task_id = assert_task_handle(handle)
    # The command runs in the container (not a fixed pause a busy machine can outlast;
    # the [0] keeps pgrep off its own shell).
    deadline = time.monotonic() + 60
    while "none" in (await sleepers(http, server, token, experiment)):
        assert time.monotonic() < deadline, "the command never ran"
        await asyncio.sleep(0.2)
    started = time.monotonic()
    answer = await rpc(http, server, token, "tasks/cancel", {"taskId": task_id})
    assert answer["result"]["resultType"] == "complete", answer
    # Well under the command's 600 s (it did not run to its end), with room for a
    # busy machine's slow kill.
    assert time.monotonic() - started < 300
    task = await get_task(http, server, token, task_id)
    assert task["status"] == "cancelled", task
    assert "result" not in task
    # The job says cancelled, and no sleep is left in the container.
    jobs = (await tool(http, server, token, "get_experiment", {"experiment_id": experiment}))[
        "jobs"
    ]
    sleeper = next(job for job in jobs if job["command"] == "sleep 600; echo never")
    assert sleeper["status"] == "cancelled", sleeper
    # (The container's keep-alive is `sleep infinity`.) A killed process can still be
    # listed a moment after the answer on a busy machine: asked until it is gone.
    deadline = time.monotonic() + 60
    while (left := await sleepers(http, server, token, experiment)) != "none\n":
        assert time.monotonic() < deadline, f"still running: {left}"
        await asyncio.sleep(0.2)
    # Cancelling a finished task is acknowledged and changes nothing.
    again = await rpc(http, server, token, "tasks/cancel", {"taskId": task_id})
    assert again["result"]["resultType"] == "complete"
    assert (await get_task(http, server, token, task_id))["status"] == "cancelled"


async def setup_jobs(http: httpx2.AsyncClient, server: RunningServer, token: str) -> list[Any]:
    """The jobs of the sandbox's one experiment, none while it is not listed yet."""
    listed = (await tool(http, server, token, "list_experiments", {}))["experiments"]
    if not listed:
        return []
    (experiment,) = listed
    arguments = {"experiment_id": experiment["experiment_id"]}
    return list((await tool(http, server, token, "get_experiment", arguments))["jobs"])


async def test_cancelling_a_create_task_kills_its_setup_command(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    handle = await call(http, server, token, "create_experiment", {"setup_commands": ["sleep 60"]})
    task_id = assert_task_handle(handle)
    # Cancelled once the setup command runs (a fixed pause could end before a busy
    # machine has made the container).
    deadline = time.monotonic() + 60
    while not any(job["status"] == "running" for job in await setup_jobs(http, server, token)):
        assert time.monotonic() < deadline, "the setup command never ran"
        await asyncio.sleep(0.2)
    await rpc(http, server, token, "tasks/cancel", {"taskId": task_id})
    assert (await get_task(http, server, token, task_id))["status"] == "cancelled"
    (experiment,) = (await tool(http, server, token, "list_experiments", {}))["experiments"]
    jobs = (
        await tool(
            http, server, token, "get_experiment", {"experiment_id": experiment["experiment_id"]}
        )
    )["jobs"]
    assert [job["status"] for job in jobs] == ["cancelled"], jobs


async def test_another_sandbox_cannot_see_or_touch_a_task(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    owner, experiment = signed_in
    stranger = await new_user(http, server.base_url)
    handle = await execute(http, server, owner, experiment, gated("mine", "echo mine"))
    task_id = assert_task_handle(handle)
    never_existed = str(uuid.uuid4())
    for method, extra in (
        ("tasks/get", {}),
        ("tasks/update", {"inputResponses": {}}),
        ("tasks/cancel", {}),
    ):
        theirs = await rpc(http, server, stranger, method, {"taskId": task_id, **extra})
        unknown = await rpc(http, server, stranger, method, {"taskId": never_existed, **extra})
        assert "error" in theirs, (method, theirs)
        assert theirs["error"] == unknown["error"], method
        assert theirs["error"]["code"] == -32602
        assert "Task not found" in theirs["error"]["message"]
    # The stranger's cancel did nothing: the owner's command, running through all of it,
    # runs to its end.
    assert (await get_task(http, server, owner, task_id))["status"] == "working"
    await release(http, server, owner, experiment, "mine")
    assert (await completed(http, server, owner, task_id))["stdout"] == "mine\n"


async def test_tasks_update_is_acknowledged_for_a_task_that_asks_no_input(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    token, experiment = signed_in
    handle = await execute(http, server, token, experiment, "sleep 2; echo fine")
    task_id = assert_task_handle(handle)
    answer = await rpc(
        http,
        server,
        token,
        "tasks/update",
        {"taskId": task_id, "inputResponses": {"never-asked": {"action": "accept"}}},
    )
    # The spec: responses to keys not outstanding are ignored; the ack is empty.
    assert answer["result"]["resultType"] == "complete", answer
    assert set(answer["result"]) <= {"resultType", "_meta"}
    assert (await completed(http, server, token, task_id))["stdout"] == "fine\n"


async def test_a_sandbox_whose_tasks_all_run_is_served_without_a_task(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    token, experiment = signed_in
    # Both tasks run until the third call is answered, however long a busy machine takes.
    command = {"experiment_id": experiment, "command": gated("busy", "echo busy")}
    first = assert_task_handle(await call(http, server, token, "execute_experiment", command))
    second = assert_task_handle(await call(http, server, token, "execute_experiment", command))
    # MAX_TASKS_PER_SANDBOX=2, both running: the third call is an ordinary one.
    third = await call(http, server, token, "execute_experiment", command)
    assert third["resultType"] == "complete"
    assert third["structuredContent"]["job_id"].startswith("job_")
    await release(http, server, token, experiment, "busy")
    for task_id in (first, second):
        assert (await completed(http, server, token, task_id))["stdout"] == "busy\n"
    # Once they have finished, the oldest is forgotten to make room for a new task.
    fourth = assert_task_handle(await call(http, server, token, "execute_experiment", command))
    gone = await rpc(http, server, token, "tasks/get", {"taskId": first})
    assert gone["error"]["code"] == -32602
    assert (await get_task(http, server, token, second))["status"] == "completed"
    await rpc(http, server, token, "tasks/cancel", {"taskId": fourth})


async def test_the_handshake_era_has_no_tasks(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    # The result shapes are 2026-07-28 vocabulary: a 2025-11-25 wire cannot carry them.
    token = await new_user(http, server.base_url)
    response = await http.post(
        server.mcp_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "x"}},
        headers={
            "authorization": f"Bearer {token}",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2025-11-25",
        },
    )
    assert read_jsonrpc(response)["error"]["code"] == -32601
