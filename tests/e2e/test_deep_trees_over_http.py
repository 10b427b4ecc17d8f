"""A tenant's folder tree deeper than any recursion limit is destroyed cleanly.

Seen: a 1,500-deep tree made ``destroy_experiment`` fail with INTERNAL_ERROR
(shutil.rmtree recursed) and the slot's files stayed on disk for good.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from deep_trees import build_deep_tree
from e2e_server import RunningServer, Servers
from mcp_http import run_to_the_end, tool

from jail.tree_delete import delete_tree

pytestmark = pytest.mark.e2e

# Built with relative mkdir/chdir: the full path is far beyond PATH_MAX.
DEEP = (
    'python3 -c "import os,sys\n'
    "for _ in range(int(sys.argv[1])):\n"
    "    os.mkdir('d'); open('f', 'w').close(); os.chdir('d')\n"
    "print('built')\" {depth}"
)


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> Iterator[RunningServer]:
    running = serve_module(
        # Two slots, so four containers: the clone test needs a clone helper beside its
        # experiment while the destroy tests' containers may still be on their way out
        # on a busy machine (with one slot, two containers in all, the clone was refused
        # CAPACITY_EXCEEDED there: a matter of the engine's speed, not of deep trees).
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_SYNC_WAIT_S="50",
    )
    yield running
    serve_module.stop(running)
    # pytest deletes old tmp dirs with shutil.rmtree, which a deep tree left by a
    # failed test would break for every later run on this machine.
    delete_tree(server_state(running))


def _slot_leftovers(server: RunningServer) -> list[str]:
    slots = server_state(server) / "slots"
    found = [p.name for p in (slots / "slot-000").iterdir() if p.name != ".trash"]
    # Destroyed experiments are deleted in the background (app/experiments/workspace/trash.py).
    for trash in (slots / ".trash", slots / "slot-000" / ".trash"):
        if trash.exists():
            found += [f"{trash.parent.name}/.trash/{p.name}" for p in trash.iterdir()]
    return found


def _leftovers_after_deletion(server: RunningServer, timeout_s: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (found := _slot_leftovers(server)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def server_state(server: RunningServer) -> Path:
    # start_server puts the log next to the state dir it was given.
    return server.log_path.parent / "state"


@pytest.mark.parametrize("depth", [1_500, 5_000])
async def test_destroy_deletes_a_tree_deeper_than_recursion_allows(
    http: httpx2.AsyncClient, server: RunningServer, depth: int
) -> None:
    created = await tool(http, server, "", "create_experiment", {"name": f"deep-{depth}"})
    assert not created["is_error"], created
    exp = created["experiment_id"]
    # Building the tree can outlast the synchronous wait on a busy machine: its end
    # is read from the job.
    ran = await run_to_the_end(http, server, "", exp, DEEP.format(depth=depth), timeout_s=120)
    assert (ran["status"], ran["stdout"]) == ("completed", "built\n"), ran
    destroyed = await tool(http, server, "", "destroy_experiment", {"experiment_id": exp})
    assert not destroyed["is_error"], destroyed
    assert destroyed["state"] == "DESTROYED"
    assert await asyncio.to_thread(_leftovers_after_deletion, server) == []
    assert "Traceback" not in server.log()
    health = await http.get(f"{server.base_url}/health")
    assert health.status_code == 200


def _deep_repo(path: Path, depth: int) -> None:
    """A git repository whose one file lies ``depth`` folders down."""
    env = {
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    path.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, env=env, check=True)
    build_deep_tree(path, depth, bottom_file=("bottom.txt", b"bottom\n"))
    (path / "top.txt").write_text("top\n")
    subprocess.run(["git", "add", "-A"], cwd=path, env=env, check=True)
    subprocess.run(["git", "commit", "-qm", "deep"], cwd=path, env=env, check=True)


async def test_a_cloned_repository_deeper_than_recursion_allows_is_a_clear_error(
    http: httpx2.AsyncClient, server: RunningServer, tmp_path: Path
) -> None:
    # Seen after the deletes were fixed: copying the clone into the baseline
    # recursed (shutil.copytree) and create_experiment failed with INTERNAL_ERROR.
    repo = tmp_path / "repo"
    _deep_repo(repo, 1_200)
    try:
        created = await tool(http, server, "", "create_experiment", {"git": {"url": str(repo)}})
        assert created["is_error"], created
        assert created["error"]["code"] == "INVALID_PROJECT", created
        assert "deep" in created["error"]["message"]
        assert _slot_leftovers(server) == []
        assert "Traceback" not in server.log()
    finally:
        delete_tree(repo)
