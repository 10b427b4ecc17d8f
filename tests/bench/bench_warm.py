"""Benchmark: create_experiment (13 files) to first command output, cold and warm, beside
the floor (docker create + start + exec of a hardened container), in one run; and what an
idle warm container costs in memory.

    source /tmp/dev/env.sh
    uv run python tests/bench/bench_warm.py [--samples 10] [--backends dir,zfs]

Each sample is a new sandbox (a new sign-in) on two servers running side by side,
one without warm containers (cold) and one with them (warm, sampled once its warm
containers are back); the floor is measured in the same loop. Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import docker
import httpx2
from _bench_servers import hardened_floor, new_user, row, server_on
from mcp_http import run_command, tool

FILES = {f"pkg/mod{i}.py": f"VALUE = {i}\n" for i in range(12)} | {"main.py": "print('hi')\n"}
WARM = 2


def warm_ids(api: docker.APIClient, prefix: str) -> list[str]:
    """Warm containers not handed over yet (a handed-over one's folder was renamed)."""
    found = api.containers(filters={"label": f"{prefix}.managed"})
    return [
        c["Id"]
        for c in found
        if c["Labels"][f"{prefix}.sandbox"].startswith("warm-")
        and all(Path(m["Source"]).exists() for m in c["Mounts"])
    ]


def wait_warm(api: docker.APIClient, prefix: str) -> None:
    deadline = time.monotonic() + 60
    while len(warm_ids(api, prefix)) < WARM and time.monotonic() < deadline:
        time.sleep(0.05)


def memory_of(api: docker.APIClient, container_id: str) -> str:
    """What one idle container costs: its cgroup (docker stats, the cgroup's rss) and the
    containerd shim that holds it on the host."""
    stats = api.stats(container_id, stream=False)["memory_stats"]
    usage = stats.get("usage", 0) - stats.get("stats", {}).get("total_inactive_file", 0)
    rss = stats.get("stats", {}).get("total_rss")
    shim = _shim_rss(container_id)
    return (
        f"docker stats {usage / 1048576:.2f} MiB, cgroup rss "
        + (f"{rss / 1048576:.2f} MiB" if rss is not None else "n/a")
        + (f", containerd-shim rss {shim:.1f} MiB" if shim is not None else "")
    )


def _shim_rss(container_id: str) -> float | None:
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and b"containerd-shim" in cmdline[0] and container_id.encode() in cmdline:
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    return None


async def first_output(http: httpx2.AsyncClient, server: object, token: str) -> float:
    started = time.perf_counter()
    made = await tool(http, server, token, "create_experiment", {"files": FILES})  # type: ignore[arg-type]
    ran = await run_command(http, server, token, made["experiment_id"], "python3 main.py")  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    assert ran["stdout"] == "hi\n", (made, ran)
    return elapsed


async def bench(backend: str, samples: int, root: Path) -> None:
    api = docker.from_env(timeout=120).api
    prefix = f"io.sandbox-mcp-bench-warm-{uuid.uuid4().hex[:6]}"
    floor_labels = {f"{prefix}-floor.managed": "1"}
    floor_ws = root / f"floor-{backend}"
    floor_ws.mkdir()
    slots = samples + WARM + 1
    with (
        server_on(backend, root, slots, SANDBOX_MCP_WARM_CONTAINERS="0") as cold,
        server_on(
            backend, root, slots, SANDBOX_MCP_WARM_CONTAINERS=str(WARM),
            SANDBOX_MCP_LABEL_PREFIX=prefix,
        ) as warm,
    ):  # fmt: skip
        async with httpx2.AsyncClient(timeout=120) as http:
            floor, cold_t, warm_t = [], [], []
            # One unmeasured round each: imports, the Docker client, the first sign-in.
            await first_output(http, cold, await new_user(http, cold))
            wait_warm(api, prefix)
            await first_output(http, warm, await new_user(http, warm))
            for _ in range(samples - 1):
                floor.append(await asyncio.to_thread(hardened_floor, api, floor_ws, floor_labels))
                cold_t.append(await first_output(http, cold, await new_user(http, cold)))
                await asyncio.to_thread(wait_warm, api, prefix)
                token = await new_user(http, warm)
                warm_t.append(await first_output(http, warm, token))
            print(f"[{backend}] create_experiment (13 files) + first output, {len(floor)} samples")
            print(row("cold (no warm container)", cold_t, floor))
            print(row(f"warm (SANDBOX_MCP_WARM_CONTAINERS={WARM})", warm_t, floor))
            await asyncio.to_thread(wait_warm, api, prefix)
            for cid in warm_ids(api, prefix):
                print(f"  idle warm container {cid[:12]}: {memory_of(api, cid)}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--backends", default="dir,zfs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as root:
        for backend in args.backends.split(","):
            await bench(backend, args.samples, Path(root))


if __name__ == "__main__":
    asyncio.run(main())
