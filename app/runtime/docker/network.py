"""Which network a container joins, and what joining it takes.

An experiment asks for one of three modes (``NetworkMode``):

- ``none``: no network at all (the default);
- ``egress``: the operator's network (``egress_network``, the default bridge unless
  configured), only on a server built with ``allow_egress``, else EGRESS_DISABLED;
- ``restricted``: the allow-listing proxy's network (:mod:`app.egress.proxy`),
  with the proxy settings in its environment and its list in a label; the proxy
  learns the container's address once it started (``attach``) and forgets it when it
  is removed (``detach``). What the proxy refused reaches the agent with the next
  command's result (``notice``). Without a proxy the mode is RESTRICTED_UNAVAILABLE.

A clone helper's network is :mod:`app.runtime.git.network` (it uses ``Joining`` and the
proxy's part here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import docker

from app.egress.proxy import EgressProxy
from app.errors import InvalidArgument
from app.runtime.backend import ContainerSpec, NetworkMode
from app.runtime.errors import EgressDisabled, RestrictedUnavailable


@dataclass(frozen=True)
class Joining:
    """How one container joins its network."""

    mode: str  # Docker's network mode: "none" or a network's name
    env: Mapping[str, str] = field(default_factory=dict)  # added to the container's
    labels: Mapping[str, str] = field(default_factory=dict)  # added to the container's
    allowlist: tuple[str, ...] = ()  # restricted: what it may reach
    warnings: tuple[str, ...] = ()  # restricted: the list was clamped
    proxied: bool = False  # the proxy must be told its address once it started


@dataclass
class Networks:
    """The network choices of one backend (see the module doc)."""

    allow_egress: bool  # whether network "egress" is honoured
    egress_network: str  # the Docker network egress containers join
    proxy: EgressProxy | None  # network "restricted"'s (None: refused); remote clones use it

    def mode(self, network: NetworkMode) -> str:
        """Docker's network mode for ``network``; checked before anything is made.

        Raises:
            EgressDisabled, RestrictedUnavailable, InvalidArgument: see the module doc.
        """
        if network == "none":
            return "none"
        if network == "egress" and self.allow_egress:
            return self.egress_network
        if network == "egress":
            raise EgressDisabled()
        if network == "restricted":
            return self._restricted().network
        raise InvalidArgument("network must be 'none', 'egress' or 'restricted'.", field="network")

    def for_experiment(self, spec: ContainerSpec) -> Joining:
        """How ``spec``'s container joins its network (``mode`` accepted it).

        Raises:
            InvalidArgument: a restricted allow-list entry that is not a host name.
        """
        mode = self.mode(spec.network)
        if spec.network != "restricted":
            return Joining(mode)
        planned = self._restricted().plan(spec.egress_allowlist)
        return Joining(
            planned.network,
            env=planned.env,
            labels=planned.labels,
            allowlist=planned.allowlist,
            warnings=planned.warnings,
            proxied=True,
        )

    async def attach(self, api: docker.APIClient, container_id: str, joining: Joining) -> None:
        """After the container started: tell the proxy its address, when it goes through it."""
        if joining.proxied and self.proxy is not None:
            await self.proxy.attach(api, container_id)

    async def detach(self, container_id: str) -> None:
        """After the container was removed: the proxy forgets it."""
        if self.proxy is not None:
            await self.proxy.detach(container_id)

    async def notice(self, container_id: str) -> str | None:
        """What the proxy refused this container since the last notice."""
        return await self.proxy.take_notice(container_id) if self.proxy else None

    def _restricted(self) -> EgressProxy:
        if self.proxy is None:
            raise RestrictedUnavailable()
        return self.proxy
