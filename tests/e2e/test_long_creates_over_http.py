"""Creates that go on past their call (a clone past SYNC_WAIT_S), over HTTP, when the
server goes away under them and when another process is asked about them.

A clone that outlasts the synchronous wait answers ``CREATING`` and goes on in the
background. A server stopped meanwhile undoes it; a server killed meanwhile cannot, so
the record names the process creating it, and once that process is taken for dead
(``PROCESS_STALE_S``) recovery ends it ``DESTROYED`` with a warning saying to create it
again: it neither stays ``CREATING`` nor counts toward ``MAX_EXPERIMENTS``. Another
process on the same PostgreSQL sees the creation, refuses commands in it, and reads
what it copied once it is made.

The clone's source is a local repository (local mode) of incompressible files, so the
helper container's clone runs for seconds past a short SYNC_WAIT_S. Nothing is timed:
an attempt whose clone ended before the server went away (the experiment READY) is
destroyed and the next attempt made; the waits are bounds against a hang.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import httpx2
import pytest
from db_testkit import fresh_postgres_blocking
from docker_testkit import labelled, remove_labelled_containers
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import run_command, tool

pytestmark = pytest.mark.e2e

BLOBS, BLOB_MB = 24, 1  # 24 MB that git cannot compress: a clone of seconds
MAX_EXPERIMENTS = 4  # the default (docs/limits.md)
ATTEMPTS = 5  # each one a create whose clone is cut short; only a fast clone repeats one
FAST = {
    "SANDBOX_MCP_SYNC_WAIT_S": "0.2",  # every clone outlasts it: CREATING, in the background
    "SANDBOX_MCP_PROCESS_STALE_S": "6",  # a killed process is taken for dead in 6 s
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local repository with BLOBS files of random bytes (one commit)."""
    root = tmp_path_factory.mktemp("long-creates") / "repo"
    root.mkdir()
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    for n in range(BLOBS):
        (root / f"blob{n}.bin").write_bytes(os.urandom(BLOB_MB * 1_048_576))
    (root / "README").write_text("cloned\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "blobs"], check=True)
    return root


def remove_leftovers(engine: docker.DockerClient, state_dir: Path) -> None:
    """Remove every container of this state dir's deployment (a stopped or killed server
    leaves its experiments' containers for its next start)."""
    deployment = (state_dir / "deployment-id").read_text().strip()
    remove_labelled_containers(engine, f"io.sandbox-mcp.managed={deployment}")


def clone_helpers(engine: docker.DockerClient, state_dir: Path) -> list[str]:
    """The clone helpers' ids, as the engine lists them. Not containers.list, which
    inspects each one listed and raises NotFound for a helper removed meanwhile (the
    very removal the callers wait for)."""
    deployment = (state_dir / "deployment-id").read_text().strip()
    return labelled(engine, f"io.sandbox-mcp.managed={deployment}", "io.sandbox-mcp.role=git-clone")


async def get(http: httpx2.AsyncClient, server: RunningServer, exp: str) -> dict[str, Any]:
    return await tool(http, server, "", "get_experiment", {"experiment_id": exp})


async def settled(
    http: httpx2.AsyncClient, server: RunningServer, exp: str, bound_s: float = 240
) -> dict[str, Any]:
    """The experiment once it has left CREATING (waited for, within ``bound_s``)."""
    deadline = time.monotonic() + bound_s
    while (view := await get(http, server, exp))["state"] == "CREATING":
        assert time.monotonic() < deadline, f"{exp} still CREATING after {bound_s} s"
        await asyncio.sleep(0.25)
    return view


async def until(check: Callable[[], Awaitable[bool]], what: str, bound_s: float = 120) -> None:
    deadline = time.monotonic() + bound_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {bound_s} s: {what}"
        await asyncio.sleep(0.25)


async def clone_in_background(
    http: httpx2.AsyncClient, server: RunningServer, repo: Path
) -> dict[str, Any]:
    made = await tool(
        http, server, "", "create_experiment", {"git": {"url": str(repo), "ref": "main"}}
    )
    assert not made["is_error"], made
    return made


def live_count(listed: dict[str, Any]) -> int:
    return sum(1 for e in listed["experiments"] if e["state"] != "DESTROYED")


@pytest.mark.parametrize("stop", ["terminate", "kill"])
@pytest.mark.timeout(900)
async def test_a_restart_under_a_background_clone_ends_it_destroyed_saying_what_to_do(
    tmp_path: Path,
    http: httpx2.AsyncClient,
    engine: docker.DockerClient,
    repo: Path,
    stop: str,
) -> None:
    state = tmp_path / "state"
    server = start_server(state, **FAST)
    try:
        for _ in range(ATTEMPTS):
            made = await clone_in_background(http, server, repo)
            exp = made["experiment_id"]
            if made["state"] != "CREATING":  # cloned within 0.2 s: nothing to cut short
                await tool(http, server, "", "destroy_experiment", {"experiment_id": exp})
                continue
            assert any("still being prepared (cloning the repository)" in n for n in made["notes"])
            # The server goes away while the clone runs: stopped (SIGTERM: it undoes the
            # creation itself) or killed (SIGKILL: nothing of it runs any more).
            if stop == "terminate":
                await asyncio.to_thread(stop_server, server)
            else:
                server.process.send_signal(signal.SIGKILL)
                await asyncio.to_thread(server.process.wait)
            server = start_server(state, **FAST)
            view = await settled(http, server, exp)
            if view["state"] != "DESTROYED":  # the clone ended before the server went away
                assert view["state"] == "READY", view
                await tool(http, server, "", "destroy_experiment", {"experiment_id": exp})
                continue
            break
        else:
            pytest.fail(f"every one of {ATTEMPTS} clones ended before the server went away")
        print(f"\n{stop}: {view['warnings']}")
        (warning,) = view["warnings"]
        assert warning.startswith("Creation failed: ")
        assert "create it again with create_experiment" in warning.lower()
        # Nothing of it is left: its folder, and (killed) the clone helper its process ran
        # (removed just after the record is retired: waited for, bounded).

        async def nothing_left() -> bool:
            folders = list((state / "slots").glob(f"*/exp-{exp}"))
            return not folders and await asyncio.to_thread(clone_helpers, engine, state) == []

        await until(nothing_left, "its folder and the clone helper gone")
        # It does not count toward MAX_EXPERIMENTS: the whole limit is there to use.
        listed = await tool(http, server, "", "list_experiments", {"limit": 50})
        assert live_count(listed) == 0, listed
        made_now = []
        for _ in range(MAX_EXPERIMENTS):
            fresh = await tool(http, server, "", "create_experiment", {})
            assert fresh["state"] == "READY", fresh
            made_now.append(fresh["experiment_id"])
        for fresh_id in made_now:
            await tool(http, server, "", "destroy_experiment", {"experiment_id": fresh_id})
    finally:
        await asyncio.to_thread(stop_server, server)
        await asyncio.to_thread(remove_leftovers, engine, state)


class Pair:
    """Two server processes on one PostgreSQL and one state dir."""

    def __init__(self, state_dir: Path, database_url: str) -> None:
        self.state_dir = state_dir
        self._env = {"SANDBOX_MCP_DATABASE_URL": database_url, **FAST}
        # One after the other: the first migrates the schema.
        self.servers = [self.start(), self.start()]

    def start(self) -> RunningServer:
        return start_server(self.state_dir, **self._env)

    def stop(self) -> None:
        for server in self.servers:
            stop_server(server)


@pytest.fixture
def pair(tmp_path: Path, engine: docker.DockerClient) -> Iterator[Pair]:
    with fresh_postgres_blocking() as url:
        running = Pair(tmp_path / "state", url)
        try:
            yield running
        finally:
            running.stop()
            remove_leftovers(engine, running.state_dir)


@pytest.mark.timeout(900)
async def test_another_process_sees_a_background_clone_refuses_commands_and_retires_it(
    http: httpx2.AsyncClient, pair: Pair, repo: Path, engine: docker.DockerClient
) -> None:
    first, other = pair.servers
    for _ in range(ATTEMPTS):
        made = await clone_in_background(http, first, repo)
        exp = made["experiment_id"]
        # The other process reads the record the first one is still preparing, and
        # refuses a command in it as the first one would.
        seen = await get(http, other, exp)
        if seen["state"] == "CREATING":
            assert (seen["files_copied"], seen["secrets_skipped"]) == (None, None)
            refused = await run_command(http, other, "", exp, "ls")
            if refused["is_error"]:
                assert refused["error"]["code"] == "INVALID_STATE", refused
                assert "still being created" in refused["error"]["message"]
                break
        # The clone ended before the other process was asked: nothing to see; again.
        await settled(http, other, exp)
        await tool(http, other, "", "destroy_experiment", {"experiment_id": exp})
    else:
        pytest.fail(f"every one of {ATTEMPTS} clones ended before the other process looked")
    # Once made (by the first process, in the background), the other one reads what the
    # clone put in the workspace, which only the create's own answer used to say.
    view = await settled(http, other, exp)
    assert view["state"] == "READY", view
    assert (view["files_copied"], view["secrets_skipped"]) == (BLOBS + 1, 0)
    readme = {"experiment_id": exp, "path": "README"}
    read = await tool(http, other, "", "read_sandbox_file", readme)
    assert read["content"] == "cloned\n", read
    await tool(http, other, "", "destroy_experiment", {"experiment_id": exp})

    # The first process killed under a clone: the other one, which lives, retires the
    # creation once the first is taken for dead (PROCESS_STALE_S), and sweeps its helper.
    for _ in range(ATTEMPTS):
        made = await clone_in_background(http, first, repo)
        exp = made["experiment_id"]
        if made["state"] != "CREATING":
            await tool(http, first, "", "destroy_experiment", {"experiment_id": exp})
            continue
        first.process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.process.wait)
        view = await settled(http, other, exp)
        if view["state"] == "DESTROYED":
            break
        assert view["state"] == "READY", view  # the clone ended before the kill
        await tool(http, other, "", "destroy_experiment", {"experiment_id": exp})
        pair.servers[0] = first = await asyncio.to_thread(pair.start)
    else:
        pytest.fail(f"every one of {ATTEMPTS} clones ended before the kill")
    (warning,) = view["warnings"]
    assert "Create it again with create_experiment." in warning, warning

    async def helper_swept() -> bool:
        return await asyncio.to_thread(clone_helpers, engine, pair.state_dir) == []

    await until(helper_swept, "the killed process's clone helper removed")
    listed = await tool(http, other, "", "list_experiments", {"limit": 50})
    assert live_count(listed) == 0, listed
    pair.servers[0] = await asyncio.to_thread(pair.start)  # for the fixture's stop
