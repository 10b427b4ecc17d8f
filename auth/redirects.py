"""Redirect-URI policy: what may be registered, and what matches at /authorize."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit, urlunsplit

from auth.errors import OAuthError

MAX_URI_LENGTH = 2000


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_registrable(uri: str) -> None:
    """Refuse what OAuth 2.1 and the MCP security notes forbid.

    https anywhere; http only on loopback (RFC 8252 section 7.3); no fragment
    (RFC 6749 section 3.1.2); no userinfo; never ``javascript:``, ``data:``,
    ``file:`` or a private-use scheme.

    Raises:
        OAuthError: ``invalid_redirect_uri``.
    """
    if len(uri) > MAX_URI_LENGTH or any(ord(c) < 0x21 for c in uri):
        raise OAuthError("invalid_redirect_uri", "A redirect URI is too long or holds spaces.")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        raise OAuthError("invalid_redirect_uri", "A redirect URI is not a valid URL.") from None
    if parts.scheme not in ("https", "http"):
        raise OAuthError(
            "invalid_redirect_uri", "Redirect URIs must use https (or http on loopback)."
        )
    if not parts.hostname:
        raise OAuthError("invalid_redirect_uri", "A redirect URI has no host.")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise OAuthError(
            "invalid_redirect_uri", "Plain http redirect URIs are allowed only on loopback."
        )
    if parts.fragment or uri.endswith("#"):
        raise OAuthError("invalid_redirect_uri", "A redirect URI must not have a fragment.")
    if parts.username is not None or parts.password is not None:
        raise OAuthError("invalid_redirect_uri", "A redirect URI must not carry user information.")
    del port


def matches(requested: str, registered: tuple[str, ...]) -> bool:
    """Exact string match, except that a loopback URI may use any port (RFC 8252 section 7.3)."""
    if requested in registered:
        return True
    try:
        parts = urlsplit(requested)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return False
    if parts.scheme != "http" or not is_loopback(parts.hostname):
        return False
    portless = urlunsplit((parts.scheme, parts.hostname or "", parts.path, parts.query, ""))
    for uri in registered:
        candidate = urlsplit(uri)
        if candidate.scheme == "http" and is_loopback(candidate.hostname):
            bare = urlunsplit(
                (candidate.scheme, candidate.hostname or "", candidate.path, candidate.query, "")
            )
            if bare == portless:
                return True
    return False
