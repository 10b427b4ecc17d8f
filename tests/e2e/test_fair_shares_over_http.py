"""Fair shares over HTTP, on the real Docker engine: one tenant cannot starve the others.

Each server gets a label prefix of its own, so its container count and its start-up
sweep see only its own containers (other test servers may share the engine).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx2
import pytest
from docker_testkit import remove_labelled_containers
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import run_command, tool
from oauth_browser import ManualClient

pytestmark = pytest.mark.e2e


@pytest.fixture
def prefix() -> Iterator[str]:
    """A label prefix for one test's server; its containers are removed afterwards."""
    label_prefix = f"io.sandbox-mcp-fair-{uuid.uuid4().hex[:10]}"
    yield label_prefix
    client = docker.from_env()
    try:
        remove_labelled_containers(client, f"{label_prefix}.managed")
    finally:
        client.close()


def serve(state: Path, prefix: str, **env: str) -> RunningServer:
    return start_server(
        state,
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
        SANDBOX_MCP_SYNC_WAIT_S="20",
        SANDBOX_MCP_LABEL_PREFIX=prefix,
        **{f"SANDBOX_MCP_{name}": value for name, value in env.items()},
    )


async def sign_in(http: httpx2.AsyncClient, server: RunningServer, users: int) -> list[str]:
    """Access tokens of ``users`` different sandboxes."""
    client = await ManualClient.register(http, server.base_url)
    return [await client.access_token(http) for _ in range(users)]


async def create(http: httpx2.AsyncClient, server: RunningServer, token: str) -> dict[str, Any]:
    return await tool(http, server, token, "create_experiment", {"name": "fair"})


async def test_a_hostile_sandbox_cannot_starve_the_others(
    http: httpx2.AsyncClient, tmp_path: Path, prefix: str
) -> None:
    # A pool of 3 with 4 containers: one spare beyond a first for every slot.
    server = serve(
        tmp_path / "state",
        prefix,
        POOL_SIZE="3",
        MAX_CONTAINERS="4",
        MAX_JOBS_PER_SANDBOX="3",
        MAX_JOBS_PER_EXPERIMENT="2",
    )
    try:
        hostile, bob, carol = await sign_in(http, server, 3)
        made = [await create(http, server, hostile) for _ in range(3)]
        assert [m["is_error"] for m in made] == [False, False, True], made
        refused = made[2]["error"]
        assert (refused["code"], refused["reason"], refused["spare"]) == (
            "CAPACITY_EXCEEDED",
            "spare_in_use",
            1,
        )
        assert "destroy one you no longer need" in refused["message"]
        experiments = [m["experiment_id"] for m in made[:2]]

        # Many silent background jobs at once: only the sandbox's share is accepted.
        started = await asyncio.gather(
            *(
                run_command(http, server, hostile, experiments[i % 2], "sleep 600", background=True)
                for i in range(16)
            )
        )
        accepted = [s for s in started if not s["is_error"]]
        refusals = [s["error"] for s in started if s["is_error"]]
        assert len(accepted) == 3
        assert {r["code"] for r in refusals} == {"LIMIT_REACHED"}
        assert {r["limit"] for r in refusals} <= {"jobs_per_sandbox", "jobs_per_experiment"}
        assert any("maximum of 3 jobs" in r["message"] for r in refusals)

        # Everyone else still gets a first experiment, and their output is read.
        for name, token in (("bob", bob), ("carol", carol)):
            created = await create(http, server, token)
            assert not created["is_error"], created
            ran = await run_command(
                http, server, token, created["experiment_id"], f"echo hi-{name}"
            )
            assert (ran["status"], ran["exit_code"], ran["stdout"]) == (
                "completed",
                0,
                f"hi-{name}\n",
            )
        for job in accepted:
            status = await tool(http, server, hostile, "get_job_status", {"job_id": job["job_id"]})
            assert status["status"] == "running", "the hostile's own jobs were left alone"

        # A job that ends gives its place back.
        cancelled = await tool(
            http, server, hostile, "cancel_job", {"job_id": accepted[0]["job_id"]}
        )
        assert cancelled["status"] == "cancelled"
        again = await run_command(http, server, hostile, accepted[0]["experiment_id"], "echo mine")
        assert (again["status"], again["stdout"]) == ("completed", "mine\n")
    finally:
        stop_server(server)


async def test_a_full_pool_runs_an_experiment_for_every_slot_and_queues_the_rest(
    http: httpx2.AsyncClient, tmp_path: Path, prefix: str
) -> None:
    # As many containers as slots: no spare at all, yet every slot gets its first.
    server = serve(tmp_path / "state", prefix, POOL_SIZE="6", MAX_CONTAINERS="6")
    try:
        tokens = await sign_in(http, server, 8)
        first, *others = tokens[:6]
        early = await create(http, server, first)
        assert not early["is_error"], early
        greedy = await create(http, server, first)
        assert greedy["is_error"]
        assert (greedy["error"]["code"], greedy["error"]["reason"]) == (
            "CAPACITY_EXCEEDED",
            "spare_in_use",
        )

        created = [early, *await asyncio.gather(*(create(http, server, t) for t in others))]
        assert [c["is_error"] for c in created] == [False] * 6, created
        ran = await asyncio.gather(
            *(
                run_command(http, server, token, c["experiment_id"], f"echo user-{i}")
                for i, (token, c) in enumerate(zip(tokens[:6], created, strict=True))
            )
        )
        assert [(r["status"], r["stdout"]) for r in ran] == [
            ("completed", f"user-{i}\n") for i in range(6)
        ]

        # Two more callers: queued in the order they came, and they keep their places.
        late = [await create(http, server, token) for token in tokens[6:]]
        assert [(q["error"]["code"], q["error"]["position"]) for q in late] == [
            ("SANDBOX_QUEUED", 1),
            ("SANDBOX_QUEUED", 2),
        ]
        assert (await create(http, server, tokens[6]))["error"]["position"] == 1
        health = (await http.get(f"{server.base_url}/health")).json()["pool"]
        assert (health["busy"], health["free"], health["queued"]) == (6, 0, 2)
    finally:
        stop_server(server)


def test_fewer_containers_than_slots_is_refused_at_start_up(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", "serve"],
        env={
            **os.environ,
            "SANDBOX_MCP_STATE_DIR": str(tmp_path / "state"),
            "SANDBOX_MCP_AUTH": "none",
            "SANDBOX_MCP_POOL_SIZE": "6",
            "SANDBOX_MCP_MAX_CONTAINERS": "5",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert (
        "sandbox-mcp: SANDBOX_MCP_MAX_CONTAINERS=5 is below SANDBOX_MCP_POOL_SIZE=6: every "
        "sandbox the pool hands out must be able to run one experiment" in done.stderr
    )
    assert "set SANDBOX_MCP_MAX_CONTAINERS to at least 6" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "state").exists(), "refused before anything was created"
