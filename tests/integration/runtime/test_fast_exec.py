"""The fast exec path against the real engine: what only it can get wrong.

The runtime suite (test_docker_backend.py) runs on both paths; here: a command sees
the same world on both, the executor's death (by the sandbox's hand, by garbage on
its stream, by the server process dying) costs nothing beyond the commands it ran,
another process can still kill a fast-path job, and an image the executor cannot
run in falls back to ``docker exec``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from docker_testkit import BACKEND_PREFIX, docker_client, engine_events, new_workspace
from process_table import PS, parse, split

import app.runtime.exec.sessions as executors
from app.runtime.backend import ContainerSpec, ExecResult, Limits
from app.runtime.backends.docker import DockerBackend
from app.runtime.errors import ExecutorStopped
from app.runtime.exec.protocol import ENDED
from pool.slots import SlotsAt

pytestmark = pytest.mark.integration

IMAGE = "sandbox-mcp/python:3"
PREFIX = f"{BACKEND_PREFIX}-fast"
TAG = 4343
ROOT = Path(__file__).parents[3]


def _backend(slots: Path, exec_path: str) -> DockerBackend:
    return DockerBackend(
        slots=SlotsAt(slots),
        allowed_images=(IMAGE,),
        label_prefix=PREFIX,
        client_factory=docker_client,
        kill_grace_s=10,
        exec_path=exec_path,  # type: ignore[arg-type]
    )


@pytest.fixture
def slots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fast-slots")
    os.chmod(path, 0o755)
    return path


@pytest.fixture
async def fast(slots: Path, engine: docker.DockerClient) -> AsyncIterator[DockerBackend]:
    backend = _backend(slots, "auto")
    yield backend
    await backend.aclose()


@pytest.fixture
async def slow(slots: Path) -> AsyncIterator[DockerBackend]:
    """Another server process, as far as the container is concerned: docker exec only."""
    backend = _backend(slots, "docker-exec")
    yield backend
    await backend.aclose()


@pytest.fixture
async def container(fast: DockerBackend, slots: Path) -> AsyncIterator[str]:
    spec = ContainerSpec(
        f"exp-{uuid.uuid4().hex[:8]}", "fp-fast", IMAGE, new_workspace(slots), limits=Limits()
    )
    made = await fast.create(spec)
    assert await fast.fast_exec_ready(made.container_id)
    yield made.container_id
    await fast.remove(made.container_id)


async def run(backend: DockerBackend, container_id: str, command: str, **kw: object) -> ExecResult:
    timeout = kw.pop("timeout_s", 60)
    return await backend.run(
        container_id, command, timeout_s=timeout, job_id=f"j-{uuid.uuid4().hex[:8]}", **kw
    )  # type: ignore[arg-type]


async def tagged(backend: DockerBackend, container_id: str) -> list[str]:
    ps = await run(backend, container_id, "ps -eo args=")
    return [line for line in ps.stdout.splitlines() if str(TAG) in line and "ps -eo" not in line]


# How long a poll below waits for the engine's side of things to show (a process
# started or gone, an executor replaced): generous, as it takes far longer on a
# busy machine than on a quiet one, and a verdict must not depend on that.
POLL_S = 90


async def until_gone(backend: DockerBackend, container_id: str) -> list[str]:
    """Our tagged processes, once gone (or as they are after POLL_S)."""
    deadline = time.monotonic() + POLL_S
    while True:
        left = await tagged(backend, container_id)
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(0.2)


async def executor_pids(slow: DockerBackend, container_id: str) -> list[int]:
    found = await run(slow, container_id, "grep -l '^smcp-executor$' /proc/[0-9]*/comm")
    return [int(p.split("/")[2]) for p in found.stdout.split()]


async def executor_pid(slow: DockerBackend, container_id: str) -> int:
    pids = await executor_pids(slow, container_id)
    assert len(pids) == 1, pids
    return pids[0]


SAME_WORLD = (
    "env | grep -v '^PWD=' | sort; id; pwd; umask; ulimit -a; "
    "grep -E '^(Cap|NoNewPrivs|Seccomp|Groups)' /proc/self/status; "
    "cat /proc/self/cgroup; ls /proc/$$/fd; "
    "readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2 | sed 's/[0-9]//g'"
)


async def test_a_command_sees_the_same_world_on_both_paths(
    fast: DockerBackend, slow: DockerBackend, container: str
) -> None:
    env = {"GREETING": "hi", "PATH": "/workspace/bin:/usr/bin:/bin"}
    on_fast = await run(fast, container, SAME_WORLD, env=env)
    on_slow = await run(slow, container, SAME_WORLD, env=env)
    assert fast.exec_runs == {"fast": 1}
    assert slow.exec_runs == {"docker-exec": 1}
    assert on_fast.exit_code == on_slow.exit_code == 0, (on_fast, on_slow)
    assert on_fast.stdout == on_slow.stdout
    assert on_fast.stderr == on_slow.stderr
    assert "GREETING=hi" in on_fast.stdout
    assert "uid=1000" in on_fast.stdout
    # Exit codes, a signal's included (128 + signal, as docker exec reports it).
    for command in ("exit 3", "kill -TERM $$", "exec sleep 0 | false"):
        codes = [(await run(b, container, command)).exit_code for b in (fast, slow)]
        assert codes[0] == codes[1], (command, codes)


async def test_the_first_command_of_a_new_container_waits_for_its_executor(
    fast: DockerBackend, slots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It comes while the executor starts: a docker exec beside that start cost more
    than waiting for it (issue 13's cold first output)."""
    monkeypatch.setattr(executors, "FIRST_COMMAND_WAIT_S", 60)  # the start's end, not a clock
    spec = ContainerSpec(
        f"exp-{uuid.uuid4().hex[:8]}", "fp-fast", IMAGE, new_workspace(slots), limits=Limits()
    )
    made = await fast.create(spec)
    try:
        first = await run(fast, made.container_id, "echo first")
        assert first.stdout == "first\n", first
        assert fast.exec_runs == {"fast": 1}
    finally:
        await fast.remove(made.container_id)


