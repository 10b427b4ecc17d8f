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
  ip6tables drops everything (:mod:`app.egress.network`). A proxy container
  on two networks would need an image of its own and a network per experiment; this
  needs neither.
* Squid resolves names itself and applies :mod:`app.egress.rules`: the
  operator's ceiling, the experiment's own list (an external ACL helper reads it, by
  client address, from a state file we rewrite), no destination that is not public,
  443 for CONNECT (no TLS interception) and 80 for plain http.
* Squid's access log tells who was refused and who moved how many bytes
  (:mod:`app.egress.usage`): a client address is a container of one
  experiment (mapped when the container starts). Refusals are handed to that
  experiment's next command result; bytes are counted in ``/metrics`` and against
  its cap, recorded in the database and enforced while a transfer runs
  (:mod:`app.egress.meter`).
* Squid's descriptors are set before it starts and bound the connections each
  sandbox and each sign-in address may hold (:mod:`app.egress.bounds`).

Several processes (``serve --workers N``): one address, so one Squid, run by the
process elected (:mod:`app.egress.owner`). Every process creates restricted
containers and writes the ACL state and counts the log (under the folder's lock, see
:mod:`app.egress.meter`), so nothing of a container lives in one process's
memory. ``/health`` on each says whether Squid runs, whichever process runs it.

