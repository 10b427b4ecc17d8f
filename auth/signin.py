"""``/authorize``: check the request, show the one-button page, and on the press mint a code.

Errors that concern the client or its redirect URI are shown on a local page
and never redirected (RFC 6749 section 4.1.2.1, an open redirector otherwise).
Any other error found before the person approves goes back to the client as a
303 redirect carrying ``error``, ``state`` and ``iss`` (RFC 9207) only when the
redirect URI is on loopback; otherwise it is shown on our own page too (see
:func:`_trusted_before_consent`).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from auth.clients import ClientDirectory, UnknownClient
from auth.config import SCOPE, AuthConfig
from auth.pending import CodeGrant, PendingSignin, new_id
from auth.pkce import is_valid_challenge
from auth.redirects import is_loopback, matches
from auth.sealing import Sealer
from auth.store import IssuedCode
from auth.tokens import TokenHasher

EmailHook = Callable[[str, str], bool]
# A client's opaque state; real ones are a few dozen characters.
MAX_STATE_CHARS = 2048


class LocalError(Exception):
    """Shown to the person in the browser; nothing is redirected."""

    def __init__(self, title: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.title = title
        self.message = message
        self.status = status


class RedirectError(Exception):
    """Sent back to the client at its (verified) redirect URI."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


@dataclass(frozen=True)
class SigninPage:
    """What the sign-in page carries: the sealed sign-in (``tx``) and its CSRF token."""

    signin: PendingSignin
    tx: str

    @property
    def csrf(self) -> str:
        return self.signin.csrf


@dataclass(frozen=True)
class Approval:
    location: str
    code: CodeGrant | None  # None for a double press: no new sandbox

    @property
    def new_sandbox(self) -> bool:
        return self.code is not None


def same_resource(given: str, ours: str) -> bool:
    """RFC 8707 / RFC 3986: scheme and host compare case-insensitively; a trailing slash aside."""
    try:
        a, b = urlsplit(given), urlsplit(ours)
    except ValueError:
        return False
    return (
        a.scheme.lower() == b.scheme.lower()
        and a.netloc.lower() == b.netloc.lower()
        and a.path.rstrip("/") == b.path.rstrip("/")
        and not a.query
        and not a.fragment
    )


def _trusted_before_consent(redirect_uri: str) -> bool:
    """May an error found before consent be redirected to this (registered) URI?

    Anyone can register a client (RFC 7591) or publish a client metadata
    document naming any https redirect URI, so a registered URI proves nothing:
    an attacker registers https://phish.example/ and links victims to a
    deliberately broken request (a bad scope, say), turning our address into an
    open redirector. RFC 9700 section 4.11.2 (and OAuth 2.1 draft section
    7.12.2, "Authorization Server as Open Redirector"): the server "SHOULD only
    automatically redirect the user agent if it trusts the redirect URI" and may
    instead inform the user. After the button is pressed the person has seen
    the page naming the return host, so the code (and approval-time errors,
    which are all local here) are fine. Before it, only loopback URIs (RFC 8252
    native apps) are trusted: they reach the person's own machine, never a
    third-party site.
    """
    return is_loopback(urlsplit(redirect_uri).hostname)


