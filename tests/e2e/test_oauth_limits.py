"""Rate limits and memory bounds of the front door, each on its own server."""

from __future__ import annotations

import httpx2
import pytest
from e2e_server import DEFAULT_SHARES, RunningServer, Servers
from oauth_browser import ManualClient, pkce_pair, press_button, read_page

pytestmark = pytest.mark.e2e


@pytest.fixture
def limited(serve: Servers) -> RunningServer:
    return serve(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_REGISTRATIONS_PER_MINUTE="5",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="3",
        **DEFAULT_SHARES,
    )


async def test_14_a_registration_flood_gets_429(limited: RunningServer) -> None:
    async with httpx2.AsyncClient() as http:
        codes = [
            (
                await http.post(
                    f"{limited.base_url}/register", json={"redirect_uris": ["https://a.test/cb"]}
                )
            ).status_code
            for _ in range(8)
        ]
    # One address may spend 5% of the budget (rounded up): 1 of 5. The shares per
    # network and the global budget are in test_oauth_admission.py.
    assert codes[:1] == [201]
    assert codes[1:] == [429] * 7


async def test_27_sandbox_creation_is_rate_limited_per_browser_address(
    limited: RunningServer,
) -> None:
    async with httpx2.AsyncClient() as http:
        client = await ManualClient.register(http, limited.base_url)
        statuses = []
        for _ in range(4):
            _, challenge = pkce_pair()
            page = read_page(await http.get(client.authorize_url(challenge)))
            statuses.append((await press_button(http, limited.base_url, page)).status_code)
    assert statuses == [303, 303, 303, 429]


async def test_24_an_authorize_flood_keeps_the_server_answering(limited: RunningServer) -> None:
    # Pending sign-ins are capped (unit-tested with a small cap); here: 300 unanswered
    # pages do not break the server or the next real sign-in.
    async with httpx2.AsyncClient() as http:
        client = await ManualClient.register(http, limited.base_url)
        _, challenge = pkce_pair()
        for _ in range(300):
            assert (await http.get(client.authorize_url(challenge))).status_code == 200
        code, verifier = await client.sign_in(http)
        assert (await client.exchange(http, code, verifier)).status_code == 200
