"""Unit-test shortcuts for the sign-in flow: press the button as the handler does."""

from __future__ import annotations

from auth.admission import Admitted, SigninAdmission
from auth.config import AuthConfig
from auth.signin import Approval, SigninFlow, SigninPage
from auth.store import AuthStore

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
