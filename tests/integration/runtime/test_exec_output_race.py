"""A fresh container's first command keeps its output, however late the server reads it.

Found in a benchmark under heavy load: ``python3 main.py`` (which prints a line) came
back with exit code 0 and no output, once in 23 samples, from a freshly created
container. Its first command goes through ``docker exec`` (its executor is still
starting), and ``exec start`` answers ``101 UPGRADED`` and then writes the command's
output on the same connection: when the thread that reads the answer comes late (a
loaded machine, a busy interpreter), the answer's headers and the output's first
frames are read together into the HTTP parser's buffer, which docker-py bypassed
(docker/docker-py#3332): the output, and W's announcement with it, were lost.

The first test forces that interleaving (the answer is only read once the output is
on the socket); the second creates fresh containers and runs their first command at
once, on both exec paths, while the test itself keeps the interpreter and the CPUs
busy (the load that showed the bug).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import urllib3.connection
from docker_testkit import BACKEND_PREFIX, backend_on_engine, new_workspace

from app.runtime.backend import ContainerSpec
from app.runtime.backends.docker import DockerBackend
from jail import Jail
from pool.slots import SlotsAt

pytestmark = pytest.mark.integration

IMAGE = "sandbox-mcp/python:3"
PREFIX = f"{BACKEND_PREFIX}-race"
MAIN = b"print('hi from main')\n"
UPGRADED = b"HTTP/1.1 101 UPGRADED"


@pytest.fixture(params=["docker-exec", "auto"], ids=["docker-exec", "fast"])
async def backend(
    engine: docker.DockerClient, slots: Path, request: pytest.FixtureRequest
) -> AsyncIterator[DockerBackend]:
    backend = backend_on_engine(slots, PREFIX, (IMAGE,), max_containers=50, exec_path=request.param)
    yield backend
    await backend.aclose()


async def _fresh(backend: DockerBackend, slots: Path) -> tuple[str, Path]:
    workspace = new_workspace(slots)
    made = await backend.create(
        ContainerSpec(f"exp-{uuid.uuid4().hex[:8]}", "fp-race", IMAGE, workspace)
    )
    return made.container_id, workspace


async def _run(backend: DockerBackend, container_id: str, command: str, **kw: Any) -> Any:
    return await backend.run(
        container_id, command, timeout_s=60, job_id=f"j-{uuid.uuid4().hex[:8]}", **kw
    )


@contextlib.contextmanager
def _answers_read_late(marker: bytes) -> Iterator[list[int]]:
    """Every upgraded answer (exec start) is read only once ``marker`` (the command's
    output) is on the socket behind it, as on a machine too loaded to read it sooner;
    yields how many answers were held back so."""
    held: list[int] = []
    original = urllib3.connection.HTTPConnection.getresponse

    def getresponse(self: Any, *args: Any, **kwargs: Any) -> Any:
        sock: socket.socket = self.sock
        deadline = time.monotonic() + 60  # generous: an echo's output, on a busy machine
        while time.monotonic() < deadline:
            seen = sock.recv(1 << 16, socket.MSG_PEEK)
            if not seen.startswith(UPGRADED):
                break
            if marker in seen:
                held.append(len(seen))
                break
            time.sleep(0.01)
        return original(self, *args, **kwargs)

    urllib3.connection.HTTPConnection.getresponse = getresponse  # type: ignore[method-assign]
    try:
        yield held
    finally:
        urllib3.connection.HTTPConnection.getresponse = original  # type: ignore[method-assign]


async def test_output_already_on_the_socket_when_the_answer_is_read(
    engine: docker.DockerClient, slots: Path
) -> None:
    backend = backend_on_engine(slots, PREFIX, (IMAGE,), exec_path="docker-exec")
    try:
        container_id, _ = await _fresh(backend, slots)
        announced: list[tuple[int, int]] = []

        async def on_start(pids: tuple[int, int]) -> None:
            announced.append(pids)

        with _answers_read_late(b"late-reader") as held:
            result = await _run(
                backend, container_id, "echo late-reader; echo err >&2", on_start=on_start
            )
        assert held, "the answer was never held back: the test did not test anything"
        assert (result.exit_code, result.stdout, result.stderr) == (0, "late-reader\n", "err\n")
        # W's announcement came in the same read: the job could be killed.
        assert len(announced) == 1, announced
        await backend.remove(container_id)
    finally:
        await backend.aclose()


async def test_a_silence_longer_than_the_client_timeout_is_no_end(
    engine: docker.DockerClient, slots: Path
) -> None:
    """The stream is read without the engine client's call timeout (docker-py's
    stream reader polled before each read, so it never met it)."""
    maker = backend_on_engine(slots, PREFIX, (IMAGE,), exec_path="docker-exec")
    impatient = DockerBackend(
        slots=SlotsAt(slots),
        allowed_images=(IMAGE,),
        label_prefix=PREFIX,
        client_factory=lambda: docker.from_env(timeout=2),
        exec_path="docker-exec",
    )
    try:
        container_id, _ = await _fresh(maker, slots)
        result = await _run(impatient, container_id, "echo early; sleep 3; echo late")
        assert (result.exit_code, result.stdout) == (0, "early\nlate\n"), result
        await maker.remove(container_id)
    finally:
        await impatient.aclose()
        await maker.aclose()


@contextlib.contextmanager
def _load(seconds: float) -> Iterator[None]:
    """Keep this interpreter (two spinning threads, a long switch interval: every
    blocking call waits for the GIL on its way back) and the CPUs (two spinning
    processes) busy, for at most ``seconds``."""
    stop = threading.Event()
    spin = "import time\nend = time.monotonic() + %f\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", spin % seconds]) for _ in range(2)]

    def busy() -> None:
        end = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < end:
            pass

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        for thread in threads:
            thread.join()
        for proc in procs:
            proc.kill()
            proc.wait()


async def test_fresh_containers_first_command_output_under_load(
    backend: DockerBackend, slots: Path
) -> None:
    """Created side by side, a project file written as create writes it (beside the
    start), the first commands at once (on docker exec: the executor is still
    starting), then, on the fast path, one through the ready executor: every output
    whole."""
    width, fast = 3, backend.exec_path == "auto"
    expected = {"python3 main.py": "hi from main\n", "echo hi": "hi\n"}

    async def one() -> list[tuple[str, int | None, str, str]]:
        workspace = new_workspace(slots)
        spec = ContainerSpec(f"exp-{uuid.uuid4().hex[:8]}", "fp-race", IMAGE, workspace)

        def write() -> None:
            with Jail.open(workspace) as jail:
                jail.write_bytes("main.py", MAIN)

        _, made = await asyncio.gather(asyncio.to_thread(write), backend.create(spec))
        cid = made.container_id
        try:
            outcomes = []
            for command in ["python3 main.py", "echo hi"] + fast * ["python3 main.py"]:
                if len(outcomes) == 2:
                    assert await backend.fast_exec_ready(cid)
                result = await _run(backend, cid, command)
                outcomes.append((command, result.exit_code, result.stdout, result.stderr))
            return outcomes
        finally:
            await backend.remove(cid)

    with _load(60):
        found = [o for batch in await asyncio.gather(*(one() for _ in range(width))) for o in batch]
    wrong = [o for o in found if o[1:] != (0, expected[o[0]], "")]
    assert not wrong, wrong
    if fast:
        assert backend.exec_runs["fast"] >= width, backend.exec_runs
