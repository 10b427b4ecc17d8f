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

The iptables chain stays when the server stops: experiment containers outlive a
restart, and must not reach the host meanwhile. It is removed with the network,
once no container is left on it. Squid is started with the server, stopped with it
(and killed with it: the parent-death signal), and its death is reported by
``/health`` (:mod:`app.runtime.egress_squid`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import docker
import structlog

from app.errors import ConfigurationError, InvalidArgument
from app.runtime.egress_meter import POLL_S, EgressMeter, UsageRecords
from app.runtime.egress_network import (
    ensure_network,
    host_addresses,
    install_firewall,
    network_containers,
    remove_if_unused,
)
from app.runtime.egress_rules import clamp_allowlist, matches, not_public_ranges
from app.runtime.egress_sockets import open_connections
from app.runtime.egress_squid import SquidFolder, SquidProcess, make_folder
from app.runtime.egress_usage import Client, Ledger
from pool.background import cancel_and_wait

log = structlog.get_logger(__name__)

ALLOW_LABEL: Final = "egress-allow"  # <prefix>.egress-allow: the container's list
SETTLE_S: Final = 0.5


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
    ) -> None:
        self.config = config
        self._client_factory = client_factory
        self._ledger = Ledger(config.max_bytes, on_refused=on_refused, on_bytes=on_bytes)
        self._meter = EgressMeter(self._ledger, usage, write_state=self._write_state)
        self._gateway: str | None = None
        self._folder: SquidFolder | None = None
        self._squid: SquidProcess | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

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
        """Create the network and its firewall, start Squid, wait until it listens.

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
        folder = await asyncio.to_thread(self._prepare)
        assert self._gateway is not None
        # Containers that outlived a restart continue from their recorded bytes.
        await self._meter.load(self._ledger.experiments())
        self._squid = SquidProcess(squid, folder, self._gateway, self.config.port)
        try:
            await self._squid.start()
        except BaseException:
            await asyncio.to_thread(self._cleanup)
            raise
        self._meter.open(folder.access_log, self._gateway, self.config.port)
        self._watcher = asyncio.create_task(self._watch(), name="egress-proxy-watch")
        log.info(
            "egress.started",
            proxy=self.proxy_url,
            network=self.network,
            pid=self._squid.pid,
            allowlist=len(self.config.ceiling),
        )

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._watcher)
        if self._squid is not None:
            await self._squid.stop()  # it logs the connections it still held
        with contextlib.suppress(Exception):  # their bytes, recorded for the next start
            await self._meter.read_log()
        await asyncio.to_thread(self._cleanup)
        log.info("egress.stopped")

    def health(self) -> dict[str, Any]:
        squid = self._squid
        code = None if squid is None else squid.exit_code
        if code is None:
            return {"ok": squid is not None, "proxy": "squid"}
        return {
            "ok": False,
            "proxy": "squid",
            "reason": (
                f"the egress proxy (squid) exited with code {code}; "
                "experiments in network 'restricted' have no network until the server "
                "restarts"
            ),
        }

    # -- containers -------------------------------------------------------------------

    async def attach(self, api: docker.APIClient, container_id: str) -> None:
        """Map a started restricted container's address to it (its list is its label)."""
        info = await asyncio.to_thread(api.inspect_container, container_id)
        client = self._register(info)
        if client is not None and client.experiment_id:
            await self._meter.load([client.experiment_id])  # a recreated container: same cap
        await asyncio.to_thread(self._write_state)

    async def detach(self, container_id: str) -> None:
        """Forget a removed container (after its last log lines are read)."""
        if self._ledger.get(container_id) is None:
            return
        await self._meter.read_log()
        client = self._ledger.get(container_id)
        total = self._ledger.usage_of(client.experiment_id) if client else 0
        client = self._ledger.remove(container_id)
        if client is None:
            return
        # Each container's egress, recorded once when it goes (its experiment's total too).
        log.info(
            "egress.usage",
            experiment_id=client.experiment_id,
            container_id=container_id[:12],
            bytes=client.bytes,
            experiment_bytes=total,
            refused=client.refusals,
            capped=client.blocked,
        )
        await asyncio.to_thread(self._write_state)

    async def take_notice(self, container_id: str) -> str | None:
        """What the proxy refused this container since the last notice, for its result."""
        client = self._ledger.get(container_id)
        if client is None:
            return None
        await self._settle(client.address)
        await self._meter.read_log()
        return self._ledger.notice(container_id)

    async def _settle(self, address: str) -> None:
        """Wait (briefly) until Squid has closed this client's connections.

        Squid logs a connection when it ends, a moment after the command that made it
        exited; until then its last lines (the cap reached, a refusal) would miss this
        result. Bounded: a command left running in the background keeps its own.
        """
        assert self._gateway is not None
        deadline = time.monotonic() + SETTLE_S
        while await asyncio.to_thread(open_connections, self._gateway, self.config.port, address):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.01)

    def usage(self, container_id: str) -> tuple[int, int] | None:
        """(bytes, refusals) of a container so far."""
        client = self._ledger.get(container_id)
        return None if client is None else (client.bytes, client.refusals)

    # -- internals --------------------------------------------------------------------

    def _prepare(self) -> SquidFolder:
        """The network, its firewall, Squid's folder and configuration (blocking)."""
        client = self._client_factory()
        try:
            api, config = client.api, self.config
            labels = {f"{config.label_prefix}.role": "egress-restricted"}
            self._gateway = ensure_network(api, config.network, config.bridge, labels)
            install_firewall(config.bridge, config.chain, self._gateway, config.port)
            self._folder = make_folder(
                listen=f"{self._gateway}:{config.port}",
                ceiling=config.ceiling,
                not_public=not_public_ranges(host_addresses()),
                test_hosts=config.test_hosts,
            )
            for found in network_containers(api, config.network):
                self._register(found)
            self._write_state()
            return self._folder
        finally:
            client.close()

    def _cleanup(self) -> None:
        if self._folder is not None:
            self._folder.remove()
        client = self._client_factory()
        try:
            config = self.config
            remove_if_unused(client.api, config.network, config.bridge, config.chain)
        finally:
            client.close()

    def _register(self, info: dict[str, Any]) -> Client | None:
        container_id = str(info["Id"])
        networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
        address = (networks.get(self.network) or {}).get("IPAddress")
        if not address:
            return None
        labels = (info.get("Config") or {}).get("Labels") or {}
        label = labels.get(self.allow_label(), "")
        experiment_id = labels.get(f"{self.config.label_prefix}.experiment", "")
        allow = tuple(
            n for n in label.split(",") if n and matches(n.lstrip("."), self.config.ceiling)
        )
        client = Client(container_id, address, allow, experiment_id)
        self._ledger.add(client)
        return client

    def _write_state(self) -> None:
        if self._folder is not None:
            self._folder.write_state(self._ledger.state())

    async def _watch(self) -> None:
        """Count bytes and refusals as they come, stop who reaches the cap mid-transfer;
        say once when Squid died."""
        assert self._squid is not None
        while True:
            await asyncio.sleep(POLL_S)
            if self._squid.exit_code is not None and not self._stopping:
                log.error(
                    "egress.proxy_died",
                    code=self._squid.exit_code,
                    log=self._folder.cache_log() if self._folder else "",
                )
                return
            try:
                await self._meter.read_log()
                await self._meter.check_live()
            except Exception:
                log.exception("egress.log_failed")
