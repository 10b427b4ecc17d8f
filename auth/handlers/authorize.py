"""``GET /authorize`` shows the page; ``POST /authorize`` is the button."""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from auth.config import AuthConfig
from auth.errors import OAuthError
from auth.handlers._http import read_form
from auth.page import error_page, security_headers, signin_page
from auth.ratelimit import RateLimiter
from auth.signin import LocalError, RedirectError, SigninFlow

log = structlog.get_logger(__name__)


@dataclass
class AuthorizeHandler:
    config: AuthConfig
    flow: SigninFlow
    # Per browser address: the POST comes from the user's browser, not Claude's servers.
    limiter: RateLimiter
    ask_email: bool

    @property
    def cookie_name(self) -> str:
        # __Host- cookies must be Secure, which a browser keeps only over https.
        return "__Host-smcp_signin" if self.config.secure else "smcp_signin"

    def _local(self, exc: LocalError) -> Response:
        return error_page(exc.title, exc.message, exc.status, secure=self.config.secure)

    def _redirect(self, location: str) -> Response:
        # 303, never 307: the browser must not re-POST the form to the client (OAuth 2.1 7.5.4).
        return RedirectResponse(
            location, status_code=303, headers=security_headers(secure=self.config.secure)
        )

    async def handle(self, request: Request) -> Response:
        if request.method == "POST":
            return await self._press(request)
        params = dict(request.query_params)
        try:
            pending = await self.flow.start(params)
        except LocalError as exc:
            return self._local(exc)
        except RedirectError as exc:
            return self._redirect(exc.location)
        page = signin_page(
            client_name=pending.client_name,
            client_id=pending.client_id,
            redirect_uri=pending.redirect_uri,
            tx=pending.tx,
            csrf=pending.csrf,
            ask_email=self.ask_email,
        )
        headers = security_headers(pending.redirect_uri, secure=self.config.secure)
        response = HTMLResponse(page, headers=headers)
        response.set_cookie(
            self.cookie_name,
            pending.csrf,
            max_age=self.config.signin_ttl_s,
            path="/",
            secure=self.config.secure,
            httponly=True,
            samesite="lax",
        )
        return response

    async def _press(self, request: Request) -> Response:
        address = request.client.host if request.client else "unknown"
        if not self.limiter.allow(address):
            log.warning("oauth.signin_rate_limited")
            return error_page(
                "Slow down",
                "Too many sandboxes were created from your address in the last minute. "
                "Wait a minute and try again.",
                429,
                secure=self.config.secure,
            )
        try:
            form = await read_form(request)
            approval = self.flow.approve(
                form.get("tx", ""),
                form.get("csrf", ""),
                request.cookies.get(self.cookie_name, ""),
                form.get("email", "").strip(),
            )
        except OAuthError as exc:
            return error_page("Sign-in refused", exc.description, 400, secure=self.config.secure)
        except LocalError as exc:
            return self._local(exc)
        if approval.new_sandbox:
            log.info("oauth.sandbox_created")
        return self._redirect(approval.location)
