"""Is the Docker engine reachable, which version is it, and which of the allowed
images are built? (for /health, `check` and the start of `serve`).

One client for the life of the probe, not one per request: a load balancer asks
/health every few seconds. Calls run in a worker thread of their own, never queued
behind tenants' container work, and never wait past ``timeout_s``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import docker
from docker.constants import DEFAULT_UNIX_SOCKET
from docker.errors import DockerException
from requests.exceptions import RequestException

from app.runtime.docker.engine_errors import close_failed_sockets


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
        return RuntimeStatus(
            False,
            reason=f"Docker does not answer at {engine_address()}: "
            f"no answer within {self._timeout_s + 1:g} s.",
        )

    def _probe(self) -> RuntimeStatus:
        try:
            client = self._connected()
            version = str(client.version().get("Version"))
            images = self._images_status(client) if self._images else None
        except (DockerException, RequestException) as exc:
            close_failed_sockets(exc)
            self.close()  # a daemon restarted since: connect afresh next time
            return RuntimeStatus(False, reason=unreachable_reason(exc))
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


def engine_address() -> str:
    """Where ``docker.from_env`` connects, and why there, in words: DOCKER_HOST is
    what an operator sets wrong, so the sentence names it."""
    host = os.environ.get("DOCKER_HOST")
    if host:
        return f"{host} (DOCKER_HOST)"
    return f"{DEFAULT_UNIX_SOCKET.removeprefix('http+')} (the default; DOCKER_HOST is not set)"


def unreachable_reason(exc: BaseException) -> str:
    """One plain sentence for an engine that does not answer: where it was asked, and
    the cause in words (docker-py's own text nests three libraries' reprs)."""
    cause = _os_error(exc, depth=0)
    if isinstance(cause, FileNotFoundError):
        why = "no socket is there"
    elif isinstance(cause, PermissionError):
        why = "permission denied (run as root, or as a member of the docker group)"
    elif isinstance(cause, ConnectionRefusedError):
        why = "nothing listens there"
    elif cause is not None:
        why = cause.strerror or _first_line(cause)
    else:
        why = _first_line(exc)
    return f"Docker does not answer at {engine_address()}: {why}."


def _os_error(exc: object, depth: int) -> OSError | None:
    """The OSError under docker-py's, requests' and urllib3's wrappers, if any."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc
    if not isinstance(exc, BaseException) or depth > 6:
        return None
    for inner in (exc.__cause__, exc.__context__, *exc.args):
        found = _os_error(inner, depth + 1)
        if found is not None:
            return found
    return None
