"""Stopping and starting the real Docker daemon under a running server (fault tests).

DISRUPTIVE: every container on the engine stops while the daemon is down, whoever
owns it; run such tests alone (CI runs tests one after the other).

``daemon_outage`` stops the dockerd answering on the default socket (by its pid
file) and, whatever happens in the test, starts it again with the same argv and
environment, detached, waits until it answers, and starts again the containers
that ran before (but those the test leaves to the server under test). A pid file of
``.ci/lib/services.sh`` naming the old daemon is pointed at the new one, so
``stop_services`` still stops the daemon it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
from daemon_proc import started_as

PID_FILE = Path("/var/run/docker.pid")
SOCKET = "/var/run/docker.sock"
STOP_TIMEOUT_S = 90
START_TIMEOUT_S = 120


@dataclass
class Daemon:
    pid: int
    argv: list[str]
    env: dict[str, str]
    cwd: str


def current_daemon() -> Daemon:
    pid = int(PID_FILE.read_text().strip())
    argv, env, cwd = started_as(pid)
    assert argv, f"pid {pid} has no command line"
    assert Path(argv[0]).name == "dockerd", f"pid {pid} is not dockerd: {argv}"
    return Daemon(pid, argv, env, cwd)


def answers() -> bool:
    """Whether the daemon answers its ping on the default socket. A plain socket, not
    the SDK: a client made while the daemon is down leaks its connection."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(SOCKET)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
    except OSError:
        return False
    return reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n", 1)[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").exists()


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s} s")


def _start(daemon: Daemon, log: Path) -> None:
    """Start dockerd detached: through a shell that backgrounds it and exits, so the
    daemon outlives this test run (as the original did) and is no child of ours."""
    with log.open("ab") as out:
        subprocess.run(
            ["/bin/sh", "-c", 'exec 0</dev/null; "$@" & exit 0', "start-dockerd", *daemon.argv],
            env=daemon.env,
            cwd=daemon.cwd,
            stdout=out,
            stderr=out,
            start_new_session=True,
            check=True,
        )


def _repoint_pid_files(old: int, new: int) -> None:
    roots = {os.environ.get("CI_WORK_DIR", ""), "/tmp/sandbox-mcp-ci", "/tmp/sandbox-mcp-dev"}
    for root in filter(None, roots):
        path = Path(root) / "run" / "dockerd.pid"
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text().strip()) == old:
                path.write_text(f"{new}\n")


def _running_containers() -> set[str]:
    client = docker.from_env(timeout=30)
    try:
        return {c["Id"] for c in client.api.containers(quiet=True)}
    finally:
        client.close()


def _start_again(container_ids: set[str]) -> None:
    """Start containers the outage stopped (best effort: some owners removed theirs)."""
    client = docker.from_env(timeout=30)
    try:
        for container_id in container_ids:
            with contextlib.suppress(docker.errors.APIError):
                client.api.start(container_id)
    finally:
        client.close()


@contextlib.contextmanager
def daemon_outage(log: Path, *, leave_stopped: set[str]) -> Iterator[None]:
    """Stop dockerd for the body of the ``with``; it is running again afterwards, and so
    is every container that ran before, except ``leave_stopped`` (the ones the test
    expects the server under test to start again itself)."""
    daemon = current_daemon()
    others = _running_containers() - leave_stopped
    try:
        os.kill(daemon.pid, signal.SIGTERM)
        _wait(lambda: not _alive(daemon.pid), STOP_TIMEOUT_S, "dockerd did not stop")
        yield
    finally:
        if not answers():
            if _alive(daemon.pid):  # it never stopped: let it finish first
                _wait(lambda: not _alive(daemon.pid), STOP_TIMEOUT_S, "dockerd did not stop")
            _start(daemon, log)
            _wait(answers, START_TIMEOUT_S, f"dockerd did not answer again (log: {log})")
            _repoint_pid_files(daemon.pid, int(PID_FILE.read_text().strip()))
        # Other test runs' containers: as they were (CI runs none at the same time).
        _start_again(others)
