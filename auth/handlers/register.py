"""``POST /register`` (RFC 7591), bounded in size and rate."""

from __future__ import annotations

import json
from dataclasses import dataclass

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from auth.errors import OAuthError
from auth.handlers._http import NO_STORE, BodyTooLarge, oauth_error, read_body, too_many
from auth.ratelimit import RateLimiter
from auth.registration import Registrar

log = structlog.get_logger(__name__)
MAX_BODY = 8 * 1024


@dataclass
class RegistrationHandler:
    registrar: Registrar
    # One global budget: Claude's users share a few egress addresses (claude-ai-mcp#1043).
    limiter: RateLimiter

    async def handle(self, request: Request) -> Response:
        if not self.limiter.allow():
            log.warning("oauth.register_rate_limited")
            return too_many(self.limiter.retry_after_s())
        try:
            body = await read_body(request, MAX_BODY)
            metadata = json.loads(body)
        except BodyTooLarge:
            return oauth_error(OAuthError("invalid_client_metadata", "The body exceeds 8 KB."))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return oauth_error(OAuthError("invalid_client_metadata", "The body is not JSON."))
        try:
            client = await self.registrar.register(metadata)
        except OAuthError as exc:
            return oauth_error(exc)
        log.info("oauth.client_registered", client_id=client["client_id"])
        return JSONResponse(client, status_code=201, headers=NO_STORE)
