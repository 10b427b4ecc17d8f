"""Token lifetimes, the refresh grace window and reuse detection, with a clock we move.

Runs the real TokenService and SigninFlow on the real SQL store (SQLite).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from oauth_browser import pkce_pair, query_of
from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.auth_store import SqlAuthStore
from auth.clients import ClientDirectory
from auth.config import AuthConfig
from auth.errors import OAuthError
from auth.grants import TokenService
from auth.pending import CodeGrant, ExpiringMap
from auth.registration import Registrar
from auth.signin import LocalError, SigninFlow
from auth.store import Client
from auth.tokens import TokenHasher

REDIRECT = "http://127.0.0.1:9/cb"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    clock: Clock
    flow: SigninFlow
    tokens: TokenService
    client: Client
    store: SqlAuthStore

    async def code(self) -> tuple[str, str]:
        verifier, challenge = pkce_pair()
        pending = await self.flow.start(
            {
                "client_id": self.client.client_id,
                "redirect_uri": REDIRECT,
                "response_type": "code",
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            }
        )
        approval = self.flow.approve(self.flow.pressed(pending.tx, pending.csrf, pending.csrf), "")
        return query_of(approval.location)["code"], verifier

    def form(self, **values: str) -> dict[str, str]:
        return {"client_id": self.client.client_id, "redirect_uri": REDIRECT, **values}

    async def pair(self) -> dict[str, object]:
        code, verifier = await self.code()
        return await self.tokens.exchange_code(
            self.client, self.form(code=code, code_verifier=verifier)
        )


@pytest.fixture
async def server(sqlite_engine: AsyncEngine) -> AsyncIterator[Server]:
    engine = sqlite_engine
    clock = Clock()
    config = AuthConfig(issuer="https://mcp.example.test", max_pending_signins=5)
    store = SqlAuthStore(engine)
    hasher = TokenHasher(b"k" * 32)
    codes: ExpiringMap[CodeGrant] = ExpiringMap(100, clock)
    registered = await Registrar(store, clock).register({"redirect_uris": [REDIRECT]})
    client = await store.load_client(str(registered["client_id"]))
    assert client is not None
    yield Server(
        clock,
        SigninFlow(config, ClientDirectory(store, None), hasher, codes, clock=clock),
        TokenService(config, store, hasher, codes, clock),
        client,
        store,
    )
    await engine.dispose()


async def test_a_code_used_after_ten_minutes_is_invalid(server: Server) -> None:
    code, verifier = await server.code()
    server.clock.now += 601
    with pytest.raises(OAuthError) as caught:
        await server.tokens.exchange_code(
            server.client, server.form(code=code, code_verifier=verifier)
        )
    assert caught.value.error == "invalid_grant"


async def test_access_tokens_expire_after_an_hour(server: Server) -> None:
    pair = await server.pair()
    assert await server.tokens.verify_token(str(pair["access_token"])) is not None
    server.clock.now += 3601
    assert await server.tokens.verify_token(str(pair["access_token"])) is None


async def test_refresh_reuse_inside_grace_gets_same_pair_and_after_grace_revokes_family(
    server: Server,
) -> None:
    first = await server.pair()
    rt1 = str(first["refresh_token"])
    second = await server.tokens.refresh(server.client, server.form(refresh_token=rt1))
    server.clock.now += 5
    assert await server.tokens.refresh(server.client, server.form(refresh_token=rt1)) == second
    server.clock.now += 115  # +120 s after the rotation
    with pytest.raises(OAuthError) as caught:
        await server.tokens.refresh(server.client, server.form(refresh_token=rt1))
    assert caught.value.error == "invalid_grant"
    # The whole family is dead: the newest refresh and access tokens too.
    assert await server.tokens.verify_token(str(second["access_token"])) is None
    with pytest.raises(OAuthError):
        await server.tokens.refresh(
            server.client, server.form(refresh_token=str(second["refresh_token"]))
        )


async def test_refresh_tokens_expire_after_30_days(server: Server) -> None:
    pair = await server.pair()
    server.clock.now += 30 * 86400 + 1
    with pytest.raises(OAuthError):
        await server.tokens.refresh(
            server.client, server.form(refresh_token=str(pair["refresh_token"]))
        )


async def test_refresh_keeps_the_sandbox_key(server: Server) -> None:
    pair = await server.pair()
    before = await server.tokens.verify_token(str(pair["access_token"]))
    new = await server.tokens.refresh(
        server.client, server.form(refresh_token=str(pair["refresh_token"]))
    )
    after = await server.tokens.verify_token(str(new["access_token"]))
    assert before is not None
    assert after is not None
    assert before.subject == after.subject
    assert len(before.subject or "") >= 43  # 256-bit sandbox key


async def test_a_token_bound_to_another_resource_is_refused(server: Server, tmp_path: Path) -> None:
    pair = await server.pair()
    other = TokenService(
        AuthConfig(issuer="https://other.example.test"),
        server.store,
        TokenHasher(b"k" * 32),
        ExpiringMap(10, server.clock),
        server.clock,
    )
    assert await other.verify_token(str(pair["access_token"])) is None


async def test_pending_sign_ins_are_capped(server: Server) -> None:
    _, challenge = pkce_pair()
    params = {
        "client_id": server.client.client_id,
        "redirect_uri": REDIRECT,
        "response_type": "code",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    for _ in range(5):
        await server.flow.start(params)
    with pytest.raises(LocalError) as caught:
        await server.flow.start(params)
    assert caught.value.status == 503
    server.clock.now += 601  # expired ones make room again
    await server.flow.start(params)
    assert server.flow.pending_count == 1


async def test_stale_clients_without_a_grant_are_removed(server: Server) -> None:
    unused = await Registrar(server.store, server.clock).register({"redirect_uris": [REDIRECT]})
    await server.pair()  # the fixture's client completes a grant
    removed = await server.store.delete_stale_clients(server.clock.now + 1)
    assert removed == 1
    assert await server.store.load_client(str(unused["client_id"])) is None
    assert await server.store.load_client(server.client.client_id) is not None
