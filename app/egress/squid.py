"""Squid as a child of the server: its folder, its start, its health, its stop.

The configuration itself is :func:`app.egress.rules.squid_conf`; this module
only lays out the folder Squid runs in (its logs, owned by Squid's user; the ACL
helper, copied beside it so Squid's user can run it; the helper's state file),
starts ``squid -N`` and waits until it listens, and stops it. Squid is asked for
SIGTERM when the server dies (the parent-death signal), but the kernel clears that
when Squid changes to its own user: a server killed with ``kill -9`` leaves its
Squid, which the next process to run Squid stops (``SquidFolder.squid_pid`` finds
it). Its exit is what ``/health`` reports.

The folder is one per deployment at a fixed place (``/run/sandbox-mcp/egress-<tag>``),
shared by every process of ``serve --workers``: whichever of them runs Squid, the
helper reads the same state file and the log is the same file. Its ``lock`` file is
what the processes take (``flock``) before they change a shared file in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from app.egress import acl_helper as egress_acl_helper
from app.egress.rules import ACCESS_LOG, SquidPlan, squid_conf
from app.errors import ConfigurationError

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
    def rotated_log(self) -> Path:
        """The log moved aside, while Squid reopens its own and the rest is counted."""
        return self.root / "log" / f"{ACCESS_LOG}.counting"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def meter(self) -> Path:
        return self.root / "meter.json"  # how far the log was counted (egress_meter)

    @property
    def owner(self) -> Path:
        return self.root / "owner.json"  # which process runs Squid, and Squid's pid

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    def write_state(self, state: dict[str, Any]) -> None:
        """The ACL helper's state, replaced atomically (it may read at any moment)."""
        self.write_json(self.state, state)

    def read_state(self) -> dict[str, Any]:
        return self.read_json(self.state)

    @staticmethod
    def write_json(path: Path, value: dict[str, Any]) -> None:
        """Replaced atomically: a reader in another process never sees half of it."""
        scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        scratch.write_text(json.dumps(value))
        scratch.chmod(0o644)
        scratch.replace(path)

    @staticmethod
    def read_json(path: Path) -> dict[str, Any]:
        """{} when missing or unreadable (a first start, a folder being made)."""
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def squid_pid(self) -> int | None:
        """The pid of the Squid that runs on this folder now, whichever process started
        it (None: none runs)."""
        pid = self.read_json(self.owner).get("squid_pid")
        if not isinstance(pid, int):
            return None
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        return pid if str(self.conf).encode() in command else None

    def move_log_aside(self) -> None:
        """The log renamed to :attr:`rotated_log` (Squid writes on into it until it
        reopens its own, :meth:`reopen_log`). Under the folder's lock."""
        os.replace(self.access_log, self.rotated_log)

    def reopen_log(self, squid_pid: int) -> None:
        """Ask Squid to reopen its log by name (SIGUSR1, ``squid -k rotate``; with
        ``logfile_rotate 0`` it keeps no numbered copies)."""
        with contextlib.suppress(ProcessLookupError):  # gone: the next start empties it
            os.kill(squid_pid, signal.SIGUSR1)

    def truncate_log(self) -> None:
        """Start the log afresh (only while no Squid writes it, after it was counted)."""
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self.access_log, 0)
        self.rotated_log.unlink(missing_ok=True)

    def cache_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "log" / "cache.log").read_text(errors="replace")[-1500:]
        return ""

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class FolderLock:
    """The folder's ``flock``, held by one process (and one task in it) at a time.

    Every change of a shared file (the ACL state, the count of the log, the firewall,
    who runs Squid) is made under it, from what is true at that moment, so two
    processes never interleave; the kernel frees it when its holder dies.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._local = asyncio.Lock()
        self._fd: int | None = None

    async def __aenter__(self) -> None:
        await self._local.acquire()
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        except BaseException:
            self._local.release()
            raise

    async def __aexit__(self, *_: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor frees the flock
        self._local.release()


def folder_root(tag: str) -> Path:
    """The deployment's folder: the same for each of its processes, writable by root
    only (no /tmp name another user could take first)."""
    return Path("/run/sandbox-mcp") / f"egress-{tag}"


def make_folder(
    root: Path,
    *,
    listen: str,
    ceiling: tuple[str, ...],
    not_public: tuple[str, ...],
    test_hosts: tuple[tuple[str, str], ...],
    descriptors: int,
) -> SquidFolder:
    """The folder with Squid's configuration, logs and ACL helper (blocking; made if
    missing, rewritten if there: call it under the folder's lock)."""
    folder = SquidFolder(root)
    logs = folder.root / "log"
    logs.mkdir(parents=True, exist_ok=True)
    folder.root.chmod(0o755)
    user = SQUID_USER if _has_user(SQUID_USER) else None
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(logs, entry.pw_uid, entry.pw_gid)
    helper = folder.root / "acl_helper.py"
    scratch = helper.with_name(f".acl_helper.{os.getpid()}.tmp")
    shutil.copyfile(egress_acl_helper.__file__, scratch)
    scratch.replace(helper)  # a running Squid may start a helper at any moment
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
        descriptors=descriptors,
    )
    folder.conf.write_text(squid_conf(plan))
    return folder


class SquidProcess:
    """One ``squid -N`` on ``folder``'s configuration, listening on ``host:port``, with
    ``descriptors`` open files at most (soft and hard ``RLIMIT_NOFILE``).

    The limit is set before Squid starts: Squid cannot raise its own once it runs as
    its user, and would keep whatever hard limit it inherited (a service manager's,
    a container's) whatever ``max_filedescriptors`` says. The connection bounds per
    sandbox and per address are sized from it (:mod:`app.egress.bounds`), so a
    Squid that did not get it is stopped and the start fails.
    """

    def __init__(
        self, squid: str, folder: SquidFolder, host: str, port: int, descriptors: int
    ) -> None:
        self._squid = squid
        self._folder = folder
        self._host = host
        self._port = port
        self._descriptors = descriptors
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
            ConfigurationError: Squid exited, would not listen in time, or runs with
                fewer descriptors than asked.
        """
        descriptors = self._descriptors
        self._process = await asyncio.create_subprocess_exec(
            self._squid,
            "-N",
            "-f",
            str(self._folder.conf),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: _prepare_child(descriptors),
        )
        try:
            await self._wait_ready()
            got = open_files_limit(self._process.pid)
            if got != descriptors:
                raise ConfigurationError(
                    f"Squid runs with {got} descriptors, not the {descriptors} its "
                    "connection bounds were sized for."
                )
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


def reachable_descriptors(asked: int) -> int:
    """The descriptors Squid can be started with: ``asked``, if this process's hard
    limit allows it or can be raised to it (``CAP_SYS_RESOURCE``, up to
    ``fs.nr_open``), else that hard limit (what Squid would get anyway)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= asked:
        return asked
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, asked))  # only the hard one
    except (OSError, ValueError):
        return int(hard)
    return asked


def open_files_limit(pid: int) -> int | None:
    """The soft ``Max open files`` of process ``pid`` (/proc/<pid>/limits); None if gone."""
    try:
        text = Path(f"/proc/{pid}/limits").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Max open files"):
            soft = line.removeprefix("Max open files").split()[0]
            return int(soft) if soft.isdecimal() else None
    return None


def _prepare_child(descriptors: int) -> None:
    """In the child, before exec: its descriptors (soft = hard, as
    :func:`reachable_descriptors` found them; failing, the check after the start
    says so), and SIGTERM
    when the server dies (until Squid changes to its user, which clears it: see the
    module doc)."""
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
