"""``POST /register`` (RFC 7591), bounded in size and rate."""

from __future__ import annotations

import json
from dataclasses import dataclass

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from auth.client_address import ClientAddresses
from auth.errors import OAuthError
from auth.handlers._http import NO_STORE, BodyTooLarge, oauth_error, read_body, too_many
from auth.log_sampling import refusals
from auth.ratelimit import Budget
from auth.registration import Registrar, check_client_metadata

log = structlog.get_logger(__name__)
MAX_BODY = 8 * 1024


@dataclass
class RegistrationHandler:
    registrar: Registrar
    addresses: ClientAddresses
    # One budget for everyone, of which one network and one address prefix may spend
    # only their shares (auth.ratelimit.Shares), so a few networks cannot take it all.
    # Only valid registrations spend it: a body refused anyway costs nobody a place.
    budget: Budget

    async def handle(self, request: Request) -> Response:
        try:
            body = await read_body(request, MAX_BODY)
            checked = check_client_metadata(json.loads(body))
        except BodyTooLarge:
            return oauth_error(OAuthError("invalid_client_metadata", "The body exceeds 8 KB."))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return oauth_error(OAuthError("invalid_client_metadata", "The body is not JSON."))
        except OAuthError as exc:
            return oauth_error(exc)
        prefix = self.addresses.key_of(request)
        wait = await self.budget.take(prefix)
        if wait:
            refusals.warning("oauth.register_rate_limited", prefix)
            return too_many(wait)
        client = await self.registrar.save(checked)
        log.info("oauth.client_registered", client_id=client["client_id"])
        return JSONResponse(client, status_code=201, headers=NO_STORE)
