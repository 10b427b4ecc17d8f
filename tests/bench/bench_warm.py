"""Benchmark: create_experiment (13 files) to first command output, cold and warm, beside
the floor (docker create + start + exec of a hardened container), in one run; what an
idle warm container costs in memory; and a sandbox's next creates (its 2nd, 3rd and
4th), without and with the container prepared for each (SANDBOX_MCP_WARM_PREPARED).

    source /work/dev/env.sh
    uv run python tests/bench/bench_warm.py [--samples 10] [--backends dir,zfs] [--parts first,next]

``first``: each sample is a new sandbox (a new sign-in) on two servers running side by
side, one without warm containers (cold) and one with them (warm, sampled once its warm
containers are back); the floor is measured in the same loop.

``next``: each sample is a new sandbox on each of two servers side by side, the same but
for SANDBOX_MCP_WARM_PREPARED (0: before, 1: after); its first create is not measured,
then its 2nd, 3rd and 4th create_experiment + first command are (on the second server
once its prepared container is made: an agent reads a result between two creates); the
floor is measured in the same loop. Both servers' containers are removed at the end.

Prints, asserts nothing.

Measured (``--parts next --backends dir --samples 6``: 18 samples, 2 cores shared with
other engineers' work, so only the figures of one run compare), p50 / p95:

- 2026-12-06 07:26, load 13-19: before 1039 / 1705 ms, after 479 / 1026 ms, beside the
  engine's floor (docker create + start + exec) 943 / 1654 ms: ratio 1.10 before,
  0.51 after. An idle prepared container: 6.4 MiB in its cgroup, 13.3 MiB for its shim.
- 2026-12-06 07:38, load 12-13, create and first command apart (floor 874 / 1288 ms):
  before: create 574 / 999 ms, first command 281 / 527 ms, both 914 / 1394 ms (ratio
  1.05); after: create 105 / 209 ms, first command 425 / 621 ms, both 544 / 718 ms
  (ratio 0.62). The first command was slower after: the next prepared container's
  creation ran beside it, which is why it now begins 2 s after the create.
- 2026-12-06 08:04, load 15-22, with that delay (floor 1356 / 2239 ms): before: create
  1224 / 1673 ms, first command 502 / 880 ms, both 1635 / 2249 ms (ratio 1.21); after:
  create 122 / 453 ms, first command 303 / 571 ms, both 475 / 798 ms (ratio 0.35).
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


def prepared_waiting(api: docker.APIClient, prefix: str) -> int:
    """Prepared containers not handed over yet (a handed-over one is renamed)."""
    found = api.containers(filters={"label": f"{prefix}.prepared=1"})
    return sum(1 for c in found if c["Names"][0].lstrip("/").startswith("smcp-prepared-"))


def wait_prepared(api: docker.APIClient, prefix: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while prepared_waiting(api, prefix) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def remove_containers(api: docker.APIClient, prefix: str) -> None:
    """A stopped server leaves its experiments' containers: the bench removes its own."""
    for found in api.containers(all=True, filters={"label": f"{prefix}.managed"}):
        api.remove_container(found["Id"], force=True)


async def next_output(
    http: httpx2.AsyncClient, server: object, token: str, n: int
) -> tuple[float, float]:
    """(create_experiment, create_experiment + its first command's output), seconds."""
    started = time.perf_counter()
    files = {**FILES, "main.py": f"print('fix {n}')\n"}
    made = await tool(http, server, token, "create_experiment", {"files": files})  # type: ignore[arg-type]
    created = time.perf_counter() - started
    assert not made["is_error"], made
    ran = await run_command(http, server, token, made["experiment_id"], "python3 main.py")  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    assert ran["stdout"] == f"fix {n}\n", (made, ran)
    return created, elapsed


async def bench_next(backend: str, samples: int, root: Path) -> None:
    """A sandbox's 2nd, 3rd and 4th create + first command, before and after."""
    api = docker.from_env(timeout=120).api
    run = uuid.uuid4().hex[:6]
    before_prefix = f"io.sandbox-mcp-bench-next0-{run}"
    after_prefix = f"io.sandbox-mcp-bench-next1-{run}"
    floor_labels = {f"{after_prefix}-floor.managed": "1"}
    floor_ws = root / f"floor-next-{backend}"
    floor_ws.mkdir()
    slots = samples + WARM + 2
    # The same warm pool on both (the defaults' floor, a budget for one per sandbox).
    common = {
        "SANDBOX_MCP_WARM_CONTAINERS": str(WARM),
        "SANDBOX_MCP_WARM_MAX_CONTAINERS": "64",
        # Four experiments a sandbox: room for every sandbox's extras.
        "SANDBOX_MCP_MAX_CONTAINERS": str(4 * slots),
    }
    try:
        with (
            server_on(
                backend, root, slots, SANDBOX_MCP_WARM_PREPARED="0",
                SANDBOX_MCP_LABEL_PREFIX=before_prefix, **common,
            ) as before,
            server_on(
                backend, root, slots, SANDBOX_MCP_WARM_PREPARED="1",
                SANDBOX_MCP_LABEL_PREFIX=after_prefix, **common,
            ) as after,
        ):  # fmt: skip
            async with httpx2.AsyncClient(timeout=120) as http:
                floor: list[float] = []
                before_t: list[tuple[float, float]] = []
                after_t: list[tuple[float, float]] = []
                for sample in range(samples):
                    users = [await new_user(http, before), await new_user(http, after)]
                    await first_output(http, before, users[0])
                    await first_output(http, after, users[1])
                    for n in (2, 3, 4):
                        floor.append(
                            await asyncio.to_thread(hardened_floor, api, floor_ws, floor_labels)
                        )
                        before_t.append(await next_output(http, before, users[0], n))
                        # This sandbox's one is made in the background after its last create.
                        await asyncio.to_thread(wait_prepared, api, after_prefix, sample + 1)
                        after_t.append(await next_output(http, after, users[1], n))
                print(
                    f"[{backend}] a sandbox's 2nd-4th create_experiment (13 files) + first "
                    f"output, {samples} sandboxes, {len(floor)} samples"
                )
                for name, got in (("before", before_t), ("after", after_t)):
                    print(row(f"{name}: create", [c for c, _ in got], floor))
                    print(row(f"{name}: first command", [t - c for c, t in got], floor))
                    print(row(f"{name}: create + first output", [t for _, t in got], floor))
                await asyncio.to_thread(wait_prepared, api, after_prefix, samples)
                found = api.containers(filters={"label": f"{after_prefix}.prepared=1"})
                waiting = [c["Id"] for c in found if "smcp-prepared-" in c["Names"][0]]
                if waiting:
                    print(
                        f"  idle prepared container {waiting[0][:12]}: {memory_of(api, waiting[0])}"
                    )
    finally:
        for prefix in (before_prefix, after_prefix):
            remove_containers(api, prefix)
        api.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--backends", default="dir,zfs")
    parser.add_argument("--parts", default="first,next")
    args = parser.parse_args()
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as root:
        for backend in args.backends.split(","):
            if "first" in parts:
                await bench(backend, args.samples, Path(root))
            if "next" in parts:
                await bench_next(backend, args.samples, Path(root))


if __name__ == "__main__":
    asyncio.run(main())
