"""Which network a clone helper joins, and what joining it takes.

A clone helper is the only container besides an experiment's that may get network:
none for a local repository; through network ``restricted``'s proxy, with the server's
own list, when there is one; else, on a server built with ``allow_git_egress``, a
network of its own (never the default bridge, created when missing) with git pinned to
the checked public address of the URL's host (:mod:`app.runtime.git.egress`); else
GIT_EGRESS_DISABLED. An experiment's own network is :mod:`app.runtime.docker.network`,
whose ``Joining`` and proxy this uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import docker

from app.runtime.docker.engine_errors import translated
from app.runtime.docker.network import Joining, Networks
from app.runtime.docker.threads import Offload
from app.runtime.errors import GitEgressDisabled
from app.runtime.git.egress import LookupShares, ensure_network, pin_remote
from app.runtime.git.sources import ClonePlan
from jail.addresses import AddressPolicy, Resolver


@dataclass
class CloneNetwork:
    """The network choices of one backend's clone helpers (see the module doc)."""

    networks: Networks  # the experiments' choices: its proxy (None: none) and attach
    allow_git_egress: bool  # whether a clone may fetch an https URL without a proxy
    git_network: str  # the network of its own such clone helpers join
    git_network_labels: dict[str, str]  # what that network is created with
    resolve: Resolver  # how a remote clone's host is resolved, to be checked and pinned
    git_address_policy: AddressPolicy  # which addresses a remote clone may reach
    api: Callable[[], Awaitable[docker.APIClient]]  # the engine client
    offload: Offload  # where blocking SDK calls run
    lookups: LookupShares = field(default_factory=LookupShares)  # each tenant's DNS share
    _git_network_ready: bool = field(default=False, init=False)

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
        proxy = self.networks.proxy
        if proxy is not None:
            # Through the proxy, with its rules (the server's list): it resolves and checks.
            planned = proxy.plan(None)
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
        """After the helper started: tell the proxy its address, when it goes through it."""
        await self.networks.attach(api, container_id, joining)
