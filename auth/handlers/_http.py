"""Small helpers shared by the endpoint handlers."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse

from auth.errors import OAuthError

NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise BodyTooLarge
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise BodyTooLarge
    return bytes(body)


async def read_form(request: Request, limit: int = 16 * 1024) -> dict[str, str]:
    """A urlencoded form; a parameter given twice is an error (RFC 6749 section 3.1)."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise OAuthError(
            "invalid_request", "Send the parameters as application/x-www-form-urlencoded."
        )
    try:
        body = await read_body(request, limit)
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=False)
    except BodyTooLarge:
        raise OAuthError("invalid_request", "The request body is too large.") from None
    except UnicodeDecodeError:
        raise OAuthError("invalid_request", "The request body is not valid UTF-8.") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        if key in form:
            raise OAuthError("invalid_request", f"The parameter {key!r} was given more than once.")
        form[key] = value
    return form


def oauth_error(exc: OAuthError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers={**NO_STORE, **(headers or {})})


def too_many(retry_after_s: int) -> JSONResponse:
    return JSONResponse(
        {"error": "slow_down", "error_description": "Too many requests; retry later."},
        status_code=429,
        headers={**NO_STORE, "Retry-After": str(retry_after_s)},
    )
