"""Warm containers with two real server processes on one PostgreSQL and the real
Docker engine (issue 14): each process keeps its own, never two in one slot; a
sandbox whose first create reaches the other process gets a slot holding its own
containers only; a process that starts spares the live one's warm folders; a
process killed with kill -9 leaves warm containers that the other removes once its
heartbeat is stale, and the slots are filled afresh."""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import httpx2
import pytest
from db_testkit import fresh_postgres
from docker_testkit import remove_labelled_containers
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import run_command, tool

pytestmark = pytest.mark.e2e

PREFIX = f"io.sandbox-mcp-warm2-{uuid.uuid4().hex[:8]}"
POOL = 3


@pytest.fixture
def engine() -> Iterator[docker.DockerClient]:
    with contextlib.closing(docker.from_env()) as client:
        yield client
        remove_labelled_containers(client, f"{PREFIX}.managed")


def warm_by_slot(engine: docker.DockerClient) -> dict[str, list[tuple[str, str, Path]]]:
    """The running warm containers by slot: (id, owning process, workspace folder)."""
    slots: dict[str, list[tuple[str, str, Path]]] = {}
    for found in engine.api.containers(filters={"label": f"{PREFIX}.managed"}):
        labels, [name] = found["Labels"], found["Names"]
        # A handed-over one keeps its warm label; its name says whose it is now.
        if labels[f"{PREFIX}.sandbox"].startswith("warm-") and "smcp-handed-" not in name:
            [mount] = [m for m in found["Mounts"] if m["Destination"] == "/workspace"]
            folder = Path(mount["Source"])  # <slot root>/.warm-<token>/workspace
            slots.setdefault(folder.parent.parent.name, []).append(
                (found["Id"], labels[f"{PREFIX}.process"], folder)
            )
    return slots


def in_slot(engine: docker.DockerClient, slot: str) -> list[str]:
    """The sandbox labels of every container (any kind) whose workspace is in ``slot``."""
    labels = []
    for found in engine.api.containers(all=True, filters={"label": f"{PREFIX}.managed"}):
        for mount in found["Mounts"]:
            if mount["Destination"] == "/workspace" and f"/{slot}/" in mount["Source"]:
                labels.append(found["Labels"][f"{PREFIX}.sandbox"])
    return labels


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def one_each(engine: docker.DockerClient) -> dict[str, tuple[str, str, Path]]:
    slots = warm_by_slot(engine)
    assert all(len(held) == 1 for held in slots.values()), f"two in one slot: {slots}"
    return {slot: held[0] for slot, held in slots.items()}


async def test_two_processes_keep_their_warm_containers_apart_and_clean_up_a_dead_one(
    http: httpx2.AsyncClient, tmp_path: Path, engine: docker.DockerClient
) -> None:
    state = tmp_path / "state"
    async with fresh_postgres() as url:
        env = {
            "SANDBOX_MCP_DATABASE_URL": url,
            "SANDBOX_MCP_POOL_SIZE": str(POOL),
            "SANDBOX_MCP_WARM_CONTAINERS": "2",  # each: more than the two share
            "SANDBOX_MCP_LABEL_PREFIX": PREFIX,
            "SANDBOX_MCP_PROCESS_STALE_S": "3",
        }
        servers: list[RunningServer] = []
        try:
            servers.append(start_server(state, **env))
            first = servers[0]
            wait_for(lambda: len(warm_by_slot(engine)) == 2, "the first process's two")
            before = one_each(engine)
            first_id = next(iter(before.values()))[1]
            servers.append(start_server(state, **env))
            second = servers[1]
            wait_for(
                lambda: any(
                    owner != first_id
                    for held in warm_by_slot(engine).values()
                    for _, owner, _ in held
                ),
                "the second process's warm container",
            )
            # The second placed one, in the slot left free; the first's were spared.
            held = one_each(engine)
            assert len(held) == POOL
            for slot, (container_id, owner, folder) in before.items():
                assert held[slot] == (container_id, owner, folder)
                assert folder.is_dir(), "a starting process deleted a live one's warm folder"
            second_id = next(owner for _, owner, _ in held.values() if owner != first_id)
            # The sandbox takes the lowest slot (the first's warm container) through the
            # second process: it is removed, the create goes cold, the slot holds the
            # sandbox's container only, and the first process leaves that one alone.
            lowest = min(held)
            assert held[lowest][1] == first_id
            made = await tool(http, second, "", "create_experiment", {"files": {"a.py": "1\n"}})
            assert not made["is_error"], made
            assert len(in_slot(engine, lowest)) == 1
            assert not in_slot(engine, lowest)[0].startswith("warm-")
            wait_for(lambda: '"warm.removed_elsewhere"' in first.log(), "the first to notice")
            ran = await run_command(http, first, "", made["experiment_id"], "cat a.py")
            assert (ran["exit_code"], ran["stdout"]) == (0, "1\n")
            assert len(in_slot(engine, lowest)) == 1
            assert lowest not in one_each(engine)  # nobody put one back beside it
            # kill -9 the first: its warm containers go once its heartbeat is stale, and
            # the second fills the slot they held.
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(timeout=10)
            wait_for(lambda: '"warm.orphan_removed"' in second.log(), "the orphan's removal")
            wait_for(
                lambda: (
                    {owner for _, owner, _ in one_each(engine).values()} == {second_id}
                    and len(one_each(engine)) == POOL - 1
                ),
                "the second process's warm containers in the free slots",
            )
            for _, _, folder in before.values():
                assert not folder.parent.exists(), "a dead process's warm folder was left"
            assert len(in_slot(engine, lowest)) == 1
        finally:
            for server in servers:
                if server.process.poll() is None:
                    stop_server(server)
