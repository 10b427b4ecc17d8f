"""Which server process runs Squid, and running it there (network "restricted").

One address, so one Squid for the deployment (see :mod:`app.egress.proxy`).
The process that runs it is elected like the watchdog (``leadership``: a PostgreSQL
session advisory lock; on SQLite there is one process, always elected). Every
process tries each poll; when the one running Squid dies, its database session ends
and the lock is free. The next process elected stops the dead one's Squid (with
``kill -9`` it is left running: the parent-death signal does not survive Squid's
change of user), counts the last lines of the log and starts Squid again on the
same address and folder. A process that lost the lock but lives stops its own Squid
at its next poll; the one elected waits for that, ``ORPHAN_WAIT_S`` at most. A
database that drops the elected process's session also stops Squid until the next
election (a second or two).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Final

import structlog

from app.egress.meter import POLL_S, EgressMeter
from app.egress.squid import SquidFolder, SquidProcess
from pool.watchdog import Leadership

log = structlog.get_logger(__name__)

ORPHAN_WAIT_S: Final = 10.0  # for the last elected process to stop its own Squid


@dataclass(frozen=True)
class SquidSite:
    """Where this deployment's Squid runs: its binary, folder and listening address."""

    squid: str
    folder: SquidFolder
    gateway: str
    port: int
    descriptors: int  # Squid's RLIMIT_NOFILE
    log_fields: dict[str, Any]  # what ``egress.started`` says besides the pid


class SquidOwner:
    """Runs Squid while this process is elected; tells ``/health`` who runs it."""

    def __init__(self, folder: SquidFolder, leadership: Leadership, process_id: str) -> None:
        self._folder = folder
        self._leadership = leadership
        self._process_id = process_id
        self._squid: SquidProcess | None = None  # only in the process elected
        self._told_death = False
        self._waiting_since: float | None = None  # for another process's Squid to stop
        self.stopping = False

    async def is_elected(self) -> bool:
        return await self._leadership.is_leader()

    async def take_over(self, site: SquidSite, meter: EgressMeter) -> bool:
        """Start Squid here (this process was elected): the last Squid's lines counted
        first. False while the last one is still ending (retried at the next poll).

        Raises:
            ConfigurationError: Squid would not start.
        """
        async with meter.lock:
            if not await self._end_orphan():
                return False  # the last process's Squid: it stops it (next poll)
            await meter.restart_log()
            squid = SquidProcess(
                site.squid, self._folder, site.gateway, site.port, site.descriptors
            )
            await squid.start()
            self._squid, self._told_death = squid, False
            owner = {"process_id": self._process_id, "pid": os.getpid(), "squid_pid": squid.pid}
            await asyncio.to_thread(self._folder.write_json, self._folder.owner, owner)
        log.info("egress.started", pid=squid.pid, **site.log_fields)
        return True

    async def tick(self, site: SquidSite, meter: EgressMeter) -> None:
        """One poll: run Squid if elected (and it does not run yet), count the log and
        stop who reaches the cap mid-transfer if running it; say once when it died."""
        elected = await self._leadership.is_leader()
        squid = self._squid
        if squid is None:
            if elected and not self.stopping:
                await self.take_over(site, meter)
            return
        if not elected:  # the database session went: another process may start one
            log.warning("egress.leadership_lost")
            self._squid = None
            await squid.stop()
            return
        if squid.exit_code is not None:
            if not self._told_death and not self.stopping:
                self._told_death = True
                log.error("egress.proxy_died", code=squid.exit_code, log=self._folder.cache_log())
                owner = {"process_id": self._process_id, "exit_code": squid.exit_code}
                await asyncio.to_thread(self._folder.write_json, self._folder.owner, owner)
            return
        await meter.read_log()
        await meter.check_live()

    async def stop(self, meter: EgressMeter | None) -> None:
        """Stop Squid if it runs here (its last lines counted), and stand down."""
        self.stopping = True
        if self._squid is not None:
            await self._squid.stop()  # it logs the connections it still held
            if meter is not None:
                with contextlib.suppress(Exception):  # their bytes, recorded for the next
                    async with meter.lock:
                        await meter.read_log_locked()
                        self._folder.owner.unlink(missing_ok=True)
        await self._leadership.close()  # another process may take Squid over from now

    def health(self) -> dict[str, Any]:
        """Whether Squid runs, whichever process runs it (the shared folder says)."""
        squid = self._squid
        if squid is not None:
            return _health_of(squid.exit_code, self._process_id)
        owner = self._folder.read_json(self._folder.owner)
        if self._folder.squid_pid() is not None:
            return {"ok": True, "proxy": "squid", "run_by": owner.get("process_id")}
        code = owner.get("exit_code")
        if isinstance(code, int):
            return _health_of(code, str(owner.get("process_id")))
        return {
            "ok": False,
            "proxy": "squid",
            "reason": (
                "no server process runs the egress proxy (squid) at the moment (the one "
                f"that ran it stopped); another takes it over within {2 * POLL_S:g} s or "
                "so, and experiments in network 'restricted' have no network meanwhile"
            ),
        }

    async def _end_orphan(self) -> bool:
        """Whether no Squid runs on the folder any more; one whose process died is
        stopped here (the parent-death signal does not survive Squid's change of user,
        so a process killed with kill -9 leaves its Squid behind)."""
        pid = self._folder.squid_pid()
        if pid is None:
            return True
        owner = self._folder.read_json(self._folder.owner).get("pid")
        if isinstance(owner, int) and owner != os.getpid() and _alive(owner):
            # Alive, and it lost the election: it stops its own at its next poll. One
            # that does not (a wedged process, or its pid reused) is not waited for.
            waiting = self._waiting_since = self._waiting_since or time.monotonic()
            if time.monotonic() - waiting < ORPHAN_WAIT_S:
                return False
        self._waiting_since = None
        log.warning("egress.orphan_stopped", pid=pid)
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if self._folder.squid_pid() is None:
                    return True
                await asyncio.sleep(0.05)
        return False


def _health_of(code: int | None, process_id: str) -> dict[str, Any]:
    if code is None:
        return {"ok": True, "proxy": "squid", "run_by": process_id}
    return {
        "ok": False,
        "proxy": "squid",
        "reason": (
            f"the egress proxy (squid) exited with code {code}; "
            "experiments in network 'restricted' have no network until the server "
            "process that ran it restarts"
        ),
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
