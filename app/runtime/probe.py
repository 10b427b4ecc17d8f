"""Is the Docker engine reachable, and which version is it? (for /health and `check`).

One client for the life of the probe, not one per request: a load balancer asks
/health every few seconds. Calls run in a worker thread of their own, never queued
behind tenants' container work, and never wait past ``timeout_s``.
"""

from __future__ import annotations

import threading
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


class DockerProbe:
    def __init__(self, timeout_s: float = 2.0) -> None:
        self._timeout_s = timeout_s
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()  # one client, made once, even under concurrent probes

    async def __call__(self) -> RuntimeStatus:
        """Ask the engine for its version; never raises."""
        with anyio.move_on_after(self._timeout_s + 1):
            return await anyio.to_thread.run_sync(self._probe, abandon_on_cancel=True)
        return RuntimeStatus(False, reason="the Docker engine did not answer in time")

    def _probe(self) -> RuntimeStatus:
        try:
            version = self._connected().version()
            return RuntimeStatus(True, version=str(version.get("Version")))
        except (DockerException, RequestException) as exc:
            self.close()  # a daemon restarted since: connect afresh next time
            return RuntimeStatus(False, reason=_first_line(exc))

    def _connected(self) -> docker.DockerClient:
        with self._lock:
            if self._client is None:
                self._client = docker.from_env(timeout=max(1, round(self._timeout_s)))
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
