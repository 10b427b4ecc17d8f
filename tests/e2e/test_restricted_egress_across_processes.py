"""Network "restricted" with two server processes on one PostgreSQL (``serve --workers``):
one of them runs Squid, both create restricted experiments, the byte cap counts
what an experiment moved through either, a refusal reaches whichever process runs
the experiment's next command, and when the process running Squid is killed with
kill -9 the other takes Squid over on the same address.

Real servers over HTTP, real Docker, real Squid, real PostgreSQL; the outside world
is the registry of ``egress_testkit`` (as in test_restricted_egress_over_http.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from db_testkit import fresh_postgres
from e2e_server import RunningServer, free_port, start_server, stop_server
from egress_testkit import (
    BIG_FILE,
    FETCH,
    PYTHON_IMAGE,
    OutsideWorld,
    remove_restricted_network,
)
from mcp_http import run_command, tool

pytestmark = pytest.mark.e2e

CAP = 2 * 1024 * 1024  # the 1.5 MiB file passes once, not twice
PAGE = "https://pypi.org/simple/tinypkg/"
OFF_LIST = "https://example.com/"
BIG = f"https://files.pythonhosted.org/packages/{BIG_FILE}"


def settings(world: OutsideWorld, database: str) -> dict[str, str]:
    return {
        "SANDBOX_MCP_DATABASE_URL": database,
        "SANDBOX_MCP_EGRESS_PROXY": "true",
        "SANDBOX_MCP_EGRESS_ALLOWLIST": "pypi.org,files.pythonhosted.org",
        "SANDBOX_MCP_EGRESS_TEST_HOSTS": world.test_hosts(),
        "SANDBOX_MCP_EGRESS_MAX_BYTES": str(CAP),
        "SANDBOX_MCP_IMAGES": PYTHON_IMAGE,
        "SANDBOX_MCP_DEFAULT_IMAGE": PYTHON_IMAGE,
        "SANDBOX_MCP_POOL_SIZE": "2",
        "SANDBOX_MCP_MAX_EXPERIMENTS": "10",
    }


def a_process(state: Path, world: OutsideWorld, database: str) -> RunningServer:
    return start_server(state, **settings(world, database))


def squid_runs(pid: int) -> bool:
    """Whether ``pid`` is a running Squid (a zombie waiting for init has no command line)."""
    try:
        return b"squid" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def logged_at(server: RunningServer, event: str) -> float:
    """When ``server`` last logged ``event`` (epoch seconds)."""
    stamps = [
        json.loads(line)["timestamp"]
        for line in server.log().splitlines()
        if line.startswith("{") and f'"event": "{event}"' in line
    ]
    assert stamps, f"{event} was not logged"
    return datetime.fromisoformat(stamps[-1].replace("Z", "+00:00")).timestamp()


def documented_election_s() -> float:
    text = " ".join((Path(__file__).parents[2] / "docs" / "egress.md").read_text().split())
    found = re.search(r"another is elected within (\d+) seconds", text)
    assert found, "docs/egress.md no longer says how soon Squid is taken over"
    return float(found[1])


def runs_squid(server: RunningServer) -> bool:
    return '"egress.started"' in server.log()


async def create(http: httpx2.AsyncClient, server: RunningServer) -> str:
    created = await tool(http, server, "", "create_experiment", {"network": "restricted"})
    assert not created["is_error"], created
    return str(created["experiment_id"])


async def fetch(
    http: httpx2.AsyncClient, server: RunningServer, experiment: str, *urls: str
) -> dict[str, Any]:
    return await run_command(http, server, "", experiment, FETCH.format(urls=list(urls)))


async def proxy_health(http: httpx2.AsyncClient, server: RunningServer) -> dict[str, Any]:
    body = (await http.get(f"{server.base_url}/health")).json()
    return dict(body["egress_proxy"])


async def test_two_processes_share_one_squid_its_cap_and_its_takeover_after_kill_9(
    http: httpx2.AsyncClient, tmp_path: Path, world: OutsideWorld
) -> None:
    state = tmp_path / "state"
    network = None
    async with fresh_postgres() as database:
        servers = [a_process(state, world, database), a_process(state, world, database)]
        try:
            network = re.search(r'"network": "([^"]+)"', servers[0].log())
            assert [runs_squid(s) for s in servers] == [True, False], "one Squid, the first's"
            # /health on each says the proxy runs, and which process runs it.
            healths = [await proxy_health(http, s) for s in servers]
            assert [h["ok"] for h in healths] == [True, True], healths
            assert healths[0]["run_by"] == healths[1]["run_by"]
            # Through each process: an allowed name is reached, another is refused, and
            # the result of the command that was refused says so.
            experiments = [await create(http, s) for s in servers]
            for server, experiment in zip(servers, experiments, strict=True):
                result = await fetch(http, server, experiment, PAGE, OFF_LIST)
                assert f"reached {PAGE}" in result["stdout"], result
                assert f"failed {OFF_LIST}" in result["stdout"], result
                assert (
                    "example.com:443: not on this experiment's allow-list" in (result["stderr"])
                ), result
            # A refusal reaches whichever process runs the experiment's next command.
            refused = await fetch(http, servers[1], experiments[0], OFF_LIST)
            assert "The egress proxy refused 1 connection(s)" in refused["stderr"], refused
            again = await run_command(http, servers[0], "", experiments[0], "true")
            assert "egress proxy refused" not in again["stderr"], "told once, by one process"
            # The cap counts what the experiment moved through both processes.
            first = await fetch(http, servers[0], experiments[1], BIG)
            assert f"reached {BIG}" in first["stdout"], first
            assert "EGRESS_CAP_REACHED" not in first["stderr"], first
            over = await fetch(http, servers[1], experiments[1], BIG)
            assert f"EGRESS_CAP_REACHED: the egress byte cap ({CAP:,} bytes)" in (over["stderr"]), (
                over
            )
            blocked = await fetch(http, servers[0], experiments[1], PAGE)
            assert f"failed {PAGE}" in blocked["stdout"], blocked
            assert (
                "pypi.org:443: this experiment has used its egress byte cap" in (blocked["stderr"])
            ), blocked
            # kill -9 of the process running Squid: the other takes it over.
            squid = int(re.search(r'"pid": (\d+).*"egress.started"', servers[0].log())[1])  # type: ignore[index]
            os.kill(servers[0].process.pid, signal.SIGKILL)
            killed_at = time.time()
            servers[0].process.wait()
            survivor = servers[1]
            deadline = time.monotonic() + 30
            while not (runs_squid(survivor) and (await proxy_health(http, survivor))["ok"]):
                assert time.monotonic() < deadline, survivor.log()[-3000:]
                await asyncio.sleep(0.05)
            served_again = time.time() - killed_at
            elected = logged_at(survivor, "egress.elected") - killed_at
            print(f"\nSquid: elected {elected:.2f} s, serving {served_again:.2f} s after kill -9")
            # docs/egress.md: "another is elected within N seconds" (the proxy polls every
            # second); the election's own round trip to PostgreSQL comes on top.
            assert elected <= documented_election_s() + 1, (elected, served_again)
            assert not squid_runs(squid), "the dead process's Squid was stopped"
            fresh = await create(http, survivor)
            works = await fetch(http, survivor, fresh, PAGE, OFF_LIST)
            assert f"reached {PAGE}" in works["stdout"], works
            assert "example.com:443: not on this experiment's allow-list" in works["stderr"]
            kept = await fetch(http, survivor, experiments[0], PAGE)
            assert f"reached {PAGE}" in kept["stdout"], "a container made before keeps its way"
            still = await fetch(http, survivor, experiments[1], PAGE)
            assert f"failed {PAGE}" in still["stdout"], "and a capped one stays capped"
        finally:
            for server in servers:
                if server.process.poll() is None:
                    stop_server(server)
            if network is not None:
                remove_restricted_network(network[1])


def serve_workers(
    workers: int, port: int, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "app", "serve", "--workers", str(workers), "--port", str(port)]
    with log.open("wb") as err:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)


async def test_serve_workers_2_runs_one_squid_and_serves_network_restricted(
    http: httpx2.AsyncClient, tmp_path: Path, world: OutsideWorld
) -> None:
    # The command an operator types (it was refused with the proxy on).
    async with fresh_postgres() as database:
        port, log = free_port(), tmp_path / "serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_MCP_")}
        env |= settings(world, database) | {
            "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state"),
            "SANDBOX_MCP_AUTH": "none",
            "SANDBOX_MCP_WARM_CONTAINERS": "0",
        }
        parent = serve_workers(2, port, env, log)
        served = RunningServer(f"http://127.0.0.1:{port}", parent, log)
        try:
            deadline = time.monotonic() + 60
            while served.log().count('"service.started"') < 2:
                assert parent.poll() is None, served.log()[-3000:]
                assert time.monotonic() < deadline, served.log()[-3000:]
                await asyncio.sleep(0.2)
            assert served.log().count('"egress.started"') == 1, "one Squid for both workers"
            assert (await proxy_health(http, served))["ok"] is True
            experiment = await create(http, served)
            result = await fetch(http, served, experiment, PAGE, OFF_LIST)
            assert f"reached {PAGE}" in result["stdout"], result
            assert "example.com:443: not on this experiment's allow-list" in result["stderr"]
        finally:
            network = re.search(r'"network": "([^"]+)"', served.log())
            parent.send_signal(signal.SIGTERM)
            assert parent.wait(timeout=30) == 0
            if network is not None:
                remove_restricted_network(network[1])
