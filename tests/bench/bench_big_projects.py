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
- Same run under the bench lock, 10:31-10:35 UTC, load 4.8 falling to 1.7, 5 samples
  each, in this order (p50 / p95 ms, floor p50 in brackets):
  after (1cf52c2; e4d41ae before the rebase): the pack; the removal, the change size
  and the deletion after the answer
  dir  create 2,180 / 2,601 (cp -a 676)    destroy 32 / 46 (docker rm -f 62)
  zfs  create 1,742 / 2,129 (cp -a 940)    destroy 42 / 51 (docker rm -f 58)
       the change size recorded 204 / 243 (dir), 287 / 327 (zfs) after the call
       (polled every 50 ms with get_experiment)
  the pack and the removal after the answer, the walk still on the call (23460c1;
  589ff22 before the rebase)
  dir  create 2,592 / 2,659 (cp -a 1,816)  destroy 169 / 193 (docker rm -f 84)
  zfs  create 1,949 / 2,046 (cp -a 1,675)  destroy 173 / 182 (docker rm -f 62)
  before (main 023a873: a second tree as the baseline, all on the call)
  dir  create 4,295 / 4,445 (cp -a 2,295)  destroy 177 / 200 (docker rm -f 71)
  zfs  create 3,659 / 3,955 (cp -a 2,557)  destroy 543 / 986 (docker rm -f 70)
  The cp -a floor of the same 5,000 files moved from 0.4 to 2.6 s between minutes
  (the host's disk is shared), so the create ratios are loose; the destroys are not.
  An earlier run (10:24-10:27, load 31 falling to 4) gave destroy 164 (dir) and
  498 ms (zfs) before, 43 and 36 ms after.
- Where a destroy's time went (instrumented, quiet, dir / zfs): before, the walk of
  workspace and baseline tree 83-139 / 281-304 ms beside the container's removal,
  then 10 ms of records; with the pack the walk is 50-57 / 74-79 ms and the removal
  52-139 ms, side by side they still made 170 ms; with both after the answer the call
  is the records alone: get 1-5, evidence from the database 4-31, the rename 1,
  the transition 3-8, the view 4-27 ms.

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
