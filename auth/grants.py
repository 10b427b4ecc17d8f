"""``/token``, ``/revoke`` and the bearer check: issuing, rotating and verifying tokens."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog
from mcp.server.auth.provider import AccessToken

from auth.config import AuthConfig
from auth.errors import OAuthError
from auth.log_sampling import refusals
from auth.pending import CodeGrant
from auth.pkce import verifier_matches
from auth.sealing import Sealer
from auth.signin import same_resource
from auth.store import AuthStore, Client, Grant, TokenRecord
from auth.tokens import TokenHasher

log = structlog.get_logger(__name__)

# The verified access token's claim naming the budget key of the address that signed
# in (auth.client_address): the tool layer shares limits among that address's sandboxes.
SIGNIN_CLAIM = "signin_prefix"


@dataclass(frozen=True)
class _Verified:
    access: AccessToken
    grant_id: str
    expires_at: float


class TokenService:
    """Owns the token lifecycle. Any number of processes may serve one database: all
    they share is there (codes by hash, grants, tokens by hash). What one process
    caches (verified access tokens) it keeps for ``config.verified_cache_s`` at most,
    and only while it hears of revocations (``listening``): each revocation, on any
    process, reaches every process (``forget``, from a PostgreSQL notification sent by
    the revoking transaction), so it holds everywhere as soon as that arrives; while
    a process may miss one (its listener is down) it caches nothing."""

    def __init__(
        self,
        config: AuthConfig,
        store: AuthStore,
        hasher: TokenHasher,
        sealer: Sealer,
        clock: Callable[[], float] = time.time,
        cache_size: int = 10_000,
        *,
        listening: bool = True,
        on_signin: Callable[[str, str | None], None] | None = None,
    ) -> None:
        """``listening``: whether revocations elsewhere reach ``forget`` from the start
        (one process: there is no elsewhere). ``on_signin(sandbox_key, signin_prefix)``:
        a code was redeemed, a sandbox's first call is on its way (the warm pool grows)."""
        self._config = config
        self._store = store
        self._hasher = hasher
        self._sealer = sealer
        self._clock = clock
        # Verified access tokens by hash, so the bearer check costs no database trip.
        self._verified: OrderedDict[str, _Verified] = OrderedDict()
        self._cache_size = cache_size
        self._listening = listening
        self._on_signin = on_signin
        # Counts the revocations heard: a verification that read the database before one
        # arrived must not cache what it read (it may be the token just revoked).
        self._heard = 0

    # -- /token ------------------------------------------------------------

    async def client(self, form: Mapping[str, str]) -> Client:
        """The calling public client (RFC 6749 section 3.2.1: ``client_id`` in the form).

        Raises:
            OAuthError: 401 ``invalid_client`` for an unknown client, so that clients
                such as Claude register again.
        """
        client_id = form.get("client_id", "")
        client = await self._store.load_client(client_id) if client_id else None
        if client is None:
            raise OAuthError("invalid_client", "Unknown client; register again.", status=401)
        return client

    def _check_resource(self, form: Mapping[str, str], bound: str) -> None:
        resource = form.get("resource")
        if resource is not None and not same_resource(resource, bound):
            raise OAuthError("invalid_target", f"The only resource is {self._config.resource}.")

    async def exchange_code(self, client: Client, form: Mapping[str, str]) -> dict[str, object]:
        """authorization_code grant, PKCE S256 (RFC 6749 4.1.3, RFC 7636 4.6).

        Raises:
            OAuthError: ``invalid_grant``, ``invalid_request`` or ``invalid_target``.
        """
        grant = CodeGrant.unseal(self._sealer, form.get("code", ""), self._clock())
        if grant is None:
            raise OAuthError("invalid_grant", "The code is unknown or has expired.")
        # A replay with the wrong client or verifier proves nothing about the first
        # redemption: refuse it, revoke nothing (checklist item 30).
        if grant.client_id != client.client_id:
            raise OAuthError("invalid_grant", "The code was issued to another client.")
        redirect_uri = form.get("redirect_uri")
        if grant.redirect_uri_given and redirect_uri != grant.redirect_uri:
            raise OAuthError(
                "invalid_grant", "redirect_uri differs from the authorization request."
            )
        if not verifier_matches(form.get("code_verifier", ""), grant.code_challenge):
            raise OAuthError(
                "invalid_grant", "The PKCE code_verifier does not match the challenge."
            )
        self._check_resource(form, grant.resource)
        new = Grant(
            grant_id=secrets.token_urlsafe(18),
            client_id=client.client_id,
            sandbox_key=grant.sandbox_key,
            resource=grant.resource,
            scopes=grant.scopes,
            created_at=self._clock(),
            signin_prefix=grant.signin_prefix,
        )
        answer, records = self._issue(new)
        redemption = await self._store.redeem_code(self._hasher.digest(grant.code_id), new, records)
        if not redemption.first:
            if redemption.previous_grant is None:
                raise OAuthError("invalid_grant", "The code is unknown or has expired.")
            # RFC 6749 4.1.2 / OAuth 2.1 4.1.3: a second redemption, on whatever
            # process, revokes what the first issued.
            await self.revoke_grant(redemption.previous_grant)
            # Anyone holding a used code may send it again and again: bounded per the
            # address that signed in (auth.log_sampling).
            refusals.warning("oauth.code_replayed", grant.signin_prefix, client_id=client.client_id)
            raise OAuthError("invalid_grant", "The code was already used; its tokens are revoked.")
        log.info("oauth.code_exchanged", client_id=client.client_id)
        if self._on_signin is not None:
            self._on_signin(new.sandbox_key, new.signin_prefix)
        return answer

    async def refresh(self, client: Client, form: Mapping[str, str]) -> dict[str, object]:
        """refresh_token grant with rotation and reuse detection (OAuth 2.1 4.3.1).

        Raises:
            OAuthError: ``invalid_grant``, ``invalid_scope`` or ``invalid_target``.
        """
        token = form.get("refresh_token", "")
        token_hash = self._hasher.digest(token)
        found = (
            await self._store.load_token(token_hash)
            if self._hasher.kind_of(token) == "rt"
            else None
        )
        if found is None:
            raise OAuthError("invalid_grant", "The refresh token is unknown.")
        record, grant = found
        now = self._clock()
        if record.role != "refresh" or grant.revoked_at is not None or record.expires_at <= now:
            raise OAuthError(
                "invalid_grant", "The refresh token is no longer valid; sign in again."
            )
        if grant.client_id != client.client_id:
            raise OAuthError("invalid_grant", "The refresh token was issued to another client.")
        self._check_resource(form, grant.resource)
        scope = form.get("scope")
        if scope is not None and not set(scope.split()) <= set(grant.scopes):
            raise OAuthError("invalid_scope", "A refresh can only keep or narrow the scope.")
        # The successors are derived from the old token, so every process that is asked
        # to rotate it computes the same pair, and the database's compare-and-set (one
        # UPDATE ... WHERE rotated_at IS NULL) lets exactly one of them store it.
        answer, records = self._issue(grant, rotating=token)
        if record.rotated_at is None:
            if await self._store.rotate(token_hash, now, records):
                return answer
            record = TokenRecord(
                record.token_hash, record.grant_id, "refresh", record.expires_at, now
            )
        assert record.rotated_at is not None
        if now - record.rotated_at <= self._config.refresh_grace_s:
            # Claude refreshes concurrently (fastmcp#4264): within the grace window the old
            # token gets the pair its rotation produced, and the family does not fork.
            recent = await self._still_issued(answer)
            if recent is not None:
                return recent
            raise OAuthError(
                "invalid_grant", "The refresh token was just replaced; use the new one."
            )
        await self.revoke_grant(grant.grant_id)
        log.warning("oauth.refresh_reused", client_id=client.client_id)
        raise OAuthError("invalid_grant", "The refresh token was reused; the sign-in is revoked.")

    async def _still_issued(self, answer: dict[str, object]) -> dict[str, object] | None:
        """The answer a rotation gave (the same body, byte for byte: a replay of a request
        gets the reply it got), or None if its access token is gone (revoked)."""
        found = await self._store.load_token(self._hasher.digest(str(answer["access_token"])))
        if found is None or found[1].revoked_at is not None:
            return None
        return answer

    def _issue(
        self, grant: Grant, rotating: str | None = None
    ) -> tuple[dict[str, object], list[TokenRecord]]:
        if rotating is None:
            access, refresh = self._hasher.mint("at"), self._hasher.mint("rt")
        else:
            access = self._hasher.successor("at", rotating)
            refresh = self._hasher.successor("rt", rotating)
        now = self._clock()
        records = [
            TokenRecord(
                self._hasher.digest(access),
                grant.grant_id,
                "access",
                now + self._config.access_ttl_s,
            ),
            TokenRecord(
                self._hasher.digest(refresh),
                grant.grant_id,
                "refresh",
                now + self._config.refresh_ttl_s,
            ),
        ]
        answer: dict[str, object] = {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self._config.access_ttl_s,
            "refresh_token": refresh,
            "scope": " ".join(grant.scopes),
        }
        return answer, records

    # -- /revoke -----------------------------------------------------------

    async def revoke(self, client: Client, token: str) -> None:
        """RFC 7009: a refresh token revokes its whole grant, an access token itself.

        Unknown tokens and other clients' tokens are ignored (answered 200 all the
        same, section 2.2), so the endpoint reveals nothing.
        """
        if self._hasher.kind_of(token) not in ("at", "rt"):
            return
        token_hash = self._hasher.digest(token)
        found = await self._store.load_token(token_hash)
        if found is None:
            return
        record, grant = found
        if grant.client_id != client.client_id:
            return
        if record.role == "refresh":
            await self.revoke_grant(grant.grant_id)
        else:
            await self._store.delete_token(token_hash)
            self.forget(token_hash=token_hash)

    async def revoke_grant(self, grant_id: str) -> None:
        await self._store.revoke_grant(grant_id, self._clock())
        self.forget(grant_id=grant_id)

    def forget(self, *, grant_id: str | None = None, token_hash: str | None = None) -> None:
        """A revocation made here or on another process: drop what is cached of it."""
        self._heard += 1
        if token_hash is not None:
            self._verified.pop(token_hash, None)
        if grant_id is not None:
            for key in [k for k, v in self._verified.items() if v.grant_id == grant_id]:
                del self._verified[key]

    def listening(self, heard: bool) -> None:
        """Whether revocations on other processes reach ``forget`` from now on. While
        they may not, nothing is cached (and what was is dropped: some may be missed)."""
        self._listening = heard
        self._heard += 1
        self._verified.clear()

    # -- the bearer check ----------------------------------------------------

    async def verify_token(self, token: str) -> AccessToken | None:
        """The access token behind a bearer string, or None (unknown, expired, revoked,
        not an access token, or bound to another resource)."""
        token_hash = self._hasher.digest(token)
        now = self._clock()
        # The cache holds only access tokens already verified, so a hit needs no tag check.
        cached = self._verified.get(token_hash)
        if cached is not None:
            if cached.expires_at > now:
                return cached.access
            del self._verified[token_hash]  # stale: ask the database again
        if self._hasher.kind_of(token) != "at":
            return None  # refresh tokens, codes and foreign tokens are never bearer credentials
        heard = self._heard
        found = await self._store.load_token(token_hash)
        if found is None:
            return None
        record, grant = found
        if record.role != "access" or record.expires_at <= now or grant.revoked_at is not None:
            return None
        if not same_resource(grant.resource, self._config.resource):
            return None
        access = AccessToken(
            token=token,
            client_id=grant.client_id,
            scopes=list(grant.scopes),
            expires_at=int(record.expires_at),
            resource=grant.resource,
            subject=grant.sandbox_key,
            # The budget key of the address that signed in: its sandboxes share limits.
            claims={SIGNIN_CLAIM: grant.signin_prefix} if grant.signin_prefix else None,
        )
        if self._listening and heard == self._heard:
            # Kept a few seconds at most, and dropped as soon as a revocation is heard.
            until = min(record.expires_at, now + self._config.verified_cache_s)
            self._verified[token_hash] = _Verified(access, grant.grant_id, until)
            if len(self._verified) > self._cache_size:
                self._verified.popitem(last=False)
        return access