The iptables chain stays when the server stops: experiment containers outlive a
restart, and must not reach the host meanwhile. It is removed with the network,
once no container is left on it and no other process serves. Squid is started
with the process elected and stopped with it, and its death is reported by
``/health`` on every process (:mod:`app.egress.squid`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import docker
import structlog

from app.egress.bounds import install_bounds, remove_bounds, size_bounds
from app.egress.meter import POLL_S, ROTATE_BYTES, EgressMeter, UsageRecords, describe
from app.egress.network import (
    ensure_network,
    host_addresses,
    install_firewall,
    remove_if_unused,
)
from app.egress.owner import SquidOwner, SquidSite
from app.egress.records import Usage
from app.egress.rules import clamp_allowlist, matches, not_public_ranges
from app.egress.squid import (
    SquidFolder,
    folder_root,
    make_folder,
    reachable_descriptors,
)
from app.egress.usage import ProxyClient
from app.errors import ConfigurationError, InvalidArgument
from pool.background import cancel_and_wait
from pool.watchdog import Leadership, SoleWatchdog

log = structlog.get_logger(__name__)

ALLOW_LABEL: Final = "egress-allow"  # <prefix>.egress-allow: the container's list
SIGNIN_LABEL: Final = "signin"  # <prefix>.signin: its sandbox's sign-in address, hashed


@dataclass(frozen=True)
class EgressConfig:
    ceiling: tuple[str, ...]
    max_bytes: int  # per experiment
    deployment: str
    day_bytes: int | None = None  # per sandbox and day (UTC)
    port: int = 3128
    squid: str = "squid"
    test_hosts: tuple[tuple[str, str], ...] = ()  # test-only: (name, address) for Squid
    label_prefix: str = "io.sandbox-mcp"
    log_rotate_bytes: int = ROTATE_BYTES  # counted log kept before it is moved aside
    descriptors: int = 65536  # Squid's RLIMIT_NOFILE, asked (egress_squid.reachable_descriptors)
    slots: int = 500  # the pool's: a sandbox's connection share is one slot's
    address_shares: int = 4  # sandboxes' shares one sign-in address may hold

    @property
    def table(self) -> str:
        return f"smcp_egress_{self._tag}"  # egress_bounds' nftables table

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
        self._others_live = others_live  # None: this process is the only one
        self._docker: docker.DockerClient | None = None
        self._gateway: str | None = None
        self._folder = SquidFolder(config.folder)
        self._owner = SquidOwner(self._folder, leadership or SoleWatchdog(), process_id)
        self._meter: EgressMeter | None = None
        self._site: SquidSite | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._bounds = size_bounds(config.descriptors, config.slots, config.address_shares)

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
        self._docker = self._client_factory()
        await asyncio.to_thread(self._folder.root.mkdir, mode=0o755, parents=True, exist_ok=True)
        config = self.config
        descriptors = reachable_descriptors(config.descriptors)
        if descriptors < config.descriptors:
            log.warning(
                "egress.descriptors_limited",
                asked=config.descriptors,
                got=descriptors,
                reason="the server's hard RLIMIT_NOFILE, without CAP_SYS_RESOURCE to raise it",
            )
        bounds = self._bounds = size_bounds(descriptors, config.slots, config.address_shares)
        meter = EgressMeter(
            self._folder,
            self._usage,
            max_bytes=self.config.max_bytes,
            day_bytes=self.config.day_bytes,
            scan=self._scan,
            on_refused=self._on_refused,
            on_bytes=self._on_bytes,
            rotate_bytes=self.config.log_rotate_bytes,
            limit_list=self.config.chain,  # the firewall's list of who the limit refused
            bounds=(config.table, bounds),
        )
        async with meter.lock:
            self._gateway = await asyncio.to_thread(self._prepare)
        meter.proxy = (self._gateway, self.config.port)
        self._meter = meter
        log_fields = {
            "proxy": self.proxy_url,
            "network": self.network,
            "allowlist": len(self.config.ceiling),
            "descriptors_asked": config.descriptors,
            "descriptors": bounds.descriptors,
            "connections_per_sandbox": bounds.per_sandbox,
            "connections_per_address": bounds.per_address,
        }
        site = self._site = SquidSite(
            squid, self._folder, self._gateway, self.config.port, bounds.descriptors, log_fields
        )
        # Containers that outlived a restart keep their lists, their counts and caps.
        await meter.refresh_state()
        if await self._owner.is_elected():
            await self._owner.take_over(site, meter)
        self._watcher = asyncio.create_task(self._watch(), name="egress-proxy-watch")

    async def stop(self) -> None:
        self._owner.stopping = True
        await cancel_and_wait(self._watcher)
        meter = self._meter
        await self._owner.stop(meter)
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
        return self._owner.health()

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

    async def _watch(self) -> None:
        """Every poll, the elected process's round (:meth:`SquidOwner.tick`)."""
        assert self._site is not None
        assert self._meter is not None
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self._owner.tick(self._site, self._meter)
            except Exception:
                log.exception("egress.tick_failed")

    # -- internals --------------------------------------------------------------------

    def _prepare(self) -> str:
        """The network, its firewall, Squid's folder and configuration (blocking, under
        the folder's lock); the gateway's address."""
        assert self._docker is not None
        api, config = self._docker.api, self.config
        labels = {f"{config.label_prefix}.role": "egress-restricted"}
        gateway = ensure_network(api, config.network, config.bridge, labels)
        install_firewall(config.bridge, config.chain, gateway, config.port)
        install_bounds(config.table, config.bridge, gateway, config.port, self._bounds)
        make_folder(
            self._folder.root,
            listen=f"{gateway}:{config.port}",
            ceiling=config.ceiling,
            not_public=not_public_ranges(host_addresses()),
            test_hosts=config.test_hosts,
            descriptors=self._bounds.descriptors,
        )
        return gateway

    def _cleanup(self) -> None:
        """The last process gone: the network and firewall too, if no container is left."""
        assert self._docker is not None
        config = self.config
        if remove_if_unused(self._docker.api, config.network, config.bridge, config.chain):
            remove_bounds(config.table)
            self._folder.remove()

    def _scan(self) -> list[ProxyClient]:
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
                ProxyClient(
                    str(info["Id"]),
                    address,
                    allow,
                    labels.get(f"{prefix}.experiment", ""),
                    sandbox=labels.get(f"{prefix}.sandbox", ""),
                    signin=labels.get(f"{prefix}.{SIGNIN_LABEL}", ""),
                )
            )
        return found
