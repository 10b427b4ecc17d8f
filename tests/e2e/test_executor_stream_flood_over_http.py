"""Over HTTP: a tenant flooding its container's executor's stdout or stderr cannot
hold the server's event loop, its session is closed at once, and the tenant is told
why.

Issue 23, finding 1: a command runs as the executor's uid, opens
``/proc/<executor>/fd/1`` and writes ``{"id":987654321}`` lines in a loop (here also:
one line that never ends, and a flood of ``fd/2``). The server JSON-parsed every
line on the event loop, ignored the unknown id and kept the session; and while the
stream stayed full ``loop.sock_recv`` returned without suspending, so nothing else
in the process ran: /health took as long as the flood. Here, while the flood runs,
/health and another tenant's ``list_sandbox_files`` are timed one after the other;
then the hostile job must be lost with the stable reason, and the tenant's next
command must run (through docker exec: no executor above it).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import run_command, tool
from oauth_browser import new_users
from thread_flood import SERVER_ENV, honest_workspace, percentiles

from app.runtime.exec.protocol import OVERSIZED, STDERR_FLOOD, UNASKED

pytestmark = pytest.mark.e2e

FLOOD_S = 8.0
HEALTH_BOUND_S = 2.0  # generous: /health answers in milliseconds on an idle loop
HONEST_BOUND_S = 5.0
# ``where``: which path runs this command (an ancestor named smcp-executor: the fast
# path). Otherwise flood the executor above it for the given seconds.
FLOOD = r"""
import os, sys, time
pid, executor = os.getpid(), None
while pid > 1 and executor is None:
    with open(f"/proc/{pid}/comm") as comm, open(f"/proc/{pid}/stat") as stat:
        if comm.read().strip() == "smcp-executor":
            executor = pid
        pid = int(stat.read().rsplit(")", 1)[1].split()[1])
mode = sys.argv[1]
if mode == "where" or executor is None:
    print("fast" if executor else "docker-exec")
    sys.exit(0 if mode == "where" else 3)
data = b'{"id":987654321}\n' * 4096 if mode == "unknown-id" else b"x" * 65536
fd = os.open(f"/proc/{executor}/fd/{2 if mode == 'stderr' else 1}", os.O_WRONLY)
until = time.monotonic() + float(sys.argv[2])
while time.monotonic() < until:
    os.write(fd, data)
"""
WHY = {"unknown-id": UNASKED, "oversized-line": OVERSIZED, "stderr": STDERR_FLOOD}


@pytest.mark.parametrize("mode", list(WHY))
async def test_a_flood_on_the_executors_stream_holds_no_loop_and_closes_its_session(
    tmp_path: Path, mode: str
) -> None:
    server = start_server(tmp_path / "state", **SERVER_ENV)
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            mallory, alice = await new_users(http, server.base_url, 2)
            created = await tool(
                http, server, mallory, "create_experiment", {"files": {"flood.py": FLOOD}}
            )
            assert not created["is_error"], created
            hostile = str(created["experiment_id"])
            honest = await honest_workspace(http, server, alice)
            await until_fast(http, server, mallory, hostile)

            job = await run_command(
                http,
                server,
                mallory,
                hostile,
                f"python3 flood.py {mode} {FLOOD_S}",
                background=True,
            )
            assert not job["is_error"], job
            health, calls = await timed_meanwhile(http, server, alice, honest)

            print(f"\n{mode}: /health during the flood: {percentiles(health)}")
            print(f"{mode}: alice's list_sandbox_files: {percentiles(calls)}")
            assert max(health) < HEALTH_BOUND_S, f"/health took {max(health):.1f} s"
            assert max(calls) < HONEST_BOUND_S, f"alice's call took {max(calls):.1f} s"

            ended = await tool(
                http,
                server,
                mallory,
                "get_job_result",
                {"job_id": job["job_id"], "wait_s": 45},
            )
            assert ended.get("status") == "lost", ended
            assert f"executor stopped under the command: {WHY[mode]}" in ended["reason"], ended
            assert f"protocol broken: {WHY[mode]}" in server.log()
            after = await run_command(http, server, mallory, hostile, "python3 flood.py where")
            assert (after["status"], after["stdout"]) == ("completed", "docker-exec\n"), after
    finally:
        stop_server(server)


async def until_fast(http: httpx2.AsyncClient, server: RunningServer, token: str, exp: str) -> None:
    """Until the experiment's commands run through its executor (started at creation,
    in the background): bounded by a generous time, not a count of tries."""
    deadline = time.monotonic() + 60
    while True:
        where = await run_command(http, server, token, exp, "python3 flood.py where")
        assert where["status"] == "completed", where
        if where["stdout"] == "fast\n":
            return
        assert time.monotonic() < deadline, "the experiment's executor never served"
        await asyncio.sleep(0.2)


async def timed_meanwhile(
    http: httpx2.AsyncClient, server: RunningServer, token: str, experiment: str
) -> tuple[list[float], list[float]]:
    """/health and the honest tenant's list, one after the other, for the flood's
    length and a second more; their latencies."""
    health: list[float] = []
    calls: list[float] = []
    until = time.monotonic() + FLOOD_S + 1
    while time.monotonic() < until:
        started = time.perf_counter()
        answer = await http.get(f"{server.base_url}/health")
        health.append(time.perf_counter() - started)
        assert answer.status_code == 200, answer.text
        started = time.perf_counter()
        listed = await tool(
            http, server, token, "list_sandbox_files", {"experiment_id": experiment}
        )
        calls.append(time.perf_counter() - started)
        assert not listed["is_error"], listed
    return health, calls
