"""``POST /revoke`` (RFC 7009), public clients included."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from auth.errors import OAuthError
from auth.grants import TokenService
from auth.handlers._http import NO_STORE, oauth_error, read_form


@dataclass
class RevocationHandler:
    tokens: TokenService

    async def handle(self, request: Request) -> Response:
        try:
            form = await read_form(request)
            client = await self.tokens.client(form)
            token = form.get("token")
            if not token:
                raise OAuthError("invalid_request", "The token parameter is required.")
            await self.tokens.revoke(client, token)
        except OAuthError as exc:
            return oauth_error(exc)
        # RFC 7009 section 2.2: 200 whether or not the token was known.
        return Response(status_code=200, headers=NO_STORE)