async def test_concurrent_first_commands_share_one_executor_start(
    fast: DockerBackend, slots: Path, engine: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new container's first commands, all arriving while its executor starts, share that
    one start: one executor per container (issue 27 suspected a second one)."""
    monkeypatch.setattr(executors, "FIRST_COMMAND_WAIT_S", 60)  # the start's end, not a clock
    # The start is held until every command has asked for the executor, so all of them
    # come while it is under way, however the machine schedules them.
    commands = 8
    asked = 0
    everyone_asked = threading.Event()
    prepare, open_stream = executors.Executors.prepare, executors._open_stream

    def counted(self: executors.Executors, container_id: str) -> None:
        nonlocal asked
        asked += 1
        prepare(self, container_id)
        if asked == 1 + commands:  # the create's, then each command's
            everyone_asked.set()

    def held(*args: object) -> object:
        assert everyone_asked.wait(120), "the commands never all asked for the executor"
        return open_stream(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(executors.Executors, "prepare", counted)
    monkeypatch.setattr(executors, "_open_stream", held)
    since = int(time.time()) - 1
    spec = ContainerSpec(
        f"exp-{uuid.uuid4().hex[:8]}", "fp-fast", IMAGE, new_workspace(slots), limits=Limits()
    )
    made = await fast.create(spec)  # asks once
    try:
        running = [
            asyncio.create_task(run(fast, made.container_id, f"echo {n}")) for n in range(commands)
        ]
        results = await asyncio.gather(*running)
        assert [r.stdout for r in results] == [f"{n}\n" for n in range(commands)]
        assert fast.exec_runs == {"fast": commands}
        # The engine started one executor, and one runs.
        creates = engine_events(
            engine,
            since=since,
            until=int(time.time()) + 1,
            filters={"container": made.container_id, "event": "exec_create"},
        )
        boots = [e for e in creates if " ".join(executors.AGENT_ARGV) in e.get("Action", "")]
        assert len(boots) == 1, creates
        table = split(parse((await run(fast, made.container_id, PS)).stdout), fast=True)
        assert table.starting == []
    finally:
        everyone_asked.set()
        await fast.remove(made.container_id)


async def test_a_job_the_executor_is_starting_is_not_a_second_executor(
    fast: DockerBackend, container: str
) -> None:
    """Between its fork and its exec, a job the executor starts shows the executor's
    command line (issue 27: a loaded CI run's `ps`, beside a starting job, counted two
    executors). Jobs start without pause beside snapshots of the process table until
    one was caught starting (bounded in time, never by speed): every snapshot holds
    exactly one executor, and the caught job is its child (process_table.split)."""
    stop = asyncio.Event()

    async def spawn() -> None:
        while not stop.is_set():
            assert (await run(fast, container, "true")).exit_code == 0

    spawners = [asyncio.create_task(spawn()) for _ in range(3)]
    caught = snapshots = 0
    deadline = time.monotonic() + 180
    try:
        while not caught and time.monotonic() < deadline:
            # Many snapshots per command: a job is in that state for microseconds.
            many = await run(fast, container, f"for i in $(seq 50); do {PS}; echo --; done")
            for snapshot in filter(None, many.stdout.split("--\n")):
                snapshots += 1
                caught += len(split(parse(snapshot), fast=True).starting)
    finally:
        stop.set()
        await asyncio.gather(*spawners)
    assert caught, f"no job was caught starting in {snapshots} snapshots: the race never ran"
    # Once the jobs are done, the executor is alone (nothing outlived them).
    table = split(parse((await run(fast, container, PS)).stdout), fast=True)
    assert table.starting == []
    assert [p.args for p in table.rest if PS not in p.args] == [
        "/sbin/docker-init -- sleep infinity",
        "sleep infinity",
    ]


async def test_an_executor_killed_by_the_sandbox_falls_back_and_comes_back(
    fast: DockerBackend, slow: DockerBackend, container: str
) -> None:
    running = asyncio.create_task(run(fast, container, f"sleep {TAG}; echo never"))
    deadline = time.monotonic() + POLL_S
    while True:
        if await tagged(slow, container) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    pid = await executor_pid(slow, container)
    killed = await run(slow, container, f"kill -KILL {pid}")  # the sandbox's own uid can
    assert killed.exit_code == 0, killed
    with pytest.raises(ExecutorStopped) as stopped:
        await asyncio.wait_for(running, 60)
    assert stopped.value.details["reason"] == ENDED
    # Its job did not run on unobserved (killed through docker exec)...
    assert await until_gone(slow, container) == []
    # ...the next command still runs (docker exec while a new executor starts)...
    assert (await run(fast, container, "echo still")).stdout == "still\n"
    # ...and a new executor serves the ones after.
    assert await fast.fast_exec_ready(container)
    before = fast.exec_runs["fast"]
    assert (await run(fast, container, "echo fast")).stdout == "fast\n"
    assert fast.exec_runs["fast"] == before + 1


async def test_garbage_on_the_executors_stream_drops_it_and_nothing_else(
    fast: DockerBackend, slow: DockerBackend, container: str
) -> None:
    pid = await executor_pid(slow, container)
    # Sandbox code can open the executor's stdout and write to the server through it.
    forged = await run(slow, container, f"echo 'not an answer' > /proc/{pid}/fd/1")
    assert forged.exit_code == 0, forged
    # The garbled stream ended that executor (its stdin closed, it exited), and a new
    # one took its place (started by the next command, which ran on docker exec).
    assert (await run(fast, container, "echo ok")).stdout == "ok\n"
    deadline = time.monotonic() + POLL_S
    while True:
        now = await executor_pids(slow, container)
        if (now and pid not in now) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    assert len(now) == 1, now
    assert pid not in now
    assert fast.exec_runs == {"docker-exec": 1}
    assert await fast.fast_exec_ready(container)
    assert (await run(fast, container, "echo fast")).stdout == "fast\n"
    assert fast.exec_runs == {"docker-exec": 1, "fast": 1}


async def test_another_process_can_kill_a_fast_path_job(
    fast: DockerBackend, slow: DockerBackend, container: str
) -> None:
    announced: asyncio.Queue[tuple[int, int]] = asyncio.Queue()

    async def on_start(pids: tuple[int, int]) -> None:
        await announced.put(pids)

    tree = f"sleep {TAG}1 & (setsid sh -c 'sleep {TAG}2 &'); sleep {TAG}0"
    running = asyncio.create_task(run(fast, container, tree, on_start=on_start))
    pids = await asyncio.wait_for(announced.get(), POLL_S)
    # The docker exec killer, from a process that does not run the job.
    assert await slow.kill_tree(container, pids) is True
    result = await asyncio.wait_for(running, 60)
    assert result.exit_code == 137, result
    assert await until_gone(slow, container) == []
    assert await slow.kill_tree(container, pids) is False
    assert fast.exec_runs == {"fast": 1}


async def test_when_the_server_process_dies_its_executor_kills_its_jobs(
    slow: DockerBackend, container: str, slots: Path
) -> None:
    # A second server process runs a tree through its own executor, then dies (kill -9).
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests" / "support")!r}]
        from docker_testkit import docker_client
        from app.runtime.backends.docker import DockerBackend
        from pool.slots import SlotsAt

        async def main():
            backend = DockerBackend(
                slots=SlotsAt({str(slots)!r}), allowed_images=({IMAGE!r},),
                label_prefix={PREFIX!r}, client_factory=docker_client,
            )
            assert await backend.fast_exec_ready({container!r})
            async def started(pids):
                print("SMCP-STARTED", flush=True)
            await backend.run(
                {container!r}, "sleep {TAG}1 & nohup sleep {TAG}2 & sleep {TAG}0",
                timeout_s=600, job_id="doomed", on_start=started,
            )

        asyncio.run(main())
        """
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            while (line := await process.stdout.readline()) != b"SMCP-STARTED\n":
                assert line, "the second server process ended before its job started"
        deadline = time.monotonic() + POLL_S
        while True:
            if len(await tagged(slow, container)) >= 3 or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.1)
        assert len(await tagged(slow, container)) >= 3
    finally:
        process.kill()
        await process.wait()
    # Its stream closed with it: its executor killed the whole tree and exited.
    assert await until_gone(slow, container) == []
    deadline = time.monotonic() + POLL_S
    while True:
        left = await run(slow, container, "grep -l '^smcp-executor$' /proc/[0-9]*/comm")
        # Only the executor of `fast` is left.
        if len(left.stdout.split()) == 1 or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.2)
    assert len(left.stdout.split()) == 1, left


async def test_an_image_the_executor_cannot_run_in_uses_docker_exec(
    fast: DockerBackend, slots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in an image without /usr/bin/python3: the executor's exec fails at start.
    monkeypatch.setattr(executors, "AGENT_ARGV", ["/usr/bin/no-such-python3", "-c", "pass"])
    spec = ContainerSpec("exp-nopy", "fp-fast", IMAGE, new_workspace(slots))
    made = await fast.create(spec)
    try:
        assert await fast.fast_exec_ready(made.container_id) is False
        result = await run(fast, made.container_id, "echo via docker exec")
        assert result.stdout == "via docker exec\n"
        assert fast.exec_runs == {"docker-exec": 1}
        # Not retried for every command: that container stays on docker exec.
        assert await fast.fast_exec_ready(made.container_id) is False
    finally:
        await fast.remove(made.container_id)
