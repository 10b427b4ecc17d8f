"""Token lifetimes, the refresh grace window and reuse detection, with a clock we move.

Runs the real TokenService and SigninFlow on the real SQL store (SQLite).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from oauth_browser import authorization_request, pkce_pair, query_of
from signin_testkit import TOKEN_KEY, approve, flow_and_tokens, registered_client
from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.signin.auth_store import SqlAuthStore
from auth.config import AuthConfig
from auth.errors import OAuthError
from auth.grants import SIGNIN_CLAIM, TokenService
from auth.registration import Registrar
from auth.signin import MAX_STATE_CHARS, RedirectError, SigninFlow
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
            authorization_request(self.client.client_id, REDIRECT, challenge)
        )
        approval = await approve(self.flow, self.store, pending)
        return query_of(approval.location)["code"], verifier

    def form(self, **values: str) -> dict[str, str]:
        return {"client_id": self.client.client_id, "redirect_uri": REDIRECT, **values}

    async def pair(self) -> dict[str, object]:
        code, verifier = await self.code()
        return await self.tokens.exchange_code(
            self.client, self.form(code=code, code_verifier=verifier)
        )


@pytest.fixture
async def server(sqlite_engine: AsyncEngine) -> Server:
    clock = Clock()
    store = SqlAuthStore(sqlite_engine)
    flow, tokens = flow_and_tokens(AuthConfig(issuer="https://mcp.example.test"), store, clock)
    return Server(clock, flow, tokens, await registered_client(store, clock, REDIRECT), store)


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
    _, other = flow_and_tokens(
        AuthConfig(issuer="https://other.example.test"), server.store, server.clock
    )
    assert await other.verify_token(str(pair["access_token"])) is None


async def test_a_sign_in_started_on_one_process_is_pressed_and_redeemed_on_another(
    server: Server,
) -> None:
    """Nothing of a sign-in is kept where it started: a second flow and token service
    with the same token key (another process) finish it."""
    other_flow, other_tokens = flow_and_tokens(
        AuthConfig(issuer="https://mcp.example.test"), server.store, server.clock
    )
    verifier, challenge = pkce_pair()
    page = await server.flow.start(
        authorization_request(server.client.client_id, REDIRECT, challenge)
    )
    code = query_of((await approve(other_flow, server.store, page)).location)["code"]
    pair = await other_tokens.exchange_code(
        server.client, server.form(code=code, code_verifier=verifier)
    )
    assert await other_tokens.verify_token(str(pair["access_token"])) is not None
    with pytest.raises(OAuthError, match="already used"):
        await server.tokens.exchange_code(
            server.client, server.form(code=code, code_verifier=verifier)
        )
    assert await other_tokens.verify_token(str(pair["access_token"])) is not None, (
        "cached for a few seconds at most"
    )
    server.clock.now += 6
    assert await other_tokens.verify_token(str(pair["access_token"])) is None, (
        "the replay on one process revoked the grant for the other within the bound"
    )


async def test_stale_clients_without_a_grant_are_removed(server: Server) -> None:
    unused = await Registrar(server.store, server.clock).register({"redirect_uris": [REDIRECT]})
    await server.pair()  # the fixture's client completes a grant
    removed = await server.store.delete_stale_clients(server.clock.now + 1)
    assert removed == 1
    assert await server.store.load_client(str(unused["client_id"])) is None
    assert await server.store.load_client(server.client.client_id) is not None


async def test_the_longest_state_travels_sealed_and_a_longer_one_is_refused(
    server: Server,
) -> None:
    _, challenge = pkce_pair()
    params = authorization_request(server.client.client_id, REDIRECT, challenge)
    longest = "\u00e9\U0001f600" * (MAX_STATE_CHARS // 2)
    page = await server.flow.start({**params, "state": longest})
    assert len(page.tx) < 16_000, "fits the button's 16 KB form"
    assert server.flow.pressed(page.tx, page.csrf, page.csrf).state == longest
    with pytest.raises(RedirectError) as caught:
        await server.flow.start({**params, "state": "x" * (MAX_STATE_CHARS + 1)})
    assert "state is longer than 2048" in query_of(caught.value.location)["error_description"]


async def test_the_access_token_names_the_address_that_signed_in(server: Server) -> None:
    """The tool layer shares the tenant threads among one address's sandboxes
    (app/tenancy/threads.py): the verified token says which address."""
    verifier, challenge = pkce_pair()
    pending = await server.flow.start(
        authorization_request(server.client.client_id, REDIRECT, challenge)
    )
    approval = await approve(server.flow, server.store, pending, prefix="203.0.113.7")
    pair = await server.tokens.exchange_code(
        server.client, server.form(code=query_of(approval.location)["code"], code_verifier=verifier)
    )
    for _ in range(2):  # from the database, then from the verified-token cache
        access = await server.tokens.verify_token(str(pair["access_token"]))
        assert access is not None
        assert access.claims == {SIGNIN_CLAIM: "203.0.113.7"}
    plain = await server.tokens.verify_token(str((await server.pair())["access_token"]))
    assert plain is not None
    assert plain.claims is None  # signed in with no address key: nothing shared


def other_process(server: Server, *, listening: bool = True) -> TokenService:
    """A second TokenService on the same store and key: another process of the server."""
    config = AuthConfig(issuer="https://mcp.example.test")
    _, tokens = flow_and_tokens(config, server.store, server.clock)
    if not listening:
        tokens.listening(False)
    return tokens


async def test_a_revocation_heard_drops_the_cached_token(server: Server) -> None:
    other = other_process(server)
    pair = await server.pair()
    access = str(pair["access_token"])
    assert await other.verify_token(access) is not None  # cached there
    await server.tokens.revoke(server.client, access)
    assert await other.verify_token(access) is not None, "not heard yet: the cache holds"
    # What the notification does on arrival (app.root.oauth.AuthParts._revoked).
    other.forget(token_hash=TokenHasher(TOKEN_KEY).digest(access))
    assert await other.verify_token(access) is None


async def test_a_process_that_cannot_hear_revocations_caches_nothing(server: Server) -> None:
    deaf = other_process(server, listening=False)
    pair = await server.pair()
    access = str(pair["access_token"])
    assert await deaf.verify_token(access) is not None
    await server.tokens.revoke(server.client, access)
    assert await deaf.verify_token(access) is None, "asked the database again"


async def test_a_verification_overtaken_by_a_revocation_does_not_cache(server: Server) -> None:
    other = other_process(server)
    pair = await server.pair()
    access = str(pair["access_token"])
    store = server.store
    read = store.load_token

    async def read_then_hear(token_hash: str) -> object:
        found = await read(token_hash)
        # The revocation commits and its notice arrives while the read is answered.
        await store.delete_token(token_hash)
        other.forget(token_hash=token_hash)
        return found

    store.load_token = read_then_hear  # type: ignore[method-assign]
    try:
        assert await other.verify_token(access) is not None  # what was read: still valid
    finally:
        store.load_token = read  # type: ignore[method-assign]
    assert await other.verify_token(access) is None, "what it read was not cached"
