"""Unit-test shortcuts for the sign-in flow: press the button as the handler does."""

from __future__ import annotations

from collections.abc import Callable

from auth.admission import Admitted, SigninAdmission
from auth.clients import ClientDirectory
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.registration import Registrar
from auth.sealing import Sealer
from auth.signin import Approval, SigninFlow, SigninPage
from auth.store import AuthStore, Client
from auth.tokens import TokenHasher

TOKEN_KEY = b"k" * 32

# Limits no unit test of the flow itself reaches.
ROOMY = AuthConfig(
    issuer="https://mcp.example.test",
    signins_per_address_per_minute=10_000,
    sandboxes_per_address=10_000,
    new_sandboxes_per_hour=10_000,
)


async def approve(
    flow: SigninFlow,
    store: AuthStore,
    page: SigninPage,
    *,
    prefix: str | None = None,
    email: str = "",
    admission: SigninAdmission | None = None,
) -> Approval:
    """Press the button of ``page`` (CSRF checked, admitted, code recorded), as
    ``POST /authorize`` does; fails the test if admission refuses."""
    pending = flow.pressed(page.tx, page.csrf, page.csrf)
    admitted = await (admission or SigninAdmission(ROOMY, store)).admit(
        flow.issued_code(pending, prefix)
    )
    assert isinstance(admitted, Admitted), admitted
    return flow.approve(pending, email, admitted.issued, first=admitted.first)


def flow_and_tokens(
    config: AuthConfig, store: AuthStore, clock: Callable[[], float]
) -> tuple[SigninFlow, TokenService]:
    """The sign-in flow and the token service on ``store`` with the tests' token key:
    two pairs built on one store behave as two processes of one server."""
    hasher, codes = TokenHasher(TOKEN_KEY), Sealer(TOKEN_KEY)
    return (
        SigninFlow(config, ClientDirectory(store, None), hasher, codes, clock=clock),
        TokenService(config, store, hasher, codes, clock),
    )


async def registered_client(
    store: AuthStore, clock: Callable[[], float], redirect_uri: str
) -> Client:
    """A public client registered (as ``POST /register`` does) with one redirect URI."""
    registered = await Registrar(store, clock).register({"redirect_uris": [redirect_uri]})
    client = await store.load_client(str(registered["client_id"]))
    assert client is not None
    return client
