"""Shared pieces of the runtime's integration tests (a real Docker engine)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors

from app.runtime.backends.docker import DockerBackend
from app.runtime.exec.stream import close_stream, exec_stream
from pool.slots import SlotsAt

RUN = uuid.uuid4().hex[:10]
# One label prefix per test module, unique per run, so that cleanup never touches
# another run's (or production's) containers.
BACKEND_PREFIX = f"io.sandbox-mcp-test-{RUN}"
GIT_PREFIX = f"io.sandbox-mcp-git-test-{RUN}"
UID, GID = 1000, 1000
IMAGES = ("sandbox-mcp/python:3", "sandbox-mcp/base:bookworm")

# Everything of a container's HostConfig that the hardening sets, but the bind's source
# (tests compare the workspace on their own) and what the engine fills in itself.
HOST_HARDENING = (
    "ReadonlyRootfs",
    "CapDrop",
    "CapAdd",
    "SecurityOpt",
    "PidsLimit",
    "Memory",
    "NanoCpus",
    "NetworkMode",
    "Tmpfs",
    "Init",
    "Privileged",
    "Ulimits",
)


def docker_client() -> docker.DockerClient:
    return docker.from_env(timeout=120)


def engine_present() -> bool:
    """Whether this machine has a Docker engine to ask (a unit-only run may have none),
    decided without connecting where the engine is a local socket: docker-py leaves a
    failed connection's socket open, a ResourceWarning that filterwarnings=error turns
    into a failed run."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        return Path(host.removeprefix("unix://")).is_socket()
    return True


def labelled(client: docker.DockerClient, *labels: str) -> list[str]:
    """Ids of the containers carrying every label (``key=value``), running or not."""
    found = client.api.containers(all=True, quiet=True, filters={"label": list(labels)})
    return [c["Id"] for c in found]


def new_workspace(slots: Path) -> Path:
    """An empty workspace in a fresh slot folder, owned by the sandbox user."""
    workspace = slots / f"slot-{uuid.uuid4().hex[:8]}" / "workspace"
    workspace.mkdir(parents=True)
    os.chown(workspace, UID, GID)
    return workspace


def engine_events(engine: docker.DockerClient, **filters: Any) -> list[dict[str, Any]]:
    """The engine's events for ``filters`` (``since`` and ``until`` bound them), read to
    the end and the stream closed: its socket is never left to the garbage collector."""
    stream = engine.api.events(decode=True, **filters)
    try:
        return list(stream)
    finally:
        stream.close()
        response = getattr(stream, "_response", None)
        if response is not None:
            response.close()


def backend_on_engine(
    slots: Path, prefix: str, images: tuple[str, ...], **options: Any
) -> DockerBackend:
    """A backend on the real engine allowing ``images``, its containers labelled with
    ``prefix`` (the cleanup finds them by it); ``options`` as DockerBackend takes them."""
    return DockerBackend(
        slots=SlotsAt(slots),
        allowed_images=images,
        label_prefix=prefix,
        client_factory=docker_client,
        **options,
    )


def remove_labelled_containers(client: docker.DockerClient, label: str) -> None:
    """Remove every container carrying ``label`` (a test's cleanup). One listed and
    then removed by someone else before our remove (a stopping server removing its
    warm containers, an earlier test's removal finishing on a busy machine) is gone
    or going all the same: its NotFound or 409 "removal already in progress" is not
    a failure."""
    for found in client.api.containers(all=True, quiet=True, filters={"label": label}):
        try:
            client.api.remove_container(found["Id"], force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise


def remove_containers_mounting(*folders: Path) -> int:
    """Remove every container, running or not, with a mount from below one of
    ``folders``; how many it removed. A server leaves its experiments' containers
    running when it stops (a restart on the same state dir adopts them), and their
    bind mounts keep the folder's file system busy. Matched by the mount's source path
    below the folder (``<folder>/``, never a sibling such as ``state-2`` or
    ``popen-gw10``): another test's, worker's or session's containers are never
    touched. One removed by someone else meanwhile (NotFound, or 409 "removal already
    in progress") is gone or going all the same."""
    prefixes = tuple({f"{path}/" for folder in folders for path in (folder, folder.resolve())})
    removed = 0
    client = docker_client()
    try:
        # The engine's listing carries the mounts: no inspect per container, which fails
        # when another test (or server) removes that container meanwhile.
        for container in client.api.containers(all=True):
            sources = [mount.get("Source") or "" for mount in container.get("Mounts") or []]
            if not any(source.startswith(prefixes) for source in sources):
                continue
            try:
                client.api.remove_container(container["Id"], force=True)
                removed += 1
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as error:
                if error.status_code != 409:
                    raise
    finally:
        client.close()
    return removed


def exec_output(api: docker.APIClient, container_id: str, argv: list[str]) -> tuple[int, bytes]:
    """Run ``argv`` in the container: its exit code and stdout (blocking). Not docker-py's
    ``exec_run``, whose output can come back empty on a loaded machine
    (docker/docker-py#3332): read as the server reads it (app/runtime/exec/stream.py)."""
    exec_id = api.exec_create(container_id, argv)["Id"]
    stream = exec_stream(api, exec_id)
    try:
        stdout = b"".join(out for out, _ in stream if out)
    finally:
        close_stream(stream)
    return api.exec_inspect(exec_id)["ExitCode"], stdout
