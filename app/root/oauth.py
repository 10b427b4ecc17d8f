"""The anonymous OAuth 2.1 authorization server as this service runs it
(``SANDBOX_MCP_AUTH=oauth``): its parts, built from ``settings.auth``, its routes,
and the bearer gate in front of ``/mcp``.

The protocol itself lives in ``auth/`` (which never imports ``app``); this module
only joins it to our stores, key file, shared budgets and ready e-mail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.routing import Route
from starlette.types import ASGIApp

from app.errors import ConfigurationError
from app.root.shared_limits import SharedLimits
from app.root.state_dir import prepare_state_dir
from app.settings import Settings
from app.storage.signin.auth_store import SqlAuthStore, parse_revocation
from app.version import service_version
from auth.bearer import BearerGate
from auth.client_documents import ClientDocuments
from auth.clients import ClientDirectory
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.log_sampling import refusals
from auth.ratelimit import Budget
from auth.registration import Registrar
from auth.routes import create_auth_routes
from auth.safe_fetch import PublicFetcher
from auth.sealing import Sealer
from auth.signin import SigninFlow
from auth.tokens import TokenHasher, load_or_create_key
from pool.mailer import ReadyMailer

if TYPE_CHECKING:  # asyncpg only where there is PostgreSQL (app.root.shared_limits)
    from app.storage.slots.ready_relay import PgChannel

KEY_FILE = "token-hmac.key"


@dataclass
class AuthParts:
    """The authorization server's parts, shared by its routes and the bearer gate."""

    config: AuthConfig
    store: SqlAuthStore
    registrar: Registrar
    flow: SigninFlow
    tokens: TokenService
    registrations: Budget  # /register's budget, shared by every process
    ask_email: bool = False  # the sign-in page offers the 'ready' e-mail
    revocations: PgChannel | None = None  # revocations on every process (PostgreSQL)

    async def open(self) -> None:
        """Hear of revocations on other processes from now on."""
        if self.revocations is not None:
            await self.revocations.open(self._revoked, self.tokens.listening)

    async def _revoked(self, payload: str) -> None:
        grant_id, token_hash = parse_revocation(payload)
        self.tokens.forget(grant_id=grant_id, token_hash=token_hash)

    async def close(self) -> None:
        if self.revocations is not None:
            await self.revocations.close()
        refusals.drain()  # the sign-in path's refusals counted and not yet told

    async def housekeeping(self) -> None:
        # A flood's count is told as its minute ends, even with no refusal after it.
        refusals.flush()
        now = time.time()
        await self.store.delete_expired(now)
        await self.store.delete_stale_clients(now - self.config.client_ttl_without_grant_s)

    def routes(self) -> list[Route]:
        """Registration, sign-in, token and metadata endpoints."""
        return create_auth_routes(
            self.config,
            self.registrar,
            self.flow,
            self.tokens,
            store=self.store,
            ask_email=self.ask_email,
            registrations=self.registrations,
        )

    def gate(self, app: ASGIApp) -> ASGIApp:
        """``app`` behind the bearer check (a token bound to this server's /mcp)."""
        return BearerGate(app, self.tokens, self.config)


def build_auth(
    settings: Settings,
    engine: AsyncEngine,
    mailer: ReadyMailer,
    shared: SharedLimits,
    on_signin: Callable[[str, str | None], None] | None = None,
) -> AuthParts:
    """The authorization server over ``engine``, with the token key from the settings or
    the state dir; ``on_signin(sandbox_key, signin_prefix)`` hears each redeemed code.

    Raises:
        ConfigurationError: the token key cannot be read or created.
        StateDirUnusable: the state dir cannot be written.
    """
    auth = settings.auth
    prepare_state_dir(settings.storage)
    given = auth.token_key.get_secret_value() if auth.token_key else None
    try:
        token_key = load_or_create_key(settings.storage.state_dir / KEY_FILE, given)
        hasher = TokenHasher(token_key)
    except (ValueError, OSError) as exc:
        raise ConfigurationError(f"The token key cannot be used: {exc}") from exc
    config = auth.config(
        issuer=settings.server.effective_public_url,
        sandbox_idle_s=settings.pool.idle_timeout_s,
    )
    store = SqlAuthStore(engine)
    documents = (
        ClientDocuments(
            PublicFetcher(user_agent=f"sandbox-mcp/{service_version()}"),
            budget=shared.budget(
                "client_documents", auth.client_document_fetches_per_minute, config.shares
            ),
            shares=config.shares,  # also of the lookup threads
        )
        if auth.client_metadata_documents
        else None
    )
    sealer = Sealer(token_key)  # every process with this key opens what another sealed
    remember = mailer.remember if mailer.enabled else None
    return AuthParts(
        config=config,
        store=store,
        registrar=Registrar(store),
        flow=SigninFlow(
            config, ClientDirectory(store, documents), hasher, sealer, remember_email=remember
        ),
        # With other processes, verified tokens are cached only while their revocations
        # are heard (AuthParts.open).
        tokens=TokenService(
            config,
            store,
            hasher,
            sealer,
            listening=shared.revocations is None,
            on_signin=on_signin,
        ),
        registrations=shared.budget("register", config.registrations_per_minute, config.shares),
        ask_email=mailer.enabled,
        revocations=shared.revocations,
    )
