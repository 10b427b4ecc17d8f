"""A Docker daemon of the test's own, for the fault tests that stop and start one
(tests/e2e/test_engine_restart.py): never the machine's shared dockerd, whose
containers belong to everyone else on the machine (other test runs, other work).

It runs beside the shared one with a socket, data root, exec root (so a containerd
of its own), pid file and config file of its own, without a default bridge and
without touching iptables or sysctls (the host's firewall is the shared daemon's),
and holds copies of the images the test needs (``docker save | docker load`` from
the shared engine, which only reads it). ``outage`` stops it and starts it again
with the same command line; ``private_dockerd`` removes its containers, stops it
and deletes everything it wrote, however the test ends. Given ``namespace_pid``, it
runs in that process's mount namespace (zfs_control's, whose ZFS mounts its
containers bind-mount); its socket is still reached from outside (/run is not one
of the namespace's private folders).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
from daemon_proc import wait_until

STOP_TIMEOUT_S = 90
START_TIMEOUT_S = 120
LOAD_TIMEOUT_S = 600


@dataclass
class PrivateDockerd:
    argv: list[str]
    socket: str
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        """The daemon's address, for DOCKER_HOST."""
        return f"unix://{self.socket}"

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=120)

    def answers(self) -> bool:
        """Whether it answers its ping. A plain socket, not the SDK: a client made while
        the daemon is down leaks its connection."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(self.socket)
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
        except OSError:
            return False
        return reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n", 1)[0]

    def start(self) -> None:
        with self.log.open("ab") as out:
            # A session of its own: a ^C to the test run does not reach it first.
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = self.process
        wait_until(
            lambda: process.poll() is not None or self.answers(),
            START_TIMEOUT_S,
            f"the test's dockerd did not answer (log: {self.log})",
        )
        assert process.poll() is None, self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGTERM, as systemd stops it: it stops its containers and its containerd."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The daemon is down for the body of the ``with``, and answers again after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def load(self, *images: str) -> None:
        """Copy ``images`` from the shared engine (DOCKER_HOST as given, or the default)."""
        for image in images:
            with subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE) as saved:
                subprocess.run(
                    ["docker", "--host", self.host, "load", "--quiet"],
                    stdin=saved.stdout,
                    stdout=subprocess.DEVNULL,
                    check=True,
                    timeout=LOAD_TIMEOUT_S,
                )
            assert saved.returncode == 0, f"docker save {image} failed"


def _remove_containers(daemon: PrivateDockerd) -> None:
    if not daemon.answers():
        return
    client = daemon.client()
    try:
        for found in client.api.containers(all=True, quiet=True):
            with contextlib.suppress(docker.errors.APIError):
                client.api.remove_container(found["Id"], force=True, v=True)
    finally:
        client.close()


def _mounts_under(mountinfo: Path, *roots: Path) -> list[str]:
    points = [line.split()[4] for line in mountinfo.read_text().splitlines()]
    return [p for p in points if any(p == str(r) or p.startswith(f"{r}/") for r in roots)]


@contextlib.contextmanager
def private_dockerd(
    work: Path, *, images: tuple[str, ...], namespace_pid: int | None = None
) -> Iterator[PrivateDockerd]:
    """A running dockerd of this test's own with ``images``; gone afterwards, with
    its data. ``work`` is an empty folder for its data root and log; ``namespace_pid``
    a process whose mount namespace it runs in (by default the test's own)."""
    # Unix socket paths are short (108 bytes): socket and exec root under /run.
    name = f"sbx-test-dockerd-{uuid.uuid4().hex[:8]}"
    exec_root = Path("/run") / name
    data_root = work / "data"
    config = work / "daemon.json"
    config.write_text("{}\n")  # not /etc/docker/daemon.json, which is the shared daemon's
    enter = [] if namespace_pid is None else ["nsenter", f"--mount=/proc/{namespace_pid}/ns/mnt"]
    mountinfo = Path(f"/proc/{namespace_pid or 'self'}/mountinfo")
    daemon = PrivateDockerd(
        argv=[
            *enter,
            "dockerd",
            f"--host=unix:///run/{name}.sock",
            f"--data-root={data_root}",
            f"--exec-root={exec_root}",
            f"--pidfile={work / 'dockerd.pid'}",
            f"--config-file={config}",
            "--bridge=none",
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--userland-proxy=false",
            "--log-level=warn",
        ],
        socket=f"/run/{name}.sock",
        log=work / "dockerd.log",
    )
    try:
        daemon.start()
        daemon.load(*images)
        yield daemon
    finally:
        _remove_containers(daemon)
        daemon.stop()
        left = _mounts_under(mountinfo, data_root, exec_root)
        assert not left, f"the test's dockerd left mounts behind: {left}"
        shutil.rmtree(exec_root, ignore_errors=True)
        shutil.rmtree(data_root, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(daemon.socket)
