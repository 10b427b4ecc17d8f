"""The official MCP SDK client signs in, calls tools and refreshes, in both protocol eras."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from oauth_browser import press_button, query_of, read_page
from pydantic import AnyHttpUrl

pytestmark = pytest.mark.e2e


@pytest.fixture
def oauth_server(tmp_path: Path) -> Iterator[RunningServer]:
    running = start_server(tmp_path / "state", SANDBOX_MCP_AUTH="oauth", SANDBOX_MCP_POOL_SIZE="4")
    yield running
    stop_server(running)


class MemoryStorage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


async def test_sdk_client_full_flow_both_eras_and_rotating_refresh(
    oauth_server: RunningServer,
) -> None:
    result: dict[str, str | None] = {}
    pages: list[str] = []

    async def browser(auth_url: str) -> None:
        async with httpx2.AsyncClient() as http:
            page = read_page(await http.get(auth_url))
            pages.append(page.html)
            answer = await press_button(http, oauth_server.base_url, page)
            assert answer.status_code == 303
            query = query_of(answer.headers["location"])
            result.update(code=query["code"], state=query.get("state"), iss=query.get("iss"))

    async def callback() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(**result)  # type: ignore[arg-type]

    storage = MemoryStorage()
    provider = OAuthClientProvider(
        oauth_server.mcp_url,
        OAuthClientMetadata(
            client_name="sdk e2e",
            redirect_uris=[AnyHttpUrl("http://127.0.0.1:9/callback")],
            token_endpoint_auth_method="none",
        ),
        storage,  # type: ignore[arg-type]
        browser,
        callback,
    )
    fingerprints = set()
    async with httpx2.AsyncClient(auth=provider, timeout=30) as http:
        for mode in ("legacy", "auto"):
            async with Client(
                streamable_http_client(oauth_server.mcp_url, http_client=http), mode=mode
            ) as client:  # type: ignore[arg-type]
                outcome = await client.call_tool("sandbox_status", {})
                assert not outcome.is_error, outcome
                assert outcome.structured_content is not None
                fingerprints.add(outcome.structured_content["sandbox"])
        assert len(pages) == 1, "the SDK signed in once and reused the token"
        assert result["iss"] == oauth_server.base_url
        assert storage.tokens is not None
        old_refresh = storage.tokens.refresh_token
        provider.context.token_expiry_time = time.time() - 1  # the access token "expired"
        async with Client(streamable_http_client(oauth_server.mcp_url, http_client=http)) as client:  # type: ignore[arg-type]
            outcome = await client.call_tool("sandbox_status", {})
            assert not outcome.is_error
            assert outcome.structured_content is not None
            fingerprints.add(outcome.structured_content["sandbox"])
        assert storage.tokens.refresh_token != old_refresh, "refresh tokens rotate on use"
    assert len(fingerprints) == 1, "a refresh keeps the same sandbox key"
    assert "Create my sandbox" in pages[0]
    assert "sdk e2e" in pages[0]
