"""The sign-in: OAuth or one local user, the admission limits, the proxies trusted to
name the client, client metadata documents, and the key tokens are stored under."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from app.settings.base import Group
from auth.client_address import parse_trusted_proxies
from auth.config import AuthConfig
from auth.ratelimit import Shares


class AuthSettings(Group):
    mode: Literal["oauth", "none"] = Field(
        default="oauth",
        alias="auth",
        description="`oauth` (anonymous OAuth 2.1) or `none` (one local user; loopback only).",
    )
    token_key: SecretStr | None = Field(
        default=None,
        description=(
            "Hex key (at least 64 digits) for the HMAC under which tokens are stored; "
            "default: a key created 0600 in the state dir at first start."
        ),
    )
    registrations_per_minute: int = Field(
        default=30,
        ge=1,
        le=100_000,
        description="Client registrations accepted per minute, in all.",
    )
    signins_per_minute: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description="Sandboxes one browser address may create per minute (the sign-in button).",
    )
    sandboxes_per_address: int = Field(
        default=20,
        ge=1,
        le=100_000,
        description=(
            "Live sandboxes (sign-ins neither revoked nor expired) one address may hold: "
            "an IPv4 address, or an IPv6 /64."
        ),
    )
    new_sandboxes_per_hour: int = Field(
        default=200,
        ge=1,
        le=1_000_000,
        description="New sandboxes (sign-ins) the whole server accepts per hour.",
    )
    network_share_percent: int = Field(
        default=10,
        ge=1,
        le=100,
        description=(
            "Percent of each global budget (new sandboxes, registrations, document "
            "fetches) one network, an IPv4 /24 or IPv6 /48, may spend."
        ),
    )
    address_share_percent: int = Field(
        default=5,
        ge=1,
        le=100,
        description=(
            "Percent of each global budget one address prefix, an IPv4 address or "
            "IPv6 /64, may spend; at most the network share."
        ),
    )
    code_ttl_s: int = Field(
        default=600,
        ge=5,
        le=600,
        description=(
            "Seconds an authorization code may be redeemed; unredeemed, it holds a place "
            "among the hour's new sandboxes that long."
        ),
    )
    trusted_proxies: str = Field(
        default="",
        description=(
            "Comma-separated addresses and CIDR networks of the reverse proxies whose "
            "forwarding header names the client; empty: the peer is the client."
        ),
    )
    proxy_header: Literal["x-forwarded-for", "forwarded"] = Field(
        default="x-forwarded-for",
        description=(
            "The header the trusted proxies add: `x-forwarded-for` or `forwarded` (RFC 7239); "
            "only that one is read."
        ),
    )
    client_metadata_documents: bool = Field(
        default=True,
        description=(
            "Accept an https URL as client_id and fetch the client's metadata document there "
            "(public addresses only, 5 KB, 10 s, no redirects)."
        ),
    )
    client_document_fetches_per_minute: int = Field(
        default=60,
        ge=1,
        le=10_000,
        description="New client metadata documents fetched per minute, in all.",
    )

    @model_validator(mode="after")
    def _check_shares(self) -> AuthSettings:
        if self.address_share_percent > self.network_share_percent:
            raise ValueError(
                "SANDBOX_MCP_ADDRESS_SHARE_PERCENT must not exceed "
                "SANDBOX_MCP_NETWORK_SHARE_PERCENT: an address is part of its network"
            )
        return self

    @field_validator("token_key")
    @classmethod
    def _check_token_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or value.get_secret_value() == "":
            return None
        text = value.get_secret_value()
        if len(text) < 64 or len(text) % 2 or not re.fullmatch(r"[0-9a-fA-F]+", text):
            raise ValueError(
                "must be at least 64 hexadecimal digits (32 bytes), e.g. openssl rand -hex 32"
            )
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _check_trusted_proxies(cls, value: str) -> str:
        parse_trusted_proxies(value)  # raises ValueError naming the bad entry
        return value

    @field_validator("proxy_header", mode="before")
    @classmethod
    def _lower_proxy_header(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @property
    def hosted(self) -> bool:
        """Anyone may sign in (OAuth): host paths are refused, limits matter."""
        return self.mode == "oauth"

    @property
    def trusted_proxy_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return parse_trusted_proxies(self.trusted_proxies)

    def config(self, issuer: str, *, sandbox_idle_s: int) -> AuthConfig:
        """The authorization server's configuration, issuing as ``issuer`` (the public URL);
        ``sandbox_idle_s`` is the pool's idle timeout, which the sign-in page states."""
        return AuthConfig(
            issuer=issuer,
            sandbox_idle_s=sandbox_idle_s,
            registrations_per_minute=self.registrations_per_minute,
            signins_per_address_per_minute=self.signins_per_minute,
            sandboxes_per_address=self.sandboxes_per_address,
            new_sandboxes_per_hour=self.new_sandboxes_per_hour,
            shares=Shares(self.address_share_percent, self.network_share_percent),
            code_ttl_s=self.code_ttl_s,
            trusted_proxies=self.trusted_proxy_networks,
            proxy_header=self.proxy_header,
            client_metadata_documents=self.client_metadata_documents,
        )
