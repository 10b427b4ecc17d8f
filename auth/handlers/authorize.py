"""``GET /authorize`` shows the page; ``POST /authorize`` is the button."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from auth.admission import Refusal, SigninAdmission
from auth.client_address import ClientAddresses
from auth.config import AuthConfig
from auth.errors import OAuthError
from auth.handlers._http import read_form
from auth.log_sampling import refusals
from auth.page import error_page, security_headers, signin_page
from auth.signin import LocalError, RedirectError, SigninFlow

log = structlog.get_logger(__name__)


@dataclass
class AuthorizeHandler:
    config: AuthConfig
    flow: SigninFlow
    # Keyed by the browser's address prefix: the POST comes from the user's browser,
    # not Claude's servers.
    addresses: ClientAddresses
    admission: SigninAdmission
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
            started = await self.flow.start(params, self.addresses.key_of(request))
        except LocalError as exc:
            return self._local(exc)
        except RedirectError as exc:
            return self._redirect(exc.location)
        pending = started.signin
        page = signin_page(
            client_name=pending.client_name,
            client_id=pending.client_id,
            redirect_uri=pending.redirect_uri,
            tx=started.tx,
            csrf=pending.csrf,
            ask_email=self.ask_email,
            server=urlsplit(self.config.issuer).netloc,
            idle_s=self.config.sandbox_idle_s,
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
        try:
            form = await read_form(request)
            # CSRF and transaction first: a junk POST is refused before any budget is
            # asked, so junk can never spend (and lock out) an honest user's budget.
            pending = self.flow.pressed(
                form.get("tx", ""), form.get("csrf", ""), request.cookies.get(self.cookie_name, "")
            )
        except OAuthError as exc:
            return error_page("Sign-in refused", exc.description, 400, secure=self.config.secure)
        except LocalError as exc:
            return self._local(exc)
        prefix = self.addresses.key_of(request)
        admitted = await self.admission.admit(self.flow.issued_code(pending, prefix))
        if isinstance(admitted, Refusal):
            refusals.warning("oauth.signin_refused", prefix, limit=admitted.limit)
            page = error_page(admitted.title, admitted.message, 429, secure=self.config.secure)
            page.headers["Retry-After"] = str(admitted.retry_after_s)
            return page
        approval = self.flow.approve(
            pending, form.get("email", "").strip(), admitted.issued, first=admitted.first
        )
        if approval.new_sandbox:
            log.info("oauth.sandbox_created")
        return self._redirect(approval.location)
