"""A container's executor is started once however many callers ask for it at once.

A loaded CI run saw two processes with the executor's command line in one container
(issue 27); the second was a job the executor was starting (between its fork and its
exec; tests/integration/runtime/test_fast_exec.py catches one), not a second start.
Here the start is held open by a fake engine until every caller has asked, so all of
them come while it is under way.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from typing import cast

import docker
import pytest

import app.runtime.exec.sessions as sessions
from app.runtime.docker.threads import Offload
from app.runtime.exec.sessions import Executors

CONTAINER = "c" * 64
CALLERS = 8


class HeldEngine:
    """The two engine calls of an executor's start, held until ``release``; the
    executor's side of each stream answers "ready" at once."""

    def __init__(self) -> None:
        self.creates = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.theirs: list[socket.socket] = []
        self.ours: list[socket.socket] = []

    def exec_create(self, *args: object, **kwargs: object) -> dict[str, str]:
        self.creates += 1
        self.entered.set()
        assert self.release.wait(30), "the test never released the start"
        return {"Id": f"e{self.creates}"}

    def exec_start(self, *args: object, **kwargs: object) -> socket.socket:
        ours, theirs = socket.socketpair()
        line = json.dumps({"ready": 7}).encode() + b"\n"
        theirs.sendall(struct.pack(">BxxxL", 1, len(line)) + line)
        self.ours.append(ours)
        self.theirs.append(theirs)
        return ours

    def close(self) -> None:
        for sock in self.ours + self.theirs:
            sock.close()


async def test_callers_that_come_while_the_executor_starts_share_that_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sessions, "FIRST_COMMAND_WAIT_S", 60)  # the start's end, not a clock
    engine = HeldEngine()

    async def api() -> docker.APIClient:
        return cast(docker.APIClient, engine)

    executors = Executors(api=api, offload=Offload(calls=CALLERS, streams=2), user="1000")
    try:
        executors.prepare(CONTAINER)  # as the container's create does
        # Every way in, each several times: first commands (session_soon), tests' waits
        # (ready), later commands (session), creates (prepare).
        waiting = [
            asyncio.create_task(executors.session_soon(CONTAINER)) for _ in range(CALLERS)
        ] + [asyncio.create_task(executors.ready(CONTAINER)) for _ in range(CALLERS)]
        for _ in range(CALLERS):
            assert executors.session(CONTAINER) is None
            executors.prepare(CONTAINER)
        # The start reached the engine (and is held there); the callers, queued behind
        # it on the loop, have all asked meanwhile.
        assert await asyncio.to_thread(engine.entered.wait, 30)
        engine.release.set()
        got = await asyncio.gather(*waiting)
        assert engine.creates == 1
        assert got[0] is not None
        assert all(session is got[0] for session in got)
        assert executors.session(CONTAINER) is got[0]
    finally:
        engine.release.set()
        await executors.aclose()
        engine.close()
