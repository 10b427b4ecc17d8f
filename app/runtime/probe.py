"""Is the Docker engine reachable, which version is it, and which of the allowed
images are built? (for /health, `check` and the start of `serve`).

One client for the life of the probe, not one per request: a load balancer asks
/health every few seconds. Calls run in a worker thread of their own, never queued
behind tenants' container work, and never wait past ``timeout_s``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import docker
from docker.errors import DockerException
from requests.exceptions import RequestException


@dataclass(frozen=True)
class ImagesStatus:
    """Which allowed images the engine has; an experiment needs its image built."""

    ready: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    default: str | None = None

    @property
    def default_ready(self) -> bool:
        return self.default is None or self.default in self.ready

    def as_dict(self) -> dict[str, object]:
        return {
            "ready": list(self.ready),
            "missing": list(self.missing),
            "default": self.default,
            "default_ready": self.default_ready,
        }


@dataclass(frozen=True)
class RuntimeStatus:
    reachable: bool
    version: str | None = None
    reason: str | None = None
    images: ImagesStatus | None = None  # None: not asked, or the engine did not answer

    @property
    def can_run_experiments(self) -> bool:
        return self.reachable and (self.images is None or self.images.default_ready)

    def as_dict(self) -> dict[str, object]:
        body: dict[str, object] = {
            "reachable": self.reachable,
            "version": self.version,
            "reason": self.reason,
        }
        if self.images is not None:
            body["images"] = self.images.as_dict()
        return body


class DockerProbe:
    def __init__(
        self,
        timeout_s: float = 2.0,
        *,
        images: Sequence[str] = (),
        default_image: str | None = None,
    ) -> None:
        """``images``: the allow-list whose build state is reported (none: not asked)."""
        self._timeout_s = timeout_s
        self._images = tuple(images)
        self._default_image = default_image
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()  # one client, made once, even under concurrent probes

    async def __call__(self) -> RuntimeStatus:
        """Ask the engine for its version; never raises."""
        with anyio.move_on_after(self._timeout_s + 1):
            return await anyio.to_thread.run_sync(self._probe, abandon_on_cancel=True)
        return RuntimeStatus(False, reason="the Docker engine did not answer in time")

    def _probe(self) -> RuntimeStatus:
        try:
            client = self._connected()
            version = str(client.version().get("Version"))
            images = self._images_status(client) if self._images else None
        except (DockerException, RequestException) as exc:
            self.close()  # a daemon restarted since: connect afresh next time
            return RuntimeStatus(False, reason=_first_line(exc))
        reason = None
        if images is not None and not images.default_ready:
            reason = f"the default image {images.default} is not built"
        return RuntimeStatus(True, version=version, reason=reason, images=images)

    def _images_status(self, client: docker.DockerClient) -> ImagesStatus:
        tags = {tag for image in client.api.images() for tag in (image.get("RepoTags") or ())}
        return ImagesStatus(
            ready=tuple(name for name in self._images if name in tags),
            missing=tuple(name for name in self._images if name not in tags),
            default=self._default_image,
        )

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
