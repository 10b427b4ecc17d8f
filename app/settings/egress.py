"""Network egress: whether experiments may reach the network or clone, and network
"restricted" (the allow-listed names through the Squid proxy the server starts)."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from app.egress.rules import DEFAULT_ALLOWLIST, parse_allowlist
from app.settings.base import Group

if TYPE_CHECKING:
    from app.egress.proxy import EgressConfig


class EgressSettings(Group):
    allow: bool = Field(
        default=False,
        alias="allow_egress",
        description="Whether experiments may ask for network egress.",
    )
    allow_git: bool = Field(
        default=False,
        alias="allow_git_egress",
        description="Whether create_experiment may clone https repositories (egress for a helper).",
    )
    proxy: bool = Field(
        default=False,
        alias="egress_proxy",
        description=(
            "Offer network 'restricted': experiments reach only the allow-listed names, "
            "through a Squid proxy the server starts (needs squid, iptables and root)."
        ),
    )
    allowlist: str = Field(
        default=",".join(DEFAULT_ALLOWLIST),
        alias="egress_allowlist",
        description=(
            "Names network 'restricted' may reach, comma-separated (.example.org: it and "
            "every name below it); the most an experiment may ask for."
        ),
    )
    max_bytes: int = Field(
        default=2 * 1024**3,
        ge=1024**2,
        alias="egress_max_bytes",
        description="Bytes one restricted experiment may move through the proxy (both ways).",
    )
    sandbox_bytes_per_day: int = Field(
        default=10 * 1024**3,
        ge=1024**2,
        alias="egress_sandbox_bytes_per_day",
        description=(
            "Bytes one sandbox may move through the proxy in a day (UTC), all its "
            "restricted experiments together, beside each experiment's cap."
        ),
    )
    proxy_port: int = Field(
        default=3128,
        ge=1,
        le=65535,
        alias="egress_proxy_port",
        description="The proxy's port on the restricted network.",
    )
    log_rotate_bytes: int = Field(
        default=4 * 1024**2,
        ge=16 * 1024,
        alias="egress_log_rotate_bytes",
        description=(
            "Bytes of the proxy's access log (in /run) kept once counted; past them the "
            "log is moved aside, its rest counted, and removed."
        ),
    )
    proxy_descriptors: int = Field(
        default=65536,
        ge=1024,
        le=1_048_576,
        alias="egress_proxy_descriptors",
        description=(
            "Open files the proxy (Squid) runs with (its RLIMIT_NOFILE, set before it "
            "starts); its connections are shared out per sandbox and per address from it."
        ),
    )
    address_shares: int = Field(
        default=4,
        ge=1,
        le=10_000,
        alias="egress_address_shares",
        description=(
            "How many sandboxes' connection shares of the proxy one sign-in address holds "
            "at most, however many sandboxes it signed in."
        ),
    )
    test_hosts: str = Field(
        default="",
        alias="egress_test_hosts",
        description="Tests only: name=address pairs the proxy resolves before DNS.",
    )

    @field_validator("allowlist")
    @classmethod
    def _check_allowlist(cls, value: str) -> str:
        return ",".join(parse_allowlist(value))  # raises ValueError naming the bad entry

    @property
    def ceiling(self) -> tuple[str, ...]:
        """The names network "restricted" may reach at most."""
        return parse_allowlist(self.allowlist)

    @property
    def test_host_pairs(self) -> tuple[tuple[str, str], ...]:
        pairs = [item.split("=", 1) for item in self.test_hosts.split(",") if "=" in item]
        return tuple((name.strip(), str(ipaddress.ip_address(a.strip()))) for name, a in pairs)

    @property
    def reaches_network(self) -> bool:
        """Some experiment may reach the open world (network "restricted" reaches part of it)."""
        return self.allow or self.proxy

    @property
    def clones(self) -> bool:
        """create_experiment may clone a repository over the network."""
        return self.allow_git or self.proxy

    def proxy_config(
        self, *, deployment: str, label_prefix: str, slots: int
    ) -> EgressConfig | None:
        """The proxy's configuration, when the operator offers network "restricted"."""
        if not self.proxy:
            return None
        from app.egress.proxy import EgressConfig  # Docker's SDK only when serving

        return EgressConfig(
            ceiling=self.ceiling,
            max_bytes=self.max_bytes,
            day_bytes=self.sandbox_bytes_per_day,
            deployment=deployment,
            port=self.proxy_port,
            test_hosts=self.test_host_pairs,
            label_prefix=label_prefix,
            log_rotate_bytes=self.log_rotate_bytes,
            descriptors=self.proxy_descriptors,
            slots=slots,
            address_shares=self.address_shares,
        )
