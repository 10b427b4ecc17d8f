"""A metadata-document client signs in, redeems its code and refreshes, on the real SQL store.

The document is served over real TLS on loopback (see test_client_documents.py
for why the address policy admits loopback here).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fetch_testkit import Clock, documents
from oauth_browser import authorization_request, pkce_pair, query_of
from signin_testkit import approve
from sqlalchemy.ext.asyncio import AsyncEngine
from tls_testkit import Answer, DocumentServer, ThrowawayCA

from app.storage.signin.auth_store import SqlAuthStore
from auth.clients import ClientDirectory, UnknownClient
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.sealing import Sealer
from auth.signin import LocalError, SigninFlow
from auth.tokens import TokenHasher

REDIRECT = "http://127.0.0.1:9/cb"
CONFIG = AuthConfig(issuer="https://mcp.example.test")


@pytest.fixture
def store(sqlite_engine: AsyncEngine) -> SqlAuthStore:
    return SqlAuthStore(sqlite_engine)


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
    return SigninFlow(CONFIG, directory, TokenHasher(b"k" * 32), Sealer(b"k" * 32))


def authorize(client_id: str, challenge: str) -> dict[str, str]:
    return authorization_request(client_id, REDIRECT, challenge, state="st")


async def test_a_document_client_signs_in_redeems_and_refreshes(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    clock = Clock()
    url = publish(server, [REDIRECT])
    codes = Sealer(b"k" * 32)
    hasher = TokenHasher(b"k" * 32)
    flow = SigninFlow(CONFIG, ClientDirectory(store, documents(ca, clock)), hasher, codes)
    tokens = TokenService(CONFIG, store, hasher, codes)
    verifier, challenge = pkce_pair()

    pending = await flow.start(authorize(url, challenge))
    assert pending.signin.client_name == "Doc client"
    approval = await approve(flow, store, pending)
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
    flow = SigninFlow(
        CONFIG, ClientDirectory(store, None), TokenHasher(b"k" * 32), Sealer(b"k" * 32)
    )
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
    assert pending.signin.redirect_uri == "http://127.0.0.1:51234/cb"
    with pytest.raises(LocalError, match="not one the application registered"):
        await flow.start({**params, "redirect_uri": "http://127.0.0.1:51234/other"})


async def signed_in_before(ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore) -> str:
    """A document client that completed a sign-in (its row has a last grant)."""
    url = publish(server, [REDIRECT])
    codes = Sealer(b"k" * 32)
    hasher = TokenHasher(b"k" * 32)
    flow = SigninFlow(CONFIG, ClientDirectory(store, documents(ca, Clock())), hasher, codes)
    verifier, challenge = pkce_pair()
    pending = await flow.start(authorize(url, challenge))
    code = query_of((await approve(flow, store, pending)).location)
    form = {"client_id": url, "code": code["code"], "code_verifier": verifier}
    tokens = TokenService(CONFIG, store, hasher, codes)
    await tokens.exchange_code(await tokens.client(form), {**form, "redirect_uri": REDIRECT})
    return url


async def test_after_a_restart_a_known_client_is_served_from_its_row_while_the_budget_is_spent(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    known = await signed_in_before(ca, server, store)
    fetched = len(server.seen)
    # A restart: nothing in memory. A flood from three networks spends the budget.
    directory = ClientDirectory(store, documents(ca, Clock(), fetches_per_minute=3))
    for number in range(3):
        server.answers[f"/flood{number}.json"] = Answer(404, b"no")
        flood = f"https://client.test:{server.port}/flood{number}.json"
        with pytest.raises(UnknownClient):
            await directory.for_authorization(flood, prefix=f"198.51.100.{number}")
    with pytest.raises(UnknownClient, match="Too many new applications"):
        await directory.for_authorization(f"https://client.test:{server.port}/new.json")
    client = await directory.for_authorization(known, prefix="203.0.113.9")
    assert client.client_id == known
    assert client.redirect_uris == (REDIRECT,)
    assert len(server.seen) == fetched + 3, "the known client cost no fetch"
    # A malformed request for it (no PKCE) is not a reason to fetch either: the stored
    # row lets the error go back to the client's redirect URI.
    assert (await directory.for_authorization(known, may_fetch=False)).client_id == known


async def test_a_stored_row_without_a_sign_in_is_not_a_known_client(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    url = publish(server, [REDIRECT])
    await ClientDirectory(store, documents(ca, Clock())).for_authorization(url)  # row, no grant
    directory = ClientDirectory(store, documents(ca, Clock(), fetches_per_minute=1))
    with pytest.raises(UnknownClient, match="HTTP 404"):  # spends the minute's one fetch
        await directory.for_authorization(f"https://client.test:{server.port}/oauth/other.json")
    with pytest.raises(UnknownClient, match="Too many new applications"):
        await directory.for_authorization(url)


async def test_a_withdrawn_document_is_refused_despite_its_stored_row(
    ca: ThrowawayCA, server: DocumentServer, store: SqlAuthStore
) -> None:
    known = await signed_in_before(ca, server, store)
    server.answers["/oauth/client.json"] = Answer(404, b"gone")
    directory = ClientDirectory(store, documents(ca, Clock()))  # a restart, budget to spare
    with pytest.raises(UnknownClient, match="HTTP 404"):
        await directory.for_authorization(known)
