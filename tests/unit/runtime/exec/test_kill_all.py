"""Killing every process of a sandbox's container (the dir slots' disk budget) goes
around its executor, and is retried until it is done.

The executor runs as the sandbox user: the tenant can stop or kill it, and the kill
itself freezes and kills it, so a kill sent through it was seen "lost" while the
writer ran on (issue 23, finding 6). ``TreeKiller.kill_all`` runs its own
``docker exec`` (never the executor), tries again when the engine fails under load
(HTTP 500) or the exec cannot start (126), and restarts the container when no try
succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import docker
import pytest
import requests

from app.runtime.docker.threads import Offload
from app.runtime.errors import ContainerGone
from app.runtime.exec.kill import KILL_ALL, TreeKiller
from app.runtime.exec.sessions import Executors


def _http_error(status: int) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError("engine", response=response)


@dataclass
class FakeApi:
    """Answers each exec with the next outcome: an exit code or an error to raise."""

    outcomes: list[object]
    execs: list[tuple[str, list[str], str]] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    _code: object = None

    def exec_create(self, container_id: str, argv: list[str], **kw: Any) -> dict[str, str]:
        self.execs.append((container_id, argv, kw["user"]))
        outcome = self.outcomes.pop(0) if self.outcomes else 0
        if isinstance(outcome, Exception):
            raise outcome
        self._code = outcome
        return {"Id": "e"}

    def exec_start(self, exec_id: str) -> bytes:
        return b""

    def exec_inspect(self, exec_id: str) -> dict[str, object]:
        return {"ExitCode": self._code}

    def restart(self, container_id: str, timeout: int) -> None:
        self.restarted.append(container_id)


@dataclass
class FakeExecutors:
    forgotten: list[str] = field(default_factory=list)

    def forget(self, container_id: str) -> None:
        self.forgotten.append(container_id)


def a_killer(api: FakeApi, fast: FakeExecutors) -> TreeKiller:
    async def get_api() -> docker.APIClient:
        return cast(docker.APIClient, api)

    return TreeKiller(
        api=get_api,
        offload=Offload(calls=2, streams=2),
        user="1000:1000",
        fast=cast(Executors, fast),
    )


async def test_the_kill_is_a_docker_exec_of_its_own_as_the_sandbox_user() -> None:
    api, fast = FakeApi([0]), FakeExecutors()
    await a_killer(api, fast).kill_all("c-1")
    assert api.execs == [("c-1", ["/bin/sh", "-c", KILL_ALL, "sandbox-mcp-kill-all"], "1000:1000")]
    assert api.restarted == []
    assert fast.forgotten == []


async def test_an_engine_error_or_an_exec_that_cannot_start_is_tried_again() -> None:
    api, fast = FakeApi([_http_error(500), 126, 0]), FakeExecutors()
    await a_killer(api, fast).kill_all("c-1")
    assert len(api.execs) == 3
    assert api.restarted == []


async def test_when_no_try_succeeds_the_container_is_restarted() -> None:
    api, fast = FakeApi([126, _http_error(500), 126, 137]), FakeExecutors()
    await a_killer(api, fast).kill_all("c-1")
    assert len(api.execs) == 4
    assert api.restarted == ["c-1"]
    assert fast.forgotten == ["c-1"]  # its executor died with the rest


async def test_a_container_that_is_gone_is_said_so_at_once() -> None:
    api, fast = FakeApi([docker.errors.NotFound("gone")]), FakeExecutors()
    with pytest.raises(ContainerGone):
        await a_killer(api, fast).kill_all("c-1")
    assert len(api.execs) == 1
    assert api.restarted == []
