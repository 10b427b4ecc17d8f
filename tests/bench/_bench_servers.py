"""What the HTTP benchmarks share: percentiles, a signed-in user, servers on both slot
backends (dir in a temporary state dir; zfs in a fresh dataset, provisioned and
destroyed by the run), and the hardened floor container."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx2

from app.runtime.backend import Limits
from app.runtime.docker import hardening

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from e2e_server import RunningServer, start_server, stop_server
from oauth_browser import ManualClient

IMAGE = "sandbox-mcp/python:3"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, ours: list[float], floor: list[float]) -> str:
    """One line: ours and the floor (p50 and p95, ms) and the ratios."""
    o50, o95, f50, f95 = (
        pct(v, q) * 1000 for v, q in ((ours, 0.5), (ours, 0.95), (floor, 0.5), (floor, 0.95))
    )
    return (
        f"  {name:<40} ours p50 {o50:7.1f} p95 {o95:7.1f} | floor p50 {f50:7.1f} p95 {f95:7.1f}"
        f" | ratio p50 {o50 / f50:5.2f} p95 {o95 / f95:5.2f}"
    )


async def new_user(http: httpx2.AsyncClient, server: RunningServer) -> str:
    client = await ManualClient.register(http, server.base_url)
    return str(await client.access_token(http))


def _cli(state: Path, *args: str) -> None:
    env = {**os.environ, "SANDBOX_MCP_STATE_DIR": str(state)}
    subprocess.run([sys.executable, "-m", "app", *args], check=True, env=env, capture_output=True)


@contextlib.contextmanager
def server_on(backend: str, root: Path, slots: int, **env: str) -> Iterator[RunningServer]:
    """A signed-in (oauth) server with ``slots`` slots on the ``dir`` or ``zfs`` backend."""
    state = root / f"state-{backend}-{uuid.uuid4().hex[:6]}"
    dataset = None
    extra: dict[str, str] = {}
    if backend == "zfs":
        parent = os.environ["SANDBOX_MCP_TEST_ZFS_PARENT"]  # source /tmp/dev/env.sh
        dataset = f"{parent}/bench{uuid.uuid4().hex[:8]}"
        _cli(state, "provision", "--slots", str(slots), "--zfs-parent", dataset, "--quota", "300M")
        extra = {"SANDBOX_MCP_SLOT_BACKEND": "zfs", "SANDBOX_MCP_ZFS_PARENT": dataset}
    settings = {
        "SANDBOX_MCP_AUTH": "oauth",
        "SANDBOX_MCP_POOL_SIZE": str(slots),
        "SANDBOX_MCP_SIGNINS_PER_MINUTE": "10000",
        "SANDBOX_MCP_QUEUE_WAIT_S": "0",
        "SANDBOX_MCP_LOG_LEVEL": "warning",
        **extra,
        **env,
    }
    server = start_server(state, **settings)
    try:
        yield server
    finally:
        stop_server(server)
        if dataset is not None:
            for _ in range(10):
                done = subprocess.run(["zfs", "destroy", "-r", dataset], capture_output=True)
                if done.returncode == 0:
                    break
                time.sleep(0.5)


def hardened_host_config(api: docker.APIClient, workspace: Path) -> object:
    """The server's own HostConfig (app/runtime/docker/hardening.py) for a floor's container:
    default limits, the workspace bound, no network."""
    return hardening.hardened_host_config(
        api,
        mounts=[docker.types.Mount(target="/workspace", source=str(workspace), type="bind")],
        network_mode="none",
        limits=Limits(),
        home="/home/sandbox",
        uid=1000,
        gid=1000,
    )


def hardened_floor(api: docker.APIClient, workspace: Path, labels: dict[str, str]) -> float:
    """Seconds for docker create + start + exec ``true`` of a hardened container (removed)."""
    host_config = hardened_host_config(api, workspace)
    started = time.perf_counter()
    created = api.create_container(
        IMAGE, entrypoint=["sleep", "infinity"], user="1000:1000", labels=labels,
        host_config=host_config,
    )  # fmt: skip
    api.start(created["Id"])
    exec_id = api.exec_create(created["Id"], ["echo", "hi"], user="1000:1000")["Id"]
    api.exec_start(exec_id)
    elapsed = time.perf_counter() - started
    api.remove_container(created["Id"], force=True)
    return elapsed
