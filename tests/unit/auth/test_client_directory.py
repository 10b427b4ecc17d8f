"""A metadata-document client signs in, redeems its code and refreshes, on the real SQL store.

The document is served over real TLS on loopback (see test_client_documents.py
for why the address policy admits loopback here).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fetch_testkit import Clock, documents
from oauth_browser import pkce_pair, query_of
from tls_testkit import Answer, DocumentServer, ThrowawayCA

from app.auth_store import SqlAuthStore
from app.db import create_engine, upgrade_schema
from auth.clients import ClientDirectory
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.pending import CodeGrant, ExpiringMap
from auth.signin import LocalError, SigninFlow
from auth.tokens import TokenHasher

REDIRECT = "http://127.0.0.1:9/cb"
CONFIG = AuthConfig(issuer="https://mcp.example.test")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqlAuthStore]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    await upgrade_schema(engine)
    yield SqlAuthStore(engine)
    await engine.dispose()


def publish(server: DocumentServer, redirect_uris: list[str], name: str = "Doc client") -> str:
    url = f"https://client.test:{server.port}/oauth/client.json"
    document = {"client_id": url, "client_name": name, "redirect_uris": redirect_uris}
    server.answers["/oauth/client.json"] = Answer(
        body=json.dumps(document).encode(), headers={"Cache-Control": "max-age=60"}
    )
    return url


def document_flow(ca: ThrowawayCA, store: SqlAuthStore) -> SigninFlow:
    """A sign-in flow that accepts metadata documents served by the test server."""
    directory = ClientDirectory(store, documents(ca, Clock()))
    return SigninFlow(CONFIG, directory, TokenHasher(b"k" * 32), ExpiringMap(9))


def authorize(client_id: str, challenge: str) -> dict[str, str]:
    return {
        "client_id": client_id,
        "redirect_uri": REDIRECT,
        "response_type": "code",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "st",
    }


async def test_a_document_client_signs_in_redeems_and_refreshes(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    clock = Clock()
    url = publish(server, [REDIRECT])
    codes: ExpiringMap[CodeGrant] = ExpiringMap(100)
    hasher = TokenHasher(b"k" * 32)
    flow = SigninFlow(CONFIG, ClientDirectory(store, documents(ca, clock)), hasher, codes)
    tokens = TokenService(CONFIG, store, hasher, codes)
    verifier, challenge = pkce_pair()

    pending = await flow.start(authorize(url, challenge))
    assert pending.client_name == "Doc client"
    approval = flow.approve(flow.pressed(pending.tx, pending.csrf, pending.csrf), "")
    code = query_of(approval.location)["code"]

    form = {"client_id": url, "code": code, "code_verifier": verifier, "redirect_uri": REDIRECT}
    client = await tokens.client(form)  # from the store: /token fetches nothing
    assert len(server.seen) == 1
    pair = await tokens.exchange_code(client, form)
    assert await tokens.verify_token(str(pair["access_token"])) is not None
    refreshed = await tokens.refresh(
        client, {"client_id": url, "refresh_token": str(pair["refresh_token"])}
    )
    assert refreshed["refresh_token"] != pair["refresh_token"]
    stored = await store.load_client(url)
    assert stored is not None
    assert stored.last_grant_at is not None


async def test_a_changed_document_updates_the_stored_client_and_keeps_its_history(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    clock = Clock()
    directory = ClientDirectory(store, documents(ca, clock))
    url = publish(server, ["https://a.example/cb"], name="Old name")
    first = await directory.for_authorization(url)
    publish(server, ["https://b.example/cb"], name="New name")
    assert (await directory.for_authorization(url)) == first, "cached for max-age"
    clock.now += 61
    await directory.for_authorization(url)
    stored = await store.load_client(url)
    assert stored is not None
    assert stored.client_name == "New name"
    assert stored.redirect_uris == ("https://b.example/cb",)
    assert stored.created_at == first.created_at


async def test_concurrent_first_sign_ins_store_the_client_once(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    directory = ClientDirectory(store, documents(ca, Clock()))
    url = publish(server, [REDIRECT])
    clients = await asyncio.gather(*(directory.for_authorization(url) for _ in range(5)))
    assert {c.client_id for c in clients} == {url}
    assert await store.load_client(url) is not None


async def test_a_refused_document_is_explained_on_the_local_page_and_stores_nothing(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    url = publish(server, ["http://evil.example/cb"])
    flow = document_flow(ca, store)
    _, challenge = pkce_pair()
    with pytest.raises(LocalError) as caught:
        await flow.start(authorize(url, challenge))
    assert "metadata document was refused" in caught.value.message
    assert "loopback" in caught.value.message
    assert await store.load_client(url) is None


async def test_with_documents_off_a_url_client_id_is_unknown(store: SqlAuthStore) -> None:
    flow = SigninFlow(CONFIG, ClientDirectory(store, None), TokenHasher(b"k" * 32), ExpiringMap(9))
    _, challenge = pkce_pair()
    with pytest.raises(LocalError, match="does not accept client metadata documents"):
        await flow.start(authorize("https://claude.ai/oauth/mcp-oauth-client-metadata", challenge))


async def test_a_document_loopback_redirect_may_use_any_port(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    url = publish(server, ["http://127.0.0.1/cb"])
    flow = document_flow(ca, store)
    _, challenge = pkce_pair()
    params = {**authorize(url, challenge), "redirect_uri": "http://127.0.0.1:51234/cb"}
    pending = await flow.start(params)
    assert pending.redirect_uri == "http://127.0.0.1:51234/cb"
    with pytest.raises(LocalError, match="not one the application registered"):
        await flow.start({**params, "redirect_uri": "http://127.0.0.1:51234/other"})
