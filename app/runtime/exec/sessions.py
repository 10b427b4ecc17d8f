"""The executors of this process, by container: starting one (the agent's source sent
over the exec's stdin, then its "ready" awaited), the crash-loop limit, dropping them.

The fast exec path as a whole (why, the promises it keeps, the fallback to ``docker
exec``, the threat model) is described in :mod:`app.runtime.exec.protocol`, which holds
the stream protocol (:class:`~app.runtime.exec.protocol.Session`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import anyio
import docker
import structlog

from app.runtime.backend import WORKSPACE
from app.runtime.docker.threads import Offload
from app.runtime.exec.protocol import (
    FRAME_HEADER,
    START_TIMEOUT_S,
    ExecutorLost,
    Session,
    close_raw_stream,
    raw_socket,
)
from app.runtime.exec.stream import read_ahead

log = structlog.get_logger(__name__)

# How long a command waits for its container's executor being started before it goes
# through docker exec instead (a new container's first command; Executors.session_soon).
FIRST_COMMAND_WAIT_S: Final = 0.5
PYTHON: Final = "/usr/bin/python3"
AGENT_SOURCE: Final = Path(__file__).with_name("agent.py").read_bytes()
# Reads exactly the agent's source from stdin (the server sends nothing more before
# "ready"), then runs it; -I -S: no PYTHON* variable, no site, no user site.
_BOOT: Final = (
    'import sys;exec(compile(sys.stdin.buffer.read(int(sys.argv[1])),"smcp-executor","exec"))'
)
AGENT_ARGV: Final = [PYTHON, "-I", "-S", "-c", _BOOT, str(len(AGENT_SOURCE))]
MAX_STARTS: Final = 5  # executors per container and process; then docker exec only
HEALTHY_S: Final = 60.0  # an executor that lived this long gives back the starts
_BEFORE_READY_MAX: Final = 64 * 1024  # the ready line is about 20 bytes


def _open_stream(api: docker.APIClient, container_id: str, user: str) -> tuple[Any, bytes]:
    """Start the executor and wait for its "ready" (blocking: run it in a thread); the
    SDK's socket wrapper and the bytes read after the ready line."""
    exec_id = api.exec_create(
        container_id,
        AGENT_ARGV,
        stdin=True,
        stdout=True,
        stderr=True,
        user=user,
        workdir=WORKSPACE,
    )["Id"]
    wrapper = api.exec_start(exec_id, socket=True)
    sock = raw_socket(wrapper)
    if sock is None:
        with contextlib.suppress(Exception):
            wrapper.close()  # (its own socket goes with it)
        raise ExecutorLost("the engine connection is not a plain socket")
    try:
        # What came with the engine's answer, taken before the source goes: the ready
        # line cannot be in it (the loop below parses only what it receives after).
        received = bytearray(read_ahead(wrapper))
        sock.settimeout(START_TIMEOUT_S)
        sock.sendall(AGENT_SOURCE)
        stdout = bytearray()
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"\n" not in stdout:
            # The sandbox may write to the new executor's stdout and stderr before its
            # ready line: bounded in time and bytes (each read parses what came anew).
            if time.monotonic() > deadline or len(received) > _BEFORE_READY_MAX:
                raise ExecutorLost("no ready line")
            chunk = sock.recv(65536)
            if not chunk:
                raise ExecutorLost(
                    "it exited at start: "
                    + bytes(received[:300]).decode("utf-8", "replace").strip(),
                    at_start=True,
                )
            received += chunk
            stdout.clear()
            rest = bytes(received)
            # Everything up to the first complete stdout line of whole frames.
            while len(rest) >= FRAME_HEADER.size:
                kind, length = FRAME_HEADER.unpack_from(rest)
                if len(rest) < FRAME_HEADER.size + length:
                    break
                if kind == 1:
                    stdout += rest[FRAME_HEADER.size : FRAME_HEADER.size + length]
                rest = rest[FRAME_HEADER.size + length :]
                if b"\n" in stdout:
                    break
        line, _, after = bytes(stdout).partition(b"\n")
        if not json.loads(line).get("ready"):
            raise ExecutorLost("no ready line")
        if after:
            raise ExecutorLost("output after the ready line")
        sock.settimeout(None)
        sock.setblocking(False)
        return wrapper, rest
    except BaseException:
        close_raw_stream(sock, wrapper)
        raise


