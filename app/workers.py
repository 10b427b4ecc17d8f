"""``sandbox-mcp serve --workers N``: N server processes on one listening socket.

The parent binds the port once and starts N ``sandbox-mcp serve`` children that
inherit the socket (the kernel spreads connections among them); it restarts a
child that dies and stops them all on SIGTERM or SIGINT. The children share
nothing but the socket, the state dir and PostgreSQL: every promise that spans
processes (the pool, its queue, its watchdog) is kept in the database, so any
child can serve any call.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from types import FrameType

import structlog

log = structlog.get_logger(__name__)

LISTEN_FD_FLAG = "--listen-fd"
RESTART_PAUSE_S = 1.0


def refusal(workers: int, database_url: str, *, egress_proxy: bool = False) -> str | None:
    """Why ``workers`` processes cannot serve this database, or None if they can."""
    if workers > 1 and egress_proxy:
        # Each process would start its own Squid on the one proxy address: all but
        # the first exit at once ("Unable to open HTTP Socket").
        return (
            f"--workers {workers} cannot offer network 'restricted' (SANDBOX_MCP_EGRESS_PROXY): "
            "its proxy listens on one address of the host, so one process runs it; serve "
            "with --workers 1, or unset SANDBOX_MCP_EGRESS_PROXY"
        )
    if workers > 1 and not database_url.startswith("postgresql"):
        return (
            f"--workers {workers} needs PostgreSQL: several processes share their state "
            "through it, and SQLite serves one process only; set SANDBOX_MCP_DATABASE_URL="
            "postgresql+asyncpg://... or serve with --workers 1"
        )
    return None


class Supervisor:
    """Keeps ``workers`` children serving on ``sock`` until told to stop."""

    def __init__(self, sock: socket.socket, workers: int, argv: list[str]) -> None:
        self._sock = sock
        self._workers = workers
        self._argv = argv  # the child's command, without the socket flag
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._stopping = False

    def _start(self, slot: int) -> None:
        fd = self._sock.fileno()
        child = subprocess.Popen(  # noqa: S603 - our own command line
            [*self._argv, LISTEN_FD_FLAG, str(fd)],
            pass_fds=(fd,),
            env={**os.environ, "SANDBOX_MCP_WORKERS": "1"},
        )
        self._children[slot] = child
        log.info("workers.started", worker=slot, pid=child.pid)

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self._stopping = True
        for child in self._children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for slot in range(self._workers):
            self._start(slot)
        while not self._stopping:
            time.sleep(0.2)
            for slot, child in list(self._children.items()):
                if child.poll() is not None and not self._stopping:
                    # Its leases stay in the database: the others (and its successor)
                    # serve them; the watchdog moves to another process if it held it.
                    log.warning("workers.died", worker=slot, pid=child.pid, code=child.returncode)
                    time.sleep(RESTART_PAUSE_S)
                    self._start(slot)
        codes = [child.wait() for child in self._children.values()]
        log.info("workers.stopped", codes=codes)
        return 0


def child_argv(transport_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "app", "serve", *transport_args]
