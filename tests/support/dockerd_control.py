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
from collections.abc import Iterator
from pathlib import Path

import docker
from daemon_proc import Daemon, repoint_pid_files, wait_until

PID_FILE = Path("/var/run/docker.pid")
SOCKET = "/var/run/docker.sock"
STOP_TIMEOUT_S = 90
START_TIMEOUT_S = 120


def current_daemon() -> Daemon:
    pid = int(PID_FILE.read_text().strip())
    daemon = Daemon.of(pid)
    assert daemon.argv, f"pid {pid} has no command line"
    assert Path(daemon.argv[0]).name == "dockerd", f"pid {pid} is not dockerd: {daemon.argv}"
    return daemon


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
        wait_until(lambda: not _alive(daemon.pid), STOP_TIMEOUT_S, "dockerd did not stop")
        yield
    finally:
        if not answers():
            if _alive(daemon.pid):  # it never stopped: let it finish first
                wait_until(lambda: not _alive(daemon.pid), STOP_TIMEOUT_S, "dockerd did not stop")
            daemon.start_again(log)
            wait_until(answers, START_TIMEOUT_S, f"dockerd did not answer again (log: {log})")
            repoint_pid_files("dockerd", daemon.pid, int(PID_FILE.read_text().strip()))
        # Other test runs' containers: as they were (CI runs none at the same time).
        _start_again(others)
