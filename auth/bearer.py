"""The bearer check in front of ``/mcp`` (RFC 6750, RFC 9728 section 5.1).

A valid access token becomes the SDK's ``AuthenticatedUser``, so the SDK binds
sessions to its principal and tools read it with ``get_access_token()``.
"""

from __future__ import annotations

import json

from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from starlette.authentication import AuthCredentials
from starlette.types import ASGIApp, Receive, Scope, Send

from auth.config import SCOPE, AuthConfig
from auth.grants import TokenService


class BearerGate:
    """The bearer check, and what the SDK's ``AuthContextMiddleware`` did after it: the
    user in ``auth_context_var`` for the request (``get_access_token()``), set here
    rather than by one more middleware layer around every call."""

    def __init__(self, app: ASGIApp, tokens: TokenService, config: AuthConfig) -> None:
        self._app = app
        self._tokens = tokens
        self._config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != "/mcp":
            await self._app(scope, receive, send)  # only /mcp is protected; the rest is 404
            return
        header = _authorization(scope)
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            # No credentials: a bare challenge, no error code (RFC 6750 section 3.1).
            await self._deny(send, 401, None)
            return
        access = await self._tokens.verify_token(token.strip())
        if access is None:
            await self._deny(send, 401, "invalid_token")
            return
        if SCOPE not in access.scopes:
            await self._deny(send, 403, "insufficient_scope")
            return
        user = scope["user"] = AuthenticatedUser(access)
        scope["auth"] = AuthCredentials(access.scopes)
        reset = auth_context_var.set(user)
        try:
            await self._app(scope, receive, send)
        finally:
            auth_context_var.reset(reset)

    async def _deny(self, send: Send, status: int, error: str | None) -> None:
        parts = []
        if error:
            parts.append(f'error="{error}"')
        parts += [f'scope="{SCOPE}"', f'resource_metadata="{self._config.resource_metadata_url}"']
        body = json.dumps(
            {"error": error or "unauthorized", "error_description": "Sign in to use this server."}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", ("Bearer " + ", ".join(parts)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _authorization(scope: Scope) -> str:
    """The first ``Authorization`` header, as Starlette's ``Headers.get`` reads it (the
    names arrive lower-cased from the server), without building a ``Headers``."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return str(value.decode("latin-1"))
    return ""
