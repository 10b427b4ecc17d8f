"""Benchmark: a 5,000-file project, create_experiment (project_path) to first output and
destroy_experiment, beside the floors measured in the same run: a host copy of the
5,000 files (``cp -a``) and the removal of a container. On the dir and zfs backends.

    source /tmp/dev/env.sh
    uv run python tests/bench/bench_big_projects.py [--samples 6] [--backends dir,zfs]

A local-mode server (project_path is refused when hosted). Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import docker
import httpx2
from _bench_servers import IMAGE, row, server_on
from mcp_http import run_command, tool

FOLDERS, PER_FOLDER = 50, 100


def make_project(root: Path) -> None:
    for d in range(FOLDERS):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(PER_FOLDER):
            (root / f"d{d}" / f"f{f}.py").write_text(f"VALUE = {d * PER_FOLDER + f}\n" * 5)


def host_copy(source: Path, target: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["cp", "-a", "--no-target-directory", str(source), str(target)], check=True)
    return time.perf_counter() - started


def container_removal(api: docker.APIClient, labels: dict[str, str]) -> float:
    created = api.create_container(
        IMAGE, entrypoint=["sleep", "infinity"], labels=labels,
        host_config=api.create_host_config(init=True, network_mode="none"),
    )  # fmt: skip
    api.start(created["Id"])
    started = time.perf_counter()
    api.remove_container(created["Id"], force=True)
    return time.perf_counter() - started


async def bench(backend: str, samples: int, root: Path, project: Path) -> None:
    api = docker.from_env(timeout=120).api
    labels = {f"io.sandbox-mcp-bench-big-{uuid.uuid4().hex[:6]}.managed": "1"}
    with server_on(
        backend, root, 1, SANDBOX_MCP_AUTH="none", SANDBOX_MCP_WARM_CONTAINERS="0"
    ) as server:
        async with httpx2.AsyncClient(timeout=300) as http:
            copy, created, removal, destroyed = [], [], [], []
            for sample in range(samples):
                target = root / f"copy-{backend}-{sample}"
                copy.append(await asyncio.to_thread(host_copy, project, target))
                started = time.perf_counter()
                made = await tool(
                    http, server, "", "create_experiment", {"project_path": str(project)}
                )
                ran = await run_command(http, server, "", made["experiment_id"], "ls | wc -l")
                took = time.perf_counter() - started
                assert ran["stdout"].strip() == str(FOLDERS), (made, ran)
                removal.append(await asyncio.to_thread(container_removal, api, labels))
                started = time.perf_counter()
                gone = await tool(
                    http, server, "", "destroy_experiment", {"experiment_id": made["experiment_id"]}
                )
                destroyed.append(time.perf_counter() - started)
                assert gone["state"] == "DESTROYED", gone
                if sample:  # the first is a warm-up (imports, the Docker client)
                    created.append(took)
                else:
                    copy.pop(0), removal.pop(0), destroyed.pop(0)
            print(f"[{backend}] 5,000-file project, {len(created)} samples")
            print(row("create to first output (floor: cp -a)", created, copy))
            print(row("destroy_experiment (floor: docker rm -f)", destroyed, removal))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--backends", default="dir,zfs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-big-") as folder:
        root = Path(folder)
        make_project(root / "project")
        for backend in args.backends.split(","):
            await bench(backend, args.samples, root, root / "project")


if __name__ == "__main__":
    asyncio.run(main())
