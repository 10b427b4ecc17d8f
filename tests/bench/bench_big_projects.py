"""Benchmark: a 5,000-file project, create_experiment (project_path) to first output and
destroy_experiment, beside the floors measured in the same run: a host copy of the
5,000 files (``cp -a``) and the removal of a container. On the dir and zfs backends.

    source /tmp/dev/env.sh
    uv run python tests/bench/bench_big_projects.py [--samples 6] [--backends dir,zfs]

A local-mode server (project_path is refused when hosted). Prints, asserts nothing.

Measured (2 cores, 2026-12-06; p50, the floor in brackets, ratio to it):

- Before the baseline pack (a705c0c, 07:01 UTC, load about 7, 5 samples):
  dir  create 829 ms (cp -a 219, 3.79)   destroy 163 ms (docker rm -f 74, 2.20)
  zfs  create 4,344 ms (cp -a 233, 18.65) destroy 578 ms (docker rm -f 68, 8.54)
- After (07:28-07:52 UTC, load 12 to 19 from other runs outside the bench lock, zfs-fuse
  shared with them; dir 5 samples, zfs 3):
  dir  create 1,994 ms (cp -a 655, 3.05)  destroy 393 ms (docker rm -f 241, 1.63)
  zfs  create 68,277 ms (cp -a 1,336, 51)  destroy 341 ms (docker rm -f 149, 2.28)
  The zfs create is that load's, not the pack's: in the same minutes a bare copy of
  500 files onto a fresh dataset took 14.7 to 26.1 s with the old mirror baseline,
  6.2 to 9.3 s with the pack and 6.9 s with no baseline at all. A quiet rerun is owed.

Where the time went (strace of one 5,000-file copy with its baseline): the mirror made
every file twice, 10,000 creates, 10,000 copy_file_range (one a read back of the
first copy), 5,100 fchmod, 10,100 utimensat; with the pack 5,000 creates, 5,000
pwrite, 50 fchmod (the folders'), 5,050 utimensat and three writes of the pack. No
hashing and no fsync on the path. On zfs-fuse each of those is a round trip to a
daemon in user space, so the baseline cost as much as the workspace, and its destroy
deleted 10,000 files instead of 5,000 and one pack. ZFS snapshots are cheap here
(17 ms) but zfs-fuse has no .zfs folder: reading one takes a clone (42 ms, a mount,
and zfs-fuse's "dataset is busy" on destroy), so the pack serves both backends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    with contextlib.closing(docker.from_env(timeout=120)) as engine:
        prefix = f"io.sandbox-mcp-bench-big-{uuid.uuid4().hex[:6]}"
        try:
            await _bench(engine.api, prefix, backend, samples, root, project)
        finally:  # whatever a failed run left, the server's and the floor's
            for found in engine.api.containers(all=True, filters={"label": f"{prefix}.managed"}):
                engine.api.remove_container(found["Id"], force=True)


async def _bench(
    api: docker.APIClient, prefix: str, backend: str, samples: int, root: Path, project: Path
) -> None:
    labels = {f"{prefix}.managed": "1"}
    with server_on(
        backend,
        root,
        1,
        SANDBOX_MCP_AUTH="none",
        SANDBOX_MCP_WARM_CONTAINERS="0",
        SANDBOX_MCP_LABEL_PREFIX=prefix,
    ) as server:
        async with httpx2.AsyncClient(timeout=300) as http:
            copy, created, removal, destroyed, settled = [], [], [], [], []
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
                # What goes on after the answer (the container's removal, the change
                # size, the folder's deletion) must not weigh on the next sample.
                while "changes_pending" in (gone.get("findings") or {}):
                    await asyncio.sleep(0.05)
                    gone = await tool(
                        http, server, "", "get_experiment", {"experiment_id": made["experiment_id"]}
                    )
                settled.append(time.perf_counter() - started)
                await asyncio.sleep(1.5)
                if sample:  # the first is a warm-up (imports, the Docker client)
                    created.append(took)
                else:
                    copy.pop(0), removal.pop(0), destroyed.pop(0), settled.pop(0)
            print(f"[{backend}] 5,000-file project, {len(created)} samples")
            print(row("create to first output (floor: cp -a)", created, copy))
            print(row("destroy_experiment (floor: docker rm -f)", destroyed, removal))
            print(row("  until the change size is recorded", settled, removal))


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
