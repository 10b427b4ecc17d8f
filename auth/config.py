"""The authorization server's configuration, derived once from the public URL."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from auth.client_address import ProxyHeader
from auth.ratelimit import DEFAULT_SHARES, Shares

SCOPE = "sandbox"


@dataclass(frozen=True)
class AuthConfig:
    """``issuer`` is the public base URL without a trailing slash (RFC 8414 section 2);
    ``resource`` is the canonical ``/mcp`` URL that every token is bound to (RFC 8707)."""

    issuer: str
    access_ttl_s: int = 3600
    refresh_ttl_s: int = 30 * 86400
    # A code not yet redeemed holds a place among the hour's new sandboxes this long.
    code_ttl_s: int = 600
    signin_ttl_s: int = 600
    refresh_grace_s: int = 60
    # How long one process trusts an access token it verified without asking the
    # database again: a revocation on another process holds here within this bound.
    verified_cache_s: float = 5.0
    registrations_per_minute: int = 30
    signins_per_address_per_minute: int = 10
    sandboxes_per_address: int = 20
    new_sandboxes_per_hour: int = 200
    # What one network and one address prefix may spend of each global budget.
    shares: Shares = DEFAULT_SHARES
    # Addresses and networks of the proxies whose forwarding header is believed.
    trusted_proxies: tuple[IPv4Network | IPv6Network, ...] = ()
    proxy_header: ProxyHeader = "x-forwarded-for"
    client_ttl_without_grant_s: int = 90 * 86400
    client_metadata_documents: bool = True
    # How long an idle sandbox lives (the pool's setting): the sign-in page says so.
    sandbox_idle_s: int = 600

    @property
    def resource(self) -> str:
        return f"{self.issuer}/mcp"

    @property
    def resource_metadata_url(self) -> str:
        # RFC 9728 section 3.1: the well-known segment goes before the resource's path.
        return f"{self.issuer}/.well-known/oauth-protected-resource/mcp"

    @property
    def secure(self) -> bool:
        return self.issuer.startswith("https://")

    def authorization_server_metadata(self) -> dict[str, object]:
        """RFC 8414 metadata; every URL comes from configuration, never from the request."""
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "registration_endpoint": f"{self.issuer}/register",
            "revocation_endpoint": f"{self.issuer}/revoke",
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
            "revocation_endpoint_auth_methods_supported": ["none"],
            "scopes_supported": [SCOPE],
            "authorization_response_iss_parameter_supported": True,
            "client_id_metadata_document_supported": self.client_metadata_documents,
        }

    def protected_resource_metadata(self) -> dict[str, object]:
        """RFC 9728 metadata for ``/mcp``."""
        return {
            "resource": self.resource,
            "authorization_servers": [self.issuer],
            "scopes_supported": [SCOPE],
            "bearer_methods_supported": ["header"],
            "resource_name": "sandbox-mcp",
        }