class SigninFlow:
    def __init__(
        self,
        config: AuthConfig,
        clients: ClientDirectory,
        hasher: TokenHasher,
        sealer: Sealer,
        *,
        remember_email: EmailHook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._clients = clients
        self._hasher = hasher
        self._sealer = sealer
        self._remember_email = remember_email
        self._clock = clock

    def redirect(self, redirect_uri: str, params: Mapping[str, str | None]) -> str:
        query = urlencode({k: v for k, v in params.items() if v is not None})
        return f"{redirect_uri}{'&' if '?' in redirect_uri else '?'}{query}"

    def _error(
        self, uri: str, state: str | None, error: str, description: str
    ) -> RedirectError | LocalError:
        if not _trusted_before_consent(uri):
            return LocalError(
                "This sign-in request is invalid",
                f"The application's sign-in request was refused ({error}): {description} "
                f"You were not sent back to "
                f"{urlsplit(uri).hostname}: before you approve a sign-in, this server "
                "sends you only to addresses it can vouch for. Go back to the application "
                "and connect again.",
            )
        return RedirectError(
            self.redirect(
                uri,
                {
                    "error": error,
                    "error_description": description,
                    "state": state,
                    "iss": self._config.issuer,
                },
            )
        )

    async def start(self, params: Mapping[str, str], prefix: str = "") -> SigninPage:
        """Validate an authorization request and seal it into the page until the button
        is pressed (nothing is kept: the press may reach another process).

        ``prefix`` is the browser's budget key: a client metadata document it makes us
        fetch is charged to it. A request that fails its own cheap checks (response
        type, PKCE) never makes us fetch one.

        Raises:
            LocalError: unknown client or bad redirect URI.
            RedirectError: any other problem, told to the client.
        """
        method = params.get("code_challenge_method")
        challenge = params.get("code_challenge", "")
        well_formed = (
            params.get("response_type") == "code"
            and method == "S256"
            and is_valid_challenge(challenge)
        )
        try:
            client = await self._clients.for_authorization(
                params.get("client_id", ""), prefix=prefix, may_fetch=well_formed
            )
        except UnknownClient as exc:
            raise LocalError("Unknown application", exc.reason) from None
        given_uri = params.get("redirect_uri")
        if given_uri is None and len(client.redirect_uris) == 1:
            redirect_uri = client.redirect_uris[0]
        elif given_uri is not None and matches(given_uri, client.redirect_uris):
            redirect_uri = given_uri
        else:
            raise LocalError(
                "Unexpected return address",
                "The address this sign-in would return you to is not one the application "
                "registered, so it was not used. Go back to the application and connect again.",
            )
        state = params.get("state")
        if state is not None and len(state) > MAX_STATE_CHARS:
            # The sign-in travels sealed in the page's form: it must stay a few KB.
            raise self._error(
                redirect_uri,
                None,
                "invalid_request",
                f"state is longer than {MAX_STATE_CHARS} characters.",
            )
        if params.get("response_type") != "code":
            raise self._error(
                redirect_uri, state, "unsupported_response_type", "Use response_type=code."
            )
        if method != "S256" or not is_valid_challenge(challenge):
            raise self._error(
                redirect_uri,
                state,
                "invalid_request",
                "PKCE is required: send code_challenge with code_challenge_method=S256.",
            )
        resource = params.get("resource")
        if resource is not None and not same_resource(resource, self._config.resource):
            raise self._error(
                redirect_uri,
                state,
                "invalid_target",
                f"The only resource is {self._config.resource}.",
            )
        requested = set((params.get("scope") or SCOPE).split())
        if requested - {SCOPE}:
            raise self._error(redirect_uri, state, "invalid_scope", f"The only scope is {SCOPE!r}.")
        pending = PendingSignin(
            csrf=new_id(),
            client_id=client.client_id,
            client_name=client.client_name,
            redirect_uri=redirect_uri,
            redirect_uri_given=given_uri is not None,
            state=state,
            code_challenge=challenge,
            resource=self._config.resource,
            scopes=(SCOPE,),
            expires_at=self._clock() + self._config.signin_ttl_s,
            sandbox_key=secrets.token_urlsafe(32),  # 256 bits
            code_id=new_id(),
        )
        return SigninPage(pending, pending.seal(self._sealer))

    def pressed(self, tx: str, csrf_form: str, csrf_cookie: str) -> PendingSignin:
        """The sign-in a button press belongs to, once its CSRF token and cookie match.

        Cheap and free of I/O: a junk POST is refused here, before any budget is asked.

        Raises:
            LocalError: expired or unknown sign-in (400), CSRF mismatch (403).
        """
        pending = PendingSignin.unseal(self._sealer, tx, self._clock())
        if pending is None:
            raise LocalError(
                "This sign-in has expired",
                "Sign-in pages are valid for 10 minutes and once only. Go back to the "
                "application and connect again.",
            )
        if not (
            csrf_form
            and csrf_cookie
            and hmac.compare_digest(csrf_form, pending.csrf)
            and hmac.compare_digest(csrf_cookie, pending.csrf)
        ):
            raise LocalError(
                "Sign-in refused",
                "This form was not sent from the sign-in page it belongs to. Go back to the "
                "application and connect again.",
                status=403,
            )
        return pending

    def issued_code(self, pending: PendingSignin, signin_prefix: str | None) -> IssuedCode:
        """The code this sign-in hands out, as the database will know it (by hash)."""
        now = self._clock()
        return IssuedCode(
            self._hasher.digest(pending.code_id),
            signin_prefix,
            now,
            now + self._config.code_ttl_s,
        )

    def approve(
        self, pending: PendingSignin, email: str, issued: IssuedCode, *, first: bool
    ) -> Approval:
        """Send the browser back with the code of a checked, admitted press.

        ``issued`` is the code as recorded: if it was recorded before (a double press,
        claude-ai-mcp#562, on whatever process), the answer is the same redirect, with
        no new sandbox and no e-mail kept.
        """
        grant = CodeGrant(
            code_id=pending.code_id,
            client_id=pending.client_id,
            redirect_uri=pending.redirect_uri,
            redirect_uri_given=pending.redirect_uri_given,
            code_challenge=pending.code_challenge,
            resource=pending.resource,
            scopes=pending.scopes,
            sandbox_key=pending.sandbox_key,
            expires_at=issued.expires_at,
            signin_prefix=issued.signin_prefix,
        )
        location = self.redirect(
            pending.redirect_uri,
            {"code": grant.seal(self._sealer), "state": pending.state, "iss": self._config.issuer},
        )
        if not first:
            return Approval(location, code=None)
        if email and self._remember_email is not None:
            self._remember_email(pending.sandbox_key, email)
        return Approval(location, code=grant)
