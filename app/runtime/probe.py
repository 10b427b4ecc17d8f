"""Is the Docker engine reachable, and which version is it? (for /health and `check`)."""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import docker
from docker.errors import DockerException
from requests.exceptions import RequestException


@dataclass(frozen=True)
class RuntimeStatus:
    reachable: bool
    version: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"reachable": self.reachable, "version": self.version, "reason": self.reason}


def _probe(timeout_s: float) -> RuntimeStatus:
    try:
        client = docker.from_env(timeout=max(1, round(timeout_s)))
    except DockerException as exc:
        return RuntimeStatus(False, reason=_first_line(exc))
    try:
        version = client.version()
        return RuntimeStatus(True, version=str(version.get("Version")))
    except (DockerException, RequestException) as exc:
        return RuntimeStatus(False, reason=_first_line(exc))
    finally:
        client.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


async def probe_docker(timeout_s: float = 2.0) -> RuntimeStatus:
    """Ask the engine for its version, in a worker thread, never raising."""
    with anyio.move_on_after(timeout_s + 1):
        return await anyio.to_thread.run_sync(_probe, timeout_s, abandon_on_cancel=True)
    return RuntimeStatus(False, reason="the Docker engine did not answer in time")
