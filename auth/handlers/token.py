"""``POST /token``: authorization_code and refresh_token grants."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse

from auth.errors import OAuthError
from auth.grants import TokenService
from auth.handlers._http import NO_STORE, oauth_error, read_form


@dataclass
class TokenHandler:
    tokens: TokenService

    async def handle(self, request: Request) -> JSONResponse:
        try:
            form = await read_form(request)
            grant_type = form.get("grant_type")
            if grant_type not in ("authorization_code", "refresh_token"):
                raise OAuthError(
                    "unsupported_grant_type", "Use authorization_code or refresh_token."
                )
            client = await self.tokens.client(form)
            if grant_type == "authorization_code":
                answer = await self.tokens.exchange_code(client, form)
            else:
                answer = await self.tokens.refresh(client, form)
        except OAuthError as exc:
            return oauth_error(exc)
        # RFC 6749 section 5.1: token responses must not be cached.
        return JSONResponse(answer, headers=NO_STORE)