class Executors:
    """The executors of this process, by container (see the module doc)."""

    def __init__(
        self, *, api: Callable[[], Awaitable[docker.APIClient]], offload: Offload, user: str
    ) -> None:
        self._api = api
        self._offload = offload
        self._user = user
        self._sessions: dict[str, Session] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._starts: dict[str, int] = {}
        self._never: set[str] = set()
        # Bumped when a container is forgotten: a start still under way for an older
        # generation closes what it opened (its thread cannot be cancelled).
        self._generation: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # every start under way

    def prepare(self, container_id: str) -> None:
        """Start the container's executor in the background (if it may have one)."""
        if container_id in self._never or container_id in self._starting:
            return
        session = self._sessions.get(container_id)
        if session is not None and session.alive:
            return
        if session is not None and session.lived_s() > HEALTHY_S:
            self._starts[container_id] = 0  # it died after a long life: not a crash loop
        if self._starts.get(container_id, 0) >= MAX_STARTS:
            return
        self._starts[container_id] = self._starts.get(container_id, 0) + 1
        task = asyncio.create_task(self._start(container_id), name="fast-exec-start")
        self._starting[container_id] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def session(self, container_id: str) -> Session | None:
        """The container's ready executor, or None (then one is started for later)."""
        session = self._sessions.get(container_id)
        if session is not None and session.alive:
            return session
        self.prepare(container_id)
        return None

    async def session_soon(self, container_id: str) -> Session | None:
        """The container's ready executor; waits up to ``FIRST_COMMAND_WAIT_S`` for its
        first one.

        A new container's first command usually comes while its executor starts: a
        ``docker exec`` beside that start costs about as much as the start itself (both
        are one exec of the engine, on the same cores), and the executor then serves
        every later command. A container whose executor died does not wait (its
        commands go through ``docker exec`` while a new one starts, as documented)."""
        first = container_id not in self._sessions
        session = self.session(container_id)
        task = self._starting.get(container_id)
        if session is not None or task is None or not first:
            return session
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(task), FIRST_COMMAND_WAIT_S)
        session = self._sessions.get(container_id)
        return session if session is not None and session.alive else None

    async def ready(self, container_id: str) -> Session | None:
        """Wait for the executor being started (tests, benchmarks); None if it failed."""
        self.prepare(container_id)
        task = self._starting.get(container_id)
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        return self.session(container_id) if container_id in self._sessions else None

    def docker_exec_only(self, container_id: str) -> None:
        """Never start an executor in this container (a short-lived helper)."""
        self._never.add(container_id)

    def forget(self, container_id: str) -> None:
        """The container is being removed: drop its executor."""
        self._never.discard(container_id)
        self._starts.pop(container_id, None)
        self._starting.pop(container_id, None)
        self._generation[container_id] = self._generation.get(container_id, 0) + 1
        session = self._sessions.pop(container_id, None)
        if session is not None:
            session.close("container removed")

    async def aclose(self) -> None:
        """Drop every executor (at shutdown), waiting (bounded) for starts under way."""
        starting = list(self._tasks)
        for container_id in list(self._sessions) + list(self._starting):
            self.forget(container_id)
        with anyio.move_on_after(START_TIMEOUT_S):
            for task in starting:
                with contextlib.suppress(Exception):
                    await task

    async def _start(self, container_id: str) -> None:
        started = time.monotonic()
        generation = self._generation.get(container_id, 0)
        try:
            api = await self._api()
            wrapper, leftover = await self._offload.call(
                _open_stream, api, container_id, self._user
            )
        except Exception as exc:
            log.info("fast_exec.unavailable", container_id=container_id[:12], reason=str(exc))
            if isinstance(exc, ExecutorLost) and exc.at_start:
                self._never.add(container_id)  # no (working) /usr/bin/python3 in the image
            return
        finally:
            if self._generation.get(container_id, 0) == generation:
                self._starting.pop(container_id, None)
        sock = raw_socket(wrapper)
        assert sock is not None
        session = Session(container_id, sock, wrapper)
        if self._generation.get(container_id, 0) != generation:
            session.close("container removed while its executor started")
            return
        old = self._sessions.get(container_id)
        if old is not None:
            old.close("replaced")
        self._sessions[container_id] = session
        session.start_reading(leftover)
        log.info(
            "fast_exec.ready",
            container_id=container_id[:12],
            ms=round((time.monotonic() - started) * 1000),
        )
