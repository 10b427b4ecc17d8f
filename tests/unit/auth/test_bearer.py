"""The bearer gate: who the request is, told to the tools through the SDK's context."""

from __future__ import annotations

from typing import Any, cast

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from starlette.types import Message, Receive, Scope, Send

from auth.bearer import BearerGate
from auth.config import SCOPE, AuthConfig
from auth.grants import TokenService

GOOD = "good-token"


class Tokens:
    """Knows one token, for the sandbox ``sandbox-1``."""

    async def verify_token(self, token: str) -> AccessToken | None:
        if token != GOOD:
            return None
        return AccessToken(token=token, client_id="c", scopes=[SCOPE], subject="sandbox-1")


def http_scope(*headers: tuple[bytes, bytes]) -> Scope:
    return {"type": "http", "path": "/mcp", "method": "POST", "headers": list(headers)}


async def answer(gate: BearerGate, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await gate(scope, receive, send)
    return sent


def gate_seeing(seen: list[Any]) -> BearerGate:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        token = get_access_token()
        seen.append(token.subject if token else None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return BearerGate(app, cast(TokenService, Tokens()), AuthConfig(issuer="https://mcp.test"))


async def test_the_app_reads_the_caller_from_the_context_only_during_the_request() -> None:
    seen: list[Any] = []
    gate = gate_seeing(seen)
    sent = await answer(gate, http_scope((b"authorization", f"Bearer {GOOD}".encode())))
    assert sent[0]["status"] == 200
    assert seen == ["sandbox-1"]
    assert get_access_token() is None  # reset once the request is answered


async def test_the_first_authorization_header_is_the_one_read() -> None:
    seen: list[Any] = []
    gate = gate_seeing(seen)
    scope = http_scope(
        (b"host", b"mcp.test"),
        (b"authorization", f"bearer {GOOD}".encode()),  # the scheme in any case
        (b"authorization", b"Bearer other"),
    )
    assert (await answer(gate, scope))[0]["status"] == 200
    assert seen == ["sandbox-1"]


async def test_a_missing_or_unknown_token_never_reaches_the_app() -> None:
    seen: list[Any] = []
    gate = gate_seeing(seen)
    missing = await answer(gate, http_scope((b"host", b"mcp.test")))
    unknown = await answer(gate, http_scope((b"authorization", b"Bearer made-up")))
    assert [missing[0]["status"], unknown[0]["status"]] == [401, 401]
    assert b"invalid_token" not in dict(missing[0]["headers"])[b"www-authenticate"]
    assert b'error="invalid_token"' in dict(unknown[0]["headers"])[b"www-authenticate"]
    assert seen == []


async def test_other_paths_pass_without_a_caller() -> None:
    seen: list[Any] = []
    gate = gate_seeing(seen)
    scope = http_scope((b"authorization", f"Bearer {GOOD}".encode()))
    scope["path"] = "/health"
    assert (await answer(gate, scope))[0]["status"] == 200
    assert seen == [None]
