"""``sandbox-mcp serve --workers N``: N server processes on one listening socket.

The parent binds the port once and starts N ``sandbox-mcp serve`` children that
inherit the socket (the kernel spreads connections among them); it restarts a
child that dies, after a pause that grows while it keeps dying (``RestartPolicy``),
and stops them all on SIGTERM or SIGINT. The children share nothing but the
socket, the state dir and PostgreSQL: every promise that spans processes (the
pool, its queue, its watchdog, the proxy of network "restricted") is kept in the
database (or, for the proxy, a folder they share), so any child can serve
any call.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import structlog

log = structlog.get_logger(__name__)

LISTEN_FD_FLAG = "--listen-fd"
POLL_S = 0.2


@dataclass(frozen=True)
class RestartPolicy:
    """How soon a dead child is started again.

    A child that dies soon after it started (a bad setting, PostgreSQL refusing it, a
    full disk) would die again at once: each death in a row doubles the pause, from
    ``first_s`` up to ``cap_s``. A child that served ``stable_s`` or longer died of
    something else, and the count starts over. The supervisor never gives up: the
    causes of a start-up crash are mostly outside it and pass (the database comes
    back, the disk is freed), a supervisor that stopped would turn a passing outage
    into a lasting one, and at one attempt per ``cap_s`` the loop costs nothing. The
    log says, once the pause reaches the cap, that the child is crash-looping and why
    to look at its own lines above.
    """

    first_s: float = 1.0
    cap_s: float = 60.0
    stable_s: float = 60.0

    def pause(self, deaths_in_a_row: int) -> float:
        return float(min(self.cap_s, self.first_s * 2 ** max(0, deaths_in_a_row - 1)))


@dataclass
class _Worker:
    child: subprocess.Popen[bytes]
    started_at: float
    deaths_in_a_row: int = 0
    restart_at: float | None = None  # set while it waits out its pause


def refusal(workers: int, database_url: str) -> str | None:
    """Why ``workers`` processes cannot serve this database, or None if they can."""
    if workers > 1 and not database_url.startswith("postgresql"):
        return (
            f"--workers {workers} needs PostgreSQL: several processes share their state "
            "through it, and SQLite serves one process only; set SANDBOX_MCP_DATABASE_URL="
            "postgresql+asyncpg://... or serve with --workers 1"
        )
    return None


class Supervisor:
    """Keeps ``workers`` children serving on ``sock`` until told to stop."""

    def __init__(
        self,
        sock: socket.socket,
        workers: int,
        argv: list[str],
        *,
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sock = sock
        self._workers = workers
        self._argv = argv  # the child's command, without the socket flag
        self._policy = policy or RestartPolicy()
        self._clock = clock
        self._slots: dict[int, _Worker] = {}
        self._stopping = False

    @property
    def children(self) -> dict[int, subprocess.Popen[bytes]]:
        return {slot: worker.child for slot, worker in self._slots.items()}

    def _spawn(self, slot: int) -> subprocess.Popen[bytes]:
        fd = self._sock.fileno()
        child = subprocess.Popen(  # noqa: S603 - our own command line
            [*self._argv, LISTEN_FD_FLAG, str(fd)],
            pass_fds=(fd,),
            env={**os.environ, "SANDBOX_MCP_WORKERS": "1"},
        )
        log.info("workers.started", worker=slot, pid=child.pid)
        return child

    def start_all(self) -> None:
        for slot in range(self._workers):
            self._slots[slot] = _Worker(self._spawn(slot), self._clock())

    def tick(self) -> None:
        """Notice dead children and start those whose pause is over."""
        now = self._clock()
        for slot, worker in self._slots.items():
            if self._stopping:
                return
            if worker.restart_at is not None:
                if now >= worker.restart_at:
                    worker.child, worker.started_at = self._spawn(slot), now
                    worker.restart_at = None
                continue
            if worker.child.poll() is None:
                continue
            # Its leases stay in the database: the others (and its successor) serve
            # them; the watchdog moves to another process if it held it.
            uptime = now - worker.started_at
            worker.deaths_in_a_row = (
                1 if uptime >= self._policy.stable_s else worker.deaths_in_a_row + 1
            )
            pause = self._policy.pause(worker.deaths_in_a_row)
            worker.restart_at = now + pause
            log.warning(
                "workers.died",
                worker=slot,
                pid=worker.child.pid,
                code=worker.child.returncode,
                uptime_s=round(uptime, 1),
                deaths_in_a_row=worker.deaths_in_a_row,
                restart_in_s=pause,
            )
            if pause >= self._policy.cap_s:
                log.error(
                    "workers.crash_looping",
                    worker=slot,
                    deaths_in_a_row=worker.deaths_in_a_row,
                    restart_in_s=pause,
                    message=f"worker {slot} keeps dying within {self._policy.stable_s:g} s of "
                    f"starting; it is restarted every {pause:g} s until it stays up. Its own "
                    "log lines above say why (often the database or the state dir)",
                )

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self._stopping = True
        for worker in self._slots.values():
            if worker.child.poll() is None:
                worker.child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.start_all()
        while not self._stopping:
            time.sleep(POLL_S)
            self.tick()
        codes = [worker.child.wait() for worker in self._slots.values()]
        log.info("workers.stopped", codes=codes)
        return 0


def child_argv(transport_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "app", "serve", *transport_args]
