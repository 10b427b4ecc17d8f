"""Network "restricted": Squid, run by the server, as an experiment's only way out.

The layout, and why it is the simplest safe one:

* Restricted containers join one Docker network of this deployment, created
  ``--internal`` (Docker drops every packet that would leave its bridge) and without
  inter-container traffic (``enable_icc=false``: two experiments never reach each
  other). Nothing on it can route anywhere.
* Squid (Debian's package) runs on the host, listening only on that bridge's gateway
  address, one port. An ``--internal`` network still reaches the host itself (the
  INPUT chain, not FORWARD), so an iptables chain of ours, hooked on INPUT for that
  bridge, accepts only TCP to the proxy's address and port and drops the rest, and
  ip6tables drops everything (:mod:`app.runtime.egress_network`). A proxy container
  on two networks would need an image of its own and a network per experiment; this
  needs neither.
* Squid resolves names itself and applies :mod:`app.runtime.egress_rules`: the
  operator's ceiling, the experiment's own list (an external ACL helper reads it, by
  client address, from a state file we rewrite), no destination that is not public,
  443 for CONNECT (no TLS interception) and 80 for plain http.
* Squid's access log tells who was refused and who moved how many bytes
  (:mod:`app.runtime.egress_usage`): a client address is a container of one
  experiment (mapped when the container starts). Refusals are handed to that
  experiment's next command result; bytes are counted in ``/metrics`` and against
  its cap, recorded in the database and enforced while a transfer runs
  (:mod:`app.runtime.egress_meter`).

Several processes (``serve --workers N``): one address, so one Squid. The process
that runs it is elected like the watchdog (a PostgreSQL session advisory lock,
``leadership``; on SQLite there is one process, always elected). Every process
tries each poll; when the one running Squid dies, its database session ends and
the lock is free. The next process elected stops the dead one's Squid (with
``kill -9`` it is left running: the parent-death signal does not survive Squid's
change of user), counts the last lines of the log and starts Squid again on the
same address and folder. A process that lost the lock but lives stops its own
Squid at its next poll; the one elected waits for that, ``ORPHAN_WAIT_S`` at most.
A database that drops the elected process's session also stops Squid until the
next election (a second or two). Every process
creates restricted containers and writes the ACL state and counts the log (under
the folder's lock, see :mod:`app.runtime.egress_meter`), so nothing of a
container lives in one process's memory. ``/health`` on each says whether Squid
runs, whichever process runs it.

The iptables chain stays when the server stops: experiment containers outlive a
restart, and must not reach the host meanwhile. It is removed with the network,
once no container is left on it and no other process serves. Squid is started
with the process elected and stopped with it, and its death is reported by
``/health`` on every process (:mod:`app.runtime.egress_squid`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import docker
import structlog

from app.errors import ConfigurationError, InvalidArgument
from app.runtime.egress_meter import POLL_S, EgressMeter, UsageRecords, describe
from app.runtime.egress_network import (
    ensure_network,
    host_addresses,
    install_firewall,
    remove_if_unused,
)
from app.runtime.egress_rules import clamp_allowlist, matches, not_public_ranges
from app.runtime.egress_squid import SquidFolder, SquidProcess, folder_root, make_folder
from app.runtime.egress_usage import Client
from app.storage.egress_store import Usage
from pool.background import cancel_and_wait
from pool.watchdog import Leadership, SoleWatchdog

log = structlog.get_logger(__name__)

ALLOW_LABEL: Final = "egress-allow"  # <prefix>.egress-allow: the container's list
ORPHAN_WAIT_S: Final = 10.0  # for the last elected process to stop its own Squid


@dataclass(frozen=True)
class EgressConfig:
    ceiling: tuple[str, ...]
    max_bytes: int  # per experiment
    deployment: str
    port: int = 3128
    squid: str = "squid"
    test_hosts: tuple[tuple[str, str], ...] = ()  # test-only: (name, address) for Squid
    label_prefix: str = "io.sandbox-mcp"

    @property
    def network(self) -> str:
        return f"sandbox-mcp-restricted-{self._tag}"

    @property
    def bridge(self) -> str:
        return f"smcpr-{self._tag}"  # an interface name: 15 characters at most

    @property
    def chain(self) -> str:
        return f"SMCP-EGRESS-{self._tag}"

    @property
    def folder(self) -> Path:
        return folder_root(self._tag)

    @property
    def _tag(self) -> str:
        return hashlib.sha256(self.deployment.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class RestrictedPlan:
    network: str
    env: dict[str, str]
    labels: dict[str, str]
    allowlist: tuple[str, ...]
    warnings: tuple[str, ...]


class EgressProxy:
    """Squid for this deployment's restricted containers (see the module doc)."""

    def __init__(
        self,
        config: EgressConfig,
        *,
        usage: UsageRecords,
        client_factory: Callable[[], docker.DockerClient] = docker.from_env,
        on_refused: Callable[[str], None] = lambda reason: None,
        on_bytes: Callable[[int], None] = lambda size: None,
        leadership: Leadership | None = None,
        process_id: str = "",
        others_live: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.config = config
        self._client_factory = client_factory
        self._usage = usage
        self._on_refused = on_refused
        self._on_bytes = on_bytes
        self._leadership = leadership or SoleWatchdog()
        self._process_id = process_id
        self._others_live = others_live  # None: this process is the only one
        self._docker: docker.DockerClient | None = None
        self._gateway: str | None = None
        self._folder = SquidFolder(config.folder)
        self._meter: EgressMeter | None = None
        self._squid: SquidProcess | None = None  # only in the process elected
        self._squid_path = ""
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False
        self._told_death = False
        self._waiting_since: float | None = None  # for another process's Squid to stop

    # -- what experiments see ---------------------------------------------------------

    @property
    def network(self) -> str:
        return self.config.network

    @property
    def proxy_url(self) -> str:
        assert self._gateway is not None, "started"
        return f"http://{self._gateway}:{self.config.port}"

    def env(self) -> dict[str, str]:
        """The proxy settings the usual tools read (curl, pip, npm, git, cargo, go)."""
        url = self.proxy_url
        none = "localhost,127.0.0.1,::1"
        return {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "NO_PROXY": none,
            "no_proxy": none,
            "PIP_PROXY": url,
            "npm_config_proxy": url,
            "npm_config_https_proxy": url,
            "CARGO_HTTP_PROXY": url,
        }

    def allow_label(self) -> str:
        return f"{self.config.label_prefix}.{ALLOW_LABEL}"

    def plan(self, asked: tuple[str, ...] | None) -> RestrictedPlan:
        """How to create a restricted container asking for ``asked`` (None: the ceiling).

        Raises:
            InvalidArgument: a name that is not a host name.
        """
        try:
            clamped = clamp_allowlist(asked, self.config.ceiling)
        except ValueError as exc:
            raise InvalidArgument(f"egress_allowlist: {exc}.", field="egress_allowlist") from None
        return RestrictedPlan(
            network=self.network,
            env=self.env(),
            labels={self.allow_label(): ",".join(clamped.names)},
            allowlist=clamped.names,
            warnings=(clamped.warning,) if clamped.warning else (),
        )

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Create the network and its firewall and the shared folder; start Squid if
        this process is elected to (else another runs it, or will take it over).

        Raises:
            ConfigurationError: not root, no squid or ss, or Squid would not start.
        """
        if os.geteuid() != 0:
            raise ConfigurationError(
                "network 'restricted' needs the server to run as root on the Docker host "
                "(it sets iptables rules for the proxy); unset SANDBOX_MCP_EGRESS_PROXY."
            )
        squid = shutil.which(self.config.squid)
        if squid is None:
            raise ConfigurationError(
                f"network 'restricted' needs Squid ({self.config.squid} was not found): "
                "apt-get install squid, or unset SANDBOX_MCP_EGRESS_PROXY."
            )
        if shutil.which("ss") is None:
            raise ConfigurationError(
                "network 'restricted' needs ss (iproute2) to enforce the egress byte cap "
                "during a transfer: apt-get install iproute2."
            )
        self._squid_path = squid
        self._docker = self._client_factory()
        await asyncio.to_thread(self._folder.root.mkdir, mode=0o755, parents=True, exist_ok=True)
        meter = EgressMeter(
            self._folder,
            self._usage,
            max_bytes=self.config.max_bytes,
            scan=self._scan,
            on_refused=self._on_refused,
            on_bytes=self._on_bytes,
        )
        async with meter.lock:
            self._gateway = await asyncio.to_thread(self._prepare)
        meter.proxy = (self._gateway, self.config.port)
        self._meter = meter
        # Containers that outlived a restart keep their lists, their counts and caps.
        await self._meter.refresh_state()
        if await self._leadership.is_leader():
            await self._take_over()
        self._watcher = asyncio.create_task(self._watch(), name="egress-proxy-watch")

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._watcher)
        meter = self._meter
        if self._squid is not None:
            await self._squid.stop()  # it logs the connections it still held
            if meter is not None:
                with contextlib.suppress(Exception):  # their bytes, recorded for the next
                    async with meter.lock:
                        await meter.read_log_locked()
                        self._folder.owner.unlink(missing_ok=True)
        await self._leadership.close()  # another process may take Squid over from now
        if meter is not None and not await self._others_serve():
            async with meter.lock:
                await asyncio.to_thread(self._cleanup)
        if self._docker is not None:
            self._docker.close()
        log.info("egress.stopped")

    async def _others_serve(self) -> bool:
        """Whether other processes still serve (they need the network): when the
        database cannot say, they may."""
        if self._others_live is None:
            return False
        try:
            return await self._others_live()
        except Exception:
            return True

    def health(self) -> dict[str, Any]:
        squid = self._squid
        if squid is not None:
            return self._health_of(squid.exit_code, self._process_id)
        owner = self._folder.read_json(self._folder.owner)
        if self._folder.squid_pid() is not None:
            return {"ok": True, "proxy": "squid", "run_by": owner.get("process_id")}
        code = owner.get("exit_code")
        if isinstance(code, int):
            return self._health_of(code, str(owner.get("process_id")))
        return {
            "ok": False,
            "proxy": "squid",
            "reason": (
                "no server process runs the egress proxy (squid) at the moment (the one "
                f"that ran it stopped); another takes it over within {2 * POLL_S:g} s or "
                "so, and experiments in network 'restricted' have no network meanwhile"
            ),
        }

    def _health_of(self, code: int | None, process_id: str) -> dict[str, Any]:
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

    # -- containers -------------------------------------------------------------------

    async def attach(self, api: docker.APIClient, container_id: str) -> None:
        """A started restricted container: the state maps its address to it (its list
        is its label; a recreated one's experiment keeps its count and cap)."""
        assert self._meter is not None
        await self._meter.refresh_state()

    async def detach(self, container_id: str) -> None:
        """Forget a removed container (after its last log lines are read)."""
        if self._meter is None:
            return
        forgotten = await self._meter.forget(container_id)
        if forgotten is None:
            return
        client, usage = forgotten
        # Each container's egress, recorded once when it goes (its experiment's totals).
        log.info(
            "egress.usage",
            experiment_id=client.experiment_id,
            container_id=container_id[:12],
            bytes=usage.bytes,
            **describe(usage),
        )

    async def take_notice(self, container_id: str) -> str | None:
        """What the proxy refused this container since the last notice, for its result."""
        return None if self._meter is None else await self._meter.take_notice(container_id)

    async def usage_of(self, experiment_id: str) -> Usage:
        """What an experiment moved and was refused so far (the database's count)."""
        return (await self._usage.load([experiment_id])).get(experiment_id, Usage(0, False))

    # -- Squid, in the process elected --------------------------------------------------

    async def _take_over(self) -> bool:
        """Start Squid here (this process was elected): the last Squid's lines counted
        first. False while the last one is still ending (retried at the next poll).

        Raises:
            ConfigurationError: Squid would not start.
        """
        assert self._meter is not None
        assert self._gateway is not None
        async with self._meter.lock:
            if not await self._end_orphan():
                return False  # the last process's Squid: it stops it (next poll)
            await self._meter.restart_log()
            squid = SquidProcess(self._squid_path, self._folder, self._gateway, self.config.port)
            await squid.start()
            self._squid, self._told_death = squid, False
            owner = {"process_id": self._process_id, "pid": os.getpid(), "squid_pid": squid.pid}
            await asyncio.to_thread(self._folder.write_json, self._folder.owner, owner)
        log.info(
            "egress.started",
            proxy=self.proxy_url,
            network=self.network,
            pid=squid.pid,
            allowlist=len(self.config.ceiling),
        )
        return True

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

    async def _watch(self) -> None:
        """Every poll: run Squid if elected (and it does not run yet), count the log and
        stop who reaches the cap mid-transfer if running it; say once when it died."""
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self._tick()
            except Exception:
                log.exception("egress.tick_failed")

    async def _tick(self) -> None:
        assert self._meter is not None
        elected = await self._leadership.is_leader()
        squid = self._squid
        if squid is None:
            if elected and not self._stopping:
                await self._take_over()
            return
        if not elected:  # the database session went: another process may start one
            log.warning("egress.leadership_lost")
            self._squid = None
            await squid.stop()
            return
        if squid.exit_code is not None:
            if not self._told_death and not self._stopping:
                self._told_death = True
                log.error("egress.proxy_died", code=squid.exit_code, log=self._folder.cache_log())
                owner = {"process_id": self._process_id, "exit_code": squid.exit_code}
                await asyncio.to_thread(self._folder.write_json, self._folder.owner, owner)
            return
        await self._meter.read_log()
        await self._meter.check_live()

    # -- internals --------------------------------------------------------------------

    def _prepare(self) -> str:
        """The network, its firewall, Squid's folder and configuration (blocking, under
        the folder's lock); the gateway's address."""
        assert self._docker is not None
        api, config = self._docker.api, self.config
        labels = {f"{config.label_prefix}.role": "egress-restricted"}
        gateway = ensure_network(api, config.network, config.bridge, labels)
        install_firewall(config.bridge, config.chain, gateway, config.port)
        make_folder(
            self._folder.root,
            listen=f"{gateway}:{config.port}",
            ceiling=config.ceiling,
            not_public=not_public_ranges(host_addresses()),
            test_hosts=config.test_hosts,
        )
        return gateway

    def _cleanup(self) -> None:
        """The last process gone: the network and firewall too, if no container is left."""
        assert self._docker is not None
        config = self.config
        if remove_if_unused(self._docker.api, config.network, config.bridge, config.chain):
            self._folder.remove()

    def _scan(self) -> list[Client]:
        """The running containers on the restricted network, as the ACL state lists them
        (blocking: one Docker call)."""
        assert self._docker is not None
        prefix = self.config.label_prefix
        found = []
        for info in self._docker.api.containers(filters={"network": self.network}):
            networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
            address = (networks.get(self.network) or {}).get("IPAddress")
            if not address:
                continue
            labels = info.get("Labels") or {}
            allow = tuple(
                n
                for n in labels.get(self.allow_label(), "").split(",")
                if n and matches(n.lstrip("."), self.config.ceiling)
            )
            found.append(
                Client(str(info["Id"]), address, allow, labels.get(f"{prefix}.experiment", ""))
            )
        return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
