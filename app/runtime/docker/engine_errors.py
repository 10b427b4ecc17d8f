"""Docker SDK and transport errors, translated at the boundary into RuntimeFailure.

The agent sees a stable code and a sentence; the cause stays chained for the log.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import docker.errors
from requests.exceptions import RequestException
from urllib3.exceptions import HTTPError as Urllib3Error

from app.runtime.errors import ContainerGone, RuntimeFailure, RuntimeUnavailable


def translate(exc: BaseException, container_id: str | None) -> RuntimeFailure:
    """The RuntimeFailure that stands for a Docker SDK or transport error."""
    if isinstance(exc, docker.errors.NotFound) and not isinstance(exc, docker.errors.ImageNotFound):
        if container_id is not None:
            return ContainerGone(container_id)
        return RuntimeUnavailable("the Docker engine lost a resource it was using")
    if isinstance(exc, docker.errors.APIError):
        if container_id is not None and exc.status_code == 409:
            return ContainerGone(container_id)  # "container ... is not running"
        if "bind source path does not exist" in str(exc.explanation or ""):
            # The engine looks for the workspace on its own filesystem: a server in a
            # container whose state dir is mounted from another path must say where.
            return RuntimeUnavailable(
                "the Docker engine cannot see the sandbox folders at the path this server "
                "uses; the operator must mount the state dir at the same path on both "
                "sides or set SANDBOX_MCP_HOST_STATE_DIR"
            )
        return RuntimeUnavailable(f"the Docker engine refused the request (HTTP {exc.status_code})")
    return RuntimeUnavailable("the Docker engine cannot be reached")


@contextlib.contextmanager
def translated(container_id: str | None = None) -> Iterator[None]:
    """Docker SDK and transport errors -> RuntimeFailure (the cause is kept)."""
    try:
        yield
    # urllib3's own errors (a stream cut mid-read) are not wrapped by requests.
    except (docker.errors.DockerException, RequestException, Urllib3Error, OSError) as exc:
        close_failed_sockets(exc)
        raise translate(exc, container_id) from exc


def close_failed_sockets(exc: BaseException) -> None:
    """Close the sockets a failed connection left open.

    docker-py's ``UnixHTTPConnection.connect`` opens a socket and, when ``connect``
    fails (no daemon: the socket file is missing, or nobody listens), drops it open;
    the traceback's frame holds it until a garbage collection, which then warns
    ``ResourceWarning: unclosed socket`` in whatever runs at that moment (a test that
    never touched Docker, seen with no daemon running). The frames of the error's
    chain are where it is, so it is closed here.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen or len(seen) > 16:
            continue
        seen.add(id(current))
        pending += [current.__cause__, current.__context__]
        pending += [arg for arg in current.args if isinstance(arg, BaseException)]
        trace = current.__traceback__
        while trace is not None:
            for value in trace.tb_frame.f_locals.values():
                if isinstance(value, socket.socket) and value.fileno() != -1:
                    value.close()
            trace = trace.tb_next
