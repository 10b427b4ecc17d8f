"""Artifacts, resources, the project map and search over HTTP; an idle sandbox's teardown."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from pathlib import Path
from typing import Any

import docker
import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import post_rpc, read_jsonrpc, run_command, tool
from oauth_browser import new_users

pytestmark = pytest.mark.e2e


async def read_resource(
    http: httpx2.AsyncClient, server: RunningServer, token: str, uri: str
) -> dict[str, Any]:
    response = await post_rpc(
        http, server.mcp_url, "resources/read", {"uri": uri}, token=token, name=uri
    )
    return read_jsonrpc(response)


async def test_artifacts_resources_map_and_search(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="3",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
    )
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            alice, mallory = await new_users(http, server.base_url, 2)
            exp = (
                await tool(
                    http,
                    server,
                    alice,
                    "create_experiment",
                    {
                        "files": {
                            "main.py": "def greet():\n    return 'hi'\n",
                            "tests/test_main.py": (
                                "from main import greet\n\ndef test_greet():\n"
                                "    assert greet() == 'hi'\n"
                            ),
                            "pyproject.toml": "[tool.pytest.ini_options]\n",
                        }
                    },
                )
            )["experiment_id"]
            mapped = await tool(http, server, alice, "map_project", {"experiment_id": exp})
            assert mapped["languages"] == {"Python": 2}
            assert mapped["test_runner"] == "pytest"
            assert "main.py" in mapped["entry_points"]
            assert "pyproject.toml" in mapped["manifests"]

            found = await tool(
                http,
                server,
                alice,
                "search_sandbox",
                {"experiment_id": exp, "pattern": r"\bgreet\("},
            )
            assert {(m["path"], m["line"]) for m in found["matches"]} == {
                ("main.py", 1),
                ("tests/test_main.py", 4),
            }

            await tool(
                http,
                server,
                alice,
                "execute_experiment",
                {
                    "experiment_id": exp,
                    "command": (
                        "mkdir -p out/deep && head -c 3000 /dev/urandom > out/deep/report.bin"
                        " && echo ok > out/summary.txt"
                    ),
                },
            )
            collected = await tool(
                http,
                server,
                alice,
                "collect_artifacts",
                {"experiment_id": exp, "patterns": ["**/report.bin", "out/*.txt"]},
            )
            paths = {a["path"]: a for a in collected["artifacts"]}
            assert set(paths) == {"out/deep/report.bin", "out/summary.txt"}
            summary = paths["out/summary.txt"]
            assert summary["size"] == 3
            assert summary["sha256"] == hashlib.sha256(b"ok\n").hexdigest()

            content = await read_resource(http, server, alice, paths["out/deep/report.bin"]["uri"])
            blob = content["result"]["contents"][0]
            data = base64.b64decode(blob["blob"])
            assert hashlib.sha256(data).hexdigest() == paths["out/deep/report.bin"]["sha256"]

            listing = await read_resource(http, server, alice, "sandbox://experiments")
            assert exp in listing["result"]["contents"][0]["text"]
            logs = await read_resource(http, server, alice, f"sandbox://experiments/{exp}/logs")
            assert "$ mkdir -p out/deep" in logs["result"]["contents"][0]["text"]

            # Every resource is scoped to the caller: Mallory sees nothing of Alice's.
            for uri in (
                f"sandbox://experiments/{exp}",
                f"sandbox://experiments/{exp}/artifacts",
                paths["out/summary.txt"]["uri"],
            ):
                denied = await read_resource(http, server, mallory, uri)
                assert "error" in denied, denied
            theirs = await read_resource(http, server, mallory, "sandbox://experiments")
            assert exp not in theirs["result"]["contents"][0]["text"]
    finally:
        stop_server(server)


async def test_an_idle_sandbox_loses_its_containers_and_a_running_job_keeps_it(
    tmp_path: Path,
) -> None:
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_IDLE_TIMEOUT_S="10",
    )
    engine = docker.from_env()
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            busy, idle = await new_users(http, server.base_url, 2)
            busy_exp = (await tool(http, server, busy, "create_experiment", {}))["experiment_id"]
            # A job that outlives the test (cancelled at its end): no window to hit.
            job = await run_command(http, server, busy, busy_exp, "sleep 600", background=True)
            assert job["status"] == "running"
            # The idle sandbox's last call comes after the busy one's: once the watchdog
            # has emptied it, the busy sandbox was past its idle timeout too (the watchdog
            # takes the oldest first), and only its job kept it. Driven by that event, seen
            # on /health (which is nobody's activity), not by a sleep.
            idle_exp = (await tool(http, server, idle, "create_experiment", {}))["experiment_id"]
            await wait_for_leases(http, server, 1)
            gone = await tool(http, server, idle, "get_experiment", {"experiment_id": idle_exp})
            assert gone["state"] == "DESTROYED"
            assert "idle" in gone["findings"]["reason"]
            # Its container goes just after the destroy (app/experiments/removals.py):
            # a removal that takes a while on a busy machine, so it is waited for.
            assert await gone_within(engine, idle_exp, 60), "the idle sandbox's container stayed"
            alive = await tool(http, server, busy, "get_experiment", {"experiment_id": busy_exp})
            assert alive["state"] == "RUNNING", "a running job keeps its sandbox alive"
            fresh = await tool(http, server, idle, "create_experiment", {})
            assert any("emptied" in note for note in fresh["notes"])
            await tool(http, server, busy, "cancel_job", {"job_id": job["job_id"]})
    finally:
        engine.close()
        stop_server(server)


async def gone_within(engine: docker.DockerClient, experiment_id: str, timeout_s: float) -> bool:
    """Whether the experiment's containers are gone within ``timeout_s``, as the engine
    lists them (no inspection, which fails on one whose removal ends meanwhile)."""
    label = {"label": f"io.sandbox-mcp.experiment={experiment_id}"}
    deadline = time.monotonic() + timeout_s
    while True:
        if not await asyncio.to_thread(engine.api.containers, all=True, filters=label):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.2)


async def wait_for_leases(http: httpx2.AsyncClient, server: RunningServer, busy: int) -> None:
    """Until /health counts ``busy`` leased slots (a minute at most: the watchdog ticks
    every second with a 10 s idle timeout)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pool = (await http.get(f"{server.base_url}/health")).json()["pool"]
        if pool["busy"] == busy:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the pool never came to {busy} leased slot(s): {pool}")
