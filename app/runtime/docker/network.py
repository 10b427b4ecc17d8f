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

A clone helper, the only other container that may get network: none for a local
repository; through the proxy, with the server's own list, when there is one; else,
on a server built with ``allow_git_egress``, a network of its own (never the default
bridge, created when missing) with git pinned to the checked public address of the
URL's host (:mod:`app.runtime.git.egress`); else GIT_EGRESS_DISABLED.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import docker

from app.egress.proxy import EgressProxy
from app.errors import InvalidArgument
from app.runtime.backend import ContainerSpec, NetworkMode
from app.runtime.docker.engine_errors import translated
from app.runtime.docker.threads import Offload
from app.runtime.errors import EgressDisabled, GitEgressDisabled, RestrictedUnavailable
from app.runtime.git.egress import LookupShares, ensure_network, pin_remote
from app.runtime.git.sources import ClonePlan
from jail.addresses import AddressPolicy, Resolver


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
    allow_git_egress: bool  # whether a clone may fetch an https URL without a proxy
    git_network: str  # the network of its own such clone helpers join
    git_network_labels: dict[str, str]  # what that network is created with
    resolve: Resolver  # how a remote clone's host is resolved, to be checked and pinned
    git_address_policy: AddressPolicy  # which addresses a remote clone may reach
    api: Callable[[], Awaitable[docker.APIClient]]  # the engine client
    offload: Offload  # where blocking SDK calls run
    lookups: LookupShares = field(default_factory=LookupShares)  # each tenant's DNS share
    _git_network_ready: bool = field(default=False, init=False)

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

    async def for_clone(
        self, plan: ClonePlan, *, sandbox: str, address: str
    ) -> tuple[ClonePlan, Joining]:
        """How a clone of ``plan`` joins its network, and the plan git runs (pinned to the
        checked address when it goes out on its own; its host looked up within the shares
        of ``sandbox`` and sign-in ``address``, labels as in ``ContainerSpec``).

        Raises:
            GitSourceRefused: the URL's host is not (only) public, or another port.
            GitEgressDisabled: a remote URL on a server that allows no git egress.
        """
        if plan.local_source is not None:
            return plan, Joining("none")
        if self.proxy is not None:
            # Through the proxy, with its rules (the server's list): it resolves and checks.
            planned = self.proxy.plan(None)
            return plan, Joining(
                planned.network, env=planned.env, labels=planned.labels, proxied=True
            )
        if not self.allow_git_egress:
            raise GitEgressDisabled()
        resolve = self.lookups.bounded(self.resolve, sandbox, address)
        pin = await pin_remote(plan.url, resolve=resolve, allow=self.git_address_policy)
        pinned = dataclasses.replace(plan, pin=pin)
        if not self._git_network_ready:
            api = await self.api()
            with translated():
                await self.offload.call(
                    ensure_network, api, self.git_network, self.git_network_labels
                )
            self._git_network_ready = True
        return pinned, Joining(self.git_network)

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
