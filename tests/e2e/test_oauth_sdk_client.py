"""The official MCP SDK client signs in, calls tools and refreshes, in both protocol eras."""

from __future__ import annotations

import time

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sdk_signin import sdk_signin

pytestmark = pytest.mark.e2e


@pytest.fixture
def oauth_server(serve: Servers) -> RunningServer:
    return serve(SANDBOX_MCP_AUTH="oauth", SANDBOX_MCP_POOL_SIZE="4")


async def test_sdk_client_full_flow_both_eras_and_rotating_refresh(
    oauth_server: RunningServer,
) -> None:
    signin = sdk_signin(
        oauth_server, client_name="sdk e2e", redirect_uri="http://127.0.0.1:9/callback"
    )
    provider, storage, pages = signin.provider, signin.storage, signin.pages
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
        assert signin.redirects[0]["iss"] == oauth_server.base_url
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
