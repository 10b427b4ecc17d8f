"""Benchmark: how many container creations at once the engine serves best.

M hardened containers (the server's own HostConfig, the default image) are created and
started by K workers through the Docker SDK, for several K; prints the time to the
last start, the containers started per second and the p50 latency of one create +
start. The engine has locks of its own (its container store, the network namespace,
runc): past some K the extra workers only queue inside it, and each request then
waits longer for the same throughput. The runtime's ``SANDBOX_MCP_ENGINE_CREATES``
default comes from here.

    uv run python tests/bench/bench_engine_concurrency.py [--containers 32] [--workers 1,2,4,8]

Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import queue
import tempfile
import threading
import time
import uuid
from pathlib import Path

import docker
from _bench_servers import IMAGE, hardened_host_config, pct


def run(api: docker.APIClient, root: Path, containers: int, workers: int) -> None:
    labels = {f"io.sandbox-mcp-bench-engine-{uuid.uuid4().hex[:6]}.managed": "1"}
    todo: queue.Queue[int] = queue.Queue()
    for i in range(containers):
        todo.put(i)
    latencies: list[float] = []
    made: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            workspace = root / f"k{workers}-{i}"
            workspace.mkdir()
            started = time.perf_counter()
            created = api.create_container(
                IMAGE, entrypoint=["sleep", "infinity"], user="1000:1000", labels=labels,
                host_config=hardened_host_config(api, workspace),
            )  # fmt: skip
            api.start(created["Id"])
            with lock:
                latencies.append(time.perf_counter() - started)
                made.append(created["Id"])

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    print(
        f"  {workers:>3} at once: {containers} started in {wall:6.2f} s"
        f" ({containers / wall:5.1f}/s), one create + start p50 {pct(latencies, 0.5):5.2f} s"
        f" p95 {pct(latencies, 0.95):5.2f} s"
    )
    for container_id in made:
        api.remove_container(container_id, force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--containers", type=int, default=32)
    parser.add_argument("--workers", default="1,2,4,8,16,32")
    args = parser.parse_args()
    client = docker.from_env(timeout=300, max_pool_size=64)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-engine-") as root:
            print(f"hardened create + start of {args.containers} containers ({IMAGE})")
            for workers in (int(k) for k in args.workers.split(",")):
                run(client.api, Path(root), args.containers, workers)
    finally:
        client.close()


if __name__ == "__main__":
    main()
