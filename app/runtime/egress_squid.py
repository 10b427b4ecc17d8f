"""Squid as a child of the server: its folder, its start, its health, its stop.

The configuration itself is :func:`app.runtime.egress_rules.squid_conf`; this module
only lays out the folder Squid runs in (its logs, owned by Squid's user; the ACL
helper, copied beside it so Squid's user can run it; the helper's state file),
starts ``squid -N`` and waits until it listens, and stops it. Squid gets SIGTERM
if the server dies however it dies (the parent-death signal), and its exit is
what ``/health`` reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from app.errors import ConfigurationError
from app.runtime import egress_acl_helper
from app.runtime.egress_rules import ACCESS_LOG, SquidPlan, squid_conf

READY_TIMEOUT_S: Final = 20.0
SQUID_USER: Final = "proxy"  # Debian's squid user


@dataclass(frozen=True)
class SquidFolder:
    """Where one Squid runs: made by :func:`make_folder`, removed by :meth:`remove`."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "squid.conf"

    @property
    def access_log(self) -> Path:
        return self.root / "log" / ACCESS_LOG

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    def write_state(self, state: dict[str, Any]) -> None:
        """The ACL helper's state, replaced atomically (it may read at any moment)."""
        scratch = self.state.with_suffix(".tmp")
        scratch.write_text(json.dumps(state))
        scratch.chmod(0o644)
        scratch.replace(self.state)

    def cache_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "log" / "cache.log").read_text(errors="replace")[-1500:]
        return ""

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def make_folder(
    *,
    listen: str,
    ceiling: tuple[str, ...],
    not_public: tuple[str, ...],
    test_hosts: tuple[tuple[str, str], ...],
) -> SquidFolder:
    """A new folder with Squid's configuration, logs and ACL helper (blocking)."""
    folder = SquidFolder(Path(tempfile.mkdtemp(prefix="sandbox-mcp-egress-")))
    logs = folder.root / "log"
    logs.mkdir()
    folder.root.chmod(0o755)
    user = SQUID_USER if _has_user(SQUID_USER) else None
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(logs, entry.pw_uid, entry.pw_gid)
    helper = folder.root / "acl_helper.py"
    shutil.copyfile(egress_acl_helper.__file__, helper)
    hosts = None
    if test_hosts:
        hosts = folder.root / "hosts"
        hosts.write_text("".join(f"{a} {n}\n" for n, a in test_hosts))
    plan = SquidPlan(
        listen=listen,
        workdir=logs,
        ceiling=ceiling,
        not_public=not_public,
        helper=(_system_python(), str(helper), str(folder.state)),
        hosts_file=hosts,
        user=user,
    )
    folder.conf.write_text(squid_conf(plan))
    return folder


class SquidProcess:
    """One ``squid -N`` on ``folder``'s configuration, listening on ``host:port``."""

    def __init__(self, squid: str, folder: SquidFolder, host: str, port: int) -> None:
        self._squid = squid
        self._folder = folder
        self._host = host
        self._port = port
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def exit_code(self) -> int | None:
        """None while it runs (or before it started)."""
        return None if self._process is None else self._process.returncode

    async def start(self) -> None:
        """Start Squid and wait until it listens.

        Raises:
            ConfigurationError: Squid exited or would not listen in time.
        """
        self._process = await asyncio.create_subprocess_exec(
            self._squid,
            "-N",
            "-f",
            str(self._folder.conf),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        try:
            await self._wait_ready()
        except BaseException:
            self._process.kill()
            await self._process.wait()
            raise

    async def stop(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.returncode is not None:
                raise ConfigurationError(
                    f"Squid exited at start ({self._process.returncode}): "
                    f"{self._folder.cache_log()}"
                )
            try:
                _, writer = await asyncio.open_connection(self._host, self._port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise ConfigurationError(
            f"Squid did not listen in {READY_TIMEOUT_S:g} s: {self._folder.cache_log()}"
        )


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _system_python() -> str:
    # Squid's user must be able to run it: not a virtualenv in root's home.
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the server dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
