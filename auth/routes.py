"""``create_auth_routes``: the authorization server's endpoints, wired from their parts."""

from __future__ import annotations

from starlette.routing import Route

from auth.admission import SigninAdmission
from auth.client_address import ClientAddresses
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.handlers.authorize import AuthorizeHandler
from auth.handlers.metadata import (
    AuthorizationServerMetadataHandler,
    ProtectedResourceMetadataHandler,
)
from auth.handlers.register import RegistrationHandler
from auth.handlers.revoke import RevocationHandler
from auth.handlers.token import TokenHandler
from auth.ratelimit import Budget, PrefixedBudget
from auth.registration import Registrar
from auth.signin import SigninFlow
from auth.store import AuthStore


def create_auth_routes(
    config: AuthConfig,
    registrar: Registrar,
    flow: SigninFlow,
    tokens: TokenService,
    *,
    store: AuthStore,
    ask_email: bool,
    registrations: Budget | None = None,
) -> list[Route]:
    """``registrations``: the budget of ``/register`` shared by every process; by default
    in this process's memory."""
    as_metadata = AuthorizationServerMetadataHandler(config)
    pr_metadata = ProtectedResourceMetadataHandler(config)
    addresses = ClientAddresses(config.trusted_proxies, config.proxy_header)
    authorize = AuthorizeHandler(
        config, flow, addresses, SigninAdmission(config, store), ask_email=ask_email
    )
    register = RegistrationHandler(
        registrar,
        addresses,
        registrations or PrefixedBudget(config.registrations_per_minute, 60, shares=config.shares),
    )
    return [
        Route("/.well-known/oauth-authorization-server", as_metadata.handle, methods=["GET"]),
        Route("/.well-known/oauth-protected-resource", pr_metadata.handle, methods=["GET"]),
        Route("/.well-known/oauth-protected-resource/mcp", pr_metadata.handle, methods=["GET"]),
        Route("/register", register.handle, methods=["POST"]),
        Route("/authorize", authorize.handle, methods=["GET", "POST"]),
        Route("/token", TokenHandler(tokens).handle, methods=["POST"]),
        Route("/revoke", RevocationHandler(tokens).handle, methods=["POST"]),
    ]
