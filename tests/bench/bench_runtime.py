"""Benchmark: what does DockerBackend cost on top of the plain Docker SDK?

    uv run python tests/bench/bench_runtime.py [--samples 20] [--image sandbox-mcp/python:3]

Prints, in one run (samples interleaved, so drift hits both sides alike):

1. Start-up: the raw SDK floor (``create_container`` + ``start`` + an exec of
   ``true``, waited for) against ``DockerBackend.create`` + the output of a first
   ``run("true")``. Two floors: a plain container, and one with the very same
   hardened host config (which isolates the cost of our code from the cost of
   the hardening itself). p50 and p95, and the p50 ratios.
2. One command: ``DockerBackend.run("true")`` on both exec paths (the fast one
   through the container's executor, and ``docker exec``) against the SDK's
   ``Container.exec_run("true")`` in the same container (p50, p95, p50 ratios),
   and the fast path's own floor (the executor spawning ``/bin/true`` directly).
3. Twenty sandboxes at once: create 20, run a command in each, remove them,
   all concurrently (wall time of each phase, errors); and, as a floor, the raw
   SDK creating, starting and exec'ing 20 hardened containers from 20 threads.

Needs a reachable Docker engine and the sandbox images (deploy/build-base-image).
Everything it creates carries a label unique to the run and is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import structlog
from _bench_servers import hardened_host_config

from app.runtime.backend import ContainerSpec, Limits
from app.runtime.backends.docker import DockerBackend
from pool.slots import SlotsAt

UID = 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def line(name: str, values: list[float]) -> str:
    p50, p95 = pct(values, 0.5) * 1000, pct(values, 0.95) * 1000
    return f"  {name:<44} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms"


def raw_start(
    api: docker.APIClient, image: str, labels: dict[str, str], host_config: object
) -> str:
    created = api.create_container(
        image,
        entrypoint=["sleep", "infinity"],
        user="1000:1000",
        labels=labels,
        host_config=host_config,
    )
    api.start(created["Id"])
    exec_id = api.exec_create(created["Id"], ["true"], user="1000:1000")["Id"]
    api.exec_start(exec_id)
    assert api.exec_inspect(exec_id)["ExitCode"] == 0
    return str(created["Id"])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--image", default="sandbox-mcp/python:3")
    parser.add_argument("--concurrent", type=int, default=20)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))

    run = uuid.uuid4().hex[:8]
    prefix = f"io.sandbox-mcp-bench-{run}"
    labels = {f"{prefix}.managed": "1"}
    client = docker.from_env(timeout=120)
    api = client.api
    slots = Path(tempfile.mkdtemp(prefix="bench-runtime-"))

    def workspace() -> Path:
        path = slots / f"slot-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        os.chown(path, UID, UID)
        return path

    backend = DockerBackend(
        slots=SlotsAt(slots),
        allowed_images=(args.image,),
        label_prefix=prefix,
        client_factory=lambda: docker.from_env(timeout=120),
        max_containers=args.concurrent + 10,
    )
    slow = DockerBackend(
        slots=SlotsAt(slots),
        allowed_images=(args.image,),
        label_prefix=prefix,
        client_factory=lambda: docker.from_env(timeout=120),
        exec_path="docker-exec",
    )
    print(f"engine {api.version()['Version']}, image {args.image}, {args.samples} samples")
    try:
        await backend.info()  # the client and its API-version probe, outside the timings
        raw_plain: list[float] = []
        raw_hard: list[float] = []
        ours: list[float] = []
        for _ in range(args.samples):
            started = time.perf_counter()
            cid = raw_start(api, args.image, labels, api.create_host_config(init=True))
            raw_plain.append(time.perf_counter() - started)
            api.remove_container(cid, force=True)

            ws = workspace()
            started = time.perf_counter()
            cid = raw_start(api, args.image, labels, hardened_host_config(api, ws))
            raw_hard.append(time.perf_counter() - started)
            api.remove_container(cid, force=True)

            spec = ContainerSpec("bench", "fp", args.image, workspace(), limits=Limits())
            started = time.perf_counter()
            container = await backend.create(spec)
            result = await backend.run(container.container_id, "true", timeout_s=60, job_id="j")
            ours.append(time.perf_counter() - started)
            assert result.exit_code == 0, result
            await backend.remove(container.container_id)

        print("\n1. start-up: container up and a first command's result back")
        print(line("raw SDK floor, plain container", raw_plain))
        print(line("raw SDK floor, same hardened host config", raw_hard))
        print(line("DockerBackend.create + first run", ours))
        p50 = statistics.median(ours)
        print(f"  ratio p50 vs hardened floor: {p50 / statistics.median(raw_hard):.2f}x")
        print(f"  ratio p50 vs plain floor:    {p50 / statistics.median(raw_plain):.2f}x")

        container = await backend.create(
            ContainerSpec("bench", "fp", args.image, workspace(), limits=Limits())
        )
        cid = container.container_id
        assert await backend.fast_exec_ready(cid), "the executor did not start"
        model = client.containers.get(cid)
        raw_exec: list[float] = []
        slow_exec: list[float] = []
        fast_exec: list[float] = []
        bare: list[float] = []
        session = backend._exec._fast.session(cid) if backend._exec._fast else None
        assert session is not None
        fast_before = backend.exec_runs["fast"]  # the first runs above may have used it too
        try:
            for i in range(args.samples):
                started = time.perf_counter()
                exit_code, _ = model.exec_run("true", user="1000:1000")
                raw_exec.append(time.perf_counter() - started)
                assert exit_code == 0
                started = time.perf_counter()
                result = await slow.run(cid, "true", timeout_s=60, job_id=f"s{i}")
                slow_exec.append(time.perf_counter() - started)
                assert result.exit_code == 0, result
                started = time.perf_counter()
                result = await backend.run(cid, "true", timeout_s=60, job_id=f"t{i}")
                fast_exec.append(time.perf_counter() - started)
                assert result.exit_code == 0, result
                # The executor's own floor: /bin/true spawned directly, without the
                # job's subreaper and supervisor (what those cost).
                started = time.perf_counter()
                request_id = await session.submit(["/bin/true"], None, 1024)
                await session.pending(request_id).done.wait()
                bare.append(time.perf_counter() - started)
                session.forget(request_id)
        finally:
            await backend.remove(cid)
        assert backend.exec_runs["fast"] - fast_before == args.samples, backend.exec_runs
        print("\n2. one command, `true`, in a running container")
        print(line("floor: raw Container.exec_run('true')", raw_exec))
        print(line("DockerBackend.run('true'), docker exec path", slow_exec))
        print(line("DockerBackend.run('true'), fast path", fast_exec))
        print(line("floor of the fast path: executor runs /bin/true", bare))
        floor = statistics.median(raw_exec)
        print(
            f"  ratio p50, docker exec path vs floor: {statistics.median(slow_exec) / floor:.2f}x"
        )
        print(
            f"  ratio p50, fast path vs floor:        {statistics.median(fast_exec) / floor:.2f}x"
        )

        n = args.concurrent
        started = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            raw_ids = list(
                pool.map(
                    lambda _: raw_start(
                        api, args.image, labels, hardened_host_config(api, workspace())
                    ),
                    range(n),
                )
            )
        raw_up_s = time.perf_counter() - started
        for cid in raw_ids:
            api.remove_container(cid, force=True)

        errors: list[BaseException] = []
        started = time.perf_counter()
        made = await asyncio.gather(
            *(
                backend.create(ContainerSpec(f"c{i}", "fp", args.image, workspace()))
                for i in range(n)
            ),
            return_exceptions=True,
        )
        created_s = time.perf_counter() - started
        boxes = [c for c in made if not isinstance(c, BaseException)]
        errors += [c for c in made if isinstance(c, BaseException)]
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                backend.run(
                    box.container_id,
                    f"python3 -c 'print(sum(range({i} * 1000)))'",
                    timeout_s=120,
                    job_id=f"c{i}",
                )
                for i, box in enumerate(boxes)
            ),
            return_exceptions=True,
        )
        ran_s = time.perf_counter() - started
        errors += [r for r in results if isinstance(r, BaseException)]
        bad = [r for r in results if not isinstance(r, BaseException) and r.exit_code != 0]
        started = time.perf_counter()
        await asyncio.gather(*(backend.remove(b.container_id) for b in boxes))
        removed_s = time.perf_counter() - started
        print(f"\n3. {n} sandboxes at once")
        print(f"  raw SDK floor, {n} threads (create+start+exec true): {raw_up_s:6.2f} s")
        print(f"  create {len(boxes)}/{n}: {created_s:6.2f} s")
        print(f"  run a python3 command in each: {ran_s:6.2f} s  (non-zero exits: {len(bad)})")
        print(f"  remove all: {removed_s:6.2f} s")
        print(f"  errors: {len(errors)} {[type(e).__name__ for e in errors]}")
    finally:
        for c in api.containers(all=True, quiet=True, filters={"label": f"{prefix}.managed=1"}):
            api.remove_container(c["Id"], force=True)
        await backend.aclose()
        await slow.aclose()
        client.close()
        shutil.rmtree(slots)


if __name__ == "__main__":
    asyncio.run(main())
