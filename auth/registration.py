"""Dynamic client registration (RFC 7591): public clients only, strictly bounded."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from auth.config import SCOPE
from auth.errors import OAuthError
from auth.redirects import check_registrable
from auth.store import AuthStore, Client

MAX_REDIRECT_URIS = 10
MAX_NAME_LENGTH = 100
GRANT_TYPES = {"authorization_code", "refresh_token"}


def check_client_metadata(
    metadata: object, *, name_required: bool = False
) -> tuple[str | None, tuple[str, ...]]:
    """Check client metadata (RFC 7591 section 2) against our policy; returns name and URIs.

    Registration and client metadata documents share it, so that publishing
    metadata at a URL is no way around the redirect-URI policy.

    Raises:
        OAuthError: ``invalid_redirect_uri`` or ``invalid_client_metadata``.
    """
    if not isinstance(metadata, dict):
        raise OAuthError("invalid_client_metadata", "The body must be a JSON object.")
    uris = metadata.get("redirect_uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise OAuthError("invalid_redirect_uri", "redirect_uris must be a non-empty list of URLs.")
    if len(uris) > MAX_REDIRECT_URIS:
        raise OAuthError(
            "invalid_redirect_uri", f"At most {MAX_REDIRECT_URIS} redirect URIs are accepted."
        )
    for uri in uris:
        check_registrable(uri)
    name = metadata.get("client_name")
    if (name is None and name_required) or (
        name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH)
    ):
        raise OAuthError(
            "invalid_client_metadata",
            f"client_name must be text of 1 to {MAX_NAME_LENGTH} characters.",
        )
    grant_types = metadata.get("grant_types", ["authorization_code", "refresh_token"])
    if not isinstance(grant_types, list) or not set(grant_types) <= GRANT_TYPES:
        raise OAuthError(
            "invalid_client_metadata",
            "grant_types may hold only authorization_code and refresh_token.",
        )
    response_types = metadata.get("response_types", ["code"])
    if response_types != ["code"]:
        raise OAuthError("invalid_client_metadata", 'response_types must be ["code"].')
    scope = metadata.get("scope")
    if scope is not None and (not isinstance(scope, str) or set(scope.split()) - {SCOPE}):
        raise OAuthError("invalid_client_metadata", f"The only scope is {SCOPE!r}.")
    return name, tuple(uris)


class Registrar:
    def __init__(self, store: AuthStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    async def register(self, metadata: object) -> dict[str, object]:
        """Validate a registration request and store the client.

        Every client is public (``token_endpoint_auth_method: none``): a request
        for ``client_secret_post`` is answered with ``none`` and no secret, as
        Claude expects (claude-ai-mcp#82).

        Raises:
            OAuthError: ``invalid_redirect_uri`` or ``invalid_client_metadata``.
        """
        return await self.save(check_client_metadata(metadata))

    async def save(self, checked: tuple[str | None, tuple[str, ...]]) -> dict[str, object]:
        """Store a client whose metadata ``check_client_metadata`` accepted."""
        name, uris = checked
        now = self._clock()
        client = Client(
            client_id=secrets.token_urlsafe(18),
            client_name=name,
            redirect_uris=uris,
            created_at=now,
        )
        await self._store.save_client(client)
        return {
            "client_id": client.client_id,
            "client_id_issued_at": int(now),
            "client_name": name,
            "redirect_uris": list(client.redirect_uris),
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
            "scope": SCOPE,
        }
