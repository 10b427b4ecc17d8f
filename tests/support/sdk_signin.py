"""The official SDK client's OAuthClientProvider, with this test suite playing the browser."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx2
from e2e_server import RunningServer
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from oauth_browser import press_button, query_of, read_page
from pydantic import AnyHttpUrl


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


@dataclass
class SdkSignin:
    """A provider for ``httpx2.AsyncClient(auth=...)``; ``pages`` holds each sign-in page
    it was shown and ``redirects`` the query of each redirect back."""

    provider: OAuthClientProvider
    storage: MemoryStorage
    pages: list[str] = field(default_factory=list)
    redirects: list[dict[str, str]] = field(default_factory=list)


def sdk_signin(
    server: RunningServer,
    *,
    client_name: str,
    redirect_uri: str,
    client_metadata_url: str | None = None,
) -> SdkSignin:
    """The SDK opens the sign-in page; the "browser" loads it, presses the button and
    hands the code from the 303 back to the SDK."""
    storage = MemoryStorage()
    pages: list[str] = []
    redirects: list[dict[str, str]] = []

    async def browser(auth_url: str) -> None:
        async with httpx2.AsyncClient() as http:
            page = read_page(await http.get(auth_url))
            pages.append(page.html)
            answer = await press_button(http, server.base_url, page)
            assert answer.status_code == 303, answer.text
            redirects.append(query_of(answer.headers["location"]))

    async def callback() -> AuthorizationCodeResult:
        query = redirects[-1]
        return AuthorizationCodeResult(
            code=query["code"], state=query.get("state"), iss=query.get("iss")
        )

    provider = OAuthClientProvider(
        server.mcp_url,
        OAuthClientMetadata(
            client_name=client_name,
            redirect_uris=[AnyHttpUrl(redirect_uri)],
            token_endpoint_auth_method="none",
        ),
        storage,  # type: ignore[arg-type]
        browser,
        callback,
        client_metadata_url=client_metadata_url,
    )
    return SdkSignin(provider, storage, pages, redirects)
