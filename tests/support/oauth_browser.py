"""Plays the user's browser and a hand-rolled OAuth client against the real server."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2

REDIRECT_URI = "http://127.0.0.1:9/callback"


def pkce_pair() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
    return verifier, challenge.decode()


def authorization_request(
    client_id: str, redirect_uri: str, challenge: str, **extra: str
) -> dict[str, str]:
    """The parameters of an authorization-code request with PKCE (S256), plus ``extra``."""
    return {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        **extra,
    }


def query_of(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


@dataclass
class SigninPage:
    tx: str
    csrf: str
    cookie_name: str
    cookie: str
    html: str


def read_page(response: httpx2.Response) -> SigninPage:
    assert response.status_code == 200, response.text
    tx = re.search(r'name="tx" value="([^"]+)"', response.text)
    csrf = re.search(r'name="csrf" value="([^"]+)"', response.text)
    assert tx, response.text
    assert csrf, response.text
    name, value = next(iter(response.cookies.items()))
    return SigninPage(tx.group(1), csrf.group(1), name, value, response.text)


async def press_button(
    http: httpx2.AsyncClient, base_url: str, page: SigninPage, email: str = ""
) -> httpx2.Response:
    return await http.post(
        f"{base_url}/authorize",
        data={"tx": page.tx, "csrf": page.csrf, "email": email},
        headers={"cookie": f"{page.cookie_name}={page.cookie}"},
    )


@dataclass
class ManualClient:
    """A registered public client doing the authorization-code flow by hand."""

    base_url: str
    client_id: str

    @classmethod
    async def register(
        cls, http: httpx2.AsyncClient, base_url: str, redirect_uri: str = REDIRECT_URI
    ) -> ManualClient:
        response = await http.post(
            f"{base_url}/register",
            json={"redirect_uris": [redirect_uri], "client_name": "manual test client"},
        )
        assert response.status_code == 201, response.text
        return cls(base_url, response.json()["client_id"])

    def authorize_url(self, challenge: str, **extra: str) -> str:
        # A state of its own; ``extra`` may replace any parameter (the checklist's bad requests).
        state = "st-" + secrets.token_hex(4)
        params = authorization_request(self.client_id, REDIRECT_URI, challenge, state=state)
        params.update(extra)
        return f"{self.base_url}/authorize?{urlencode(params)}"

    async def sign_in(self, http: httpx2.AsyncClient) -> tuple[str, str]:
        """Returns (code, verifier)."""
        verifier, challenge = pkce_pair()
        page = read_page(await http.get(self.authorize_url(challenge)))
        answer = await press_button(http, self.base_url, page)
        assert answer.status_code == 303, answer.text
        return query_of(answer.headers["location"])["code"], verifier

    async def exchange(
        self, http: httpx2.AsyncClient, code: str, verifier: str, **extra: str
    ) -> httpx2.Response:
        return await http.post(
            f"{self.base_url}/token",
            data={
                "grant_type": "authorization_code",
                "code": code,
                "code_verifier": verifier,
                "client_id": self.client_id,
                "redirect_uri": REDIRECT_URI,
                **extra,
            },
        )

    async def tokens(self, http: httpx2.AsyncClient) -> dict[str, str]:
        code, verifier = await self.sign_in(http)
        response = await self.exchange(http, code, verifier)
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def access_token(self, http: httpx2.AsyncClient) -> str:
        """A new user's access token: every sign-in is a sandbox of its own."""
        return (await self.tokens(http))["access_token"]

    async def refresh(self, http: httpx2.AsyncClient, refresh_token: str) -> httpx2.Response:
        return await http.post(
            f"{self.base_url}/token",
            data={
                "grant_type": "refresh_token",
                "refresh_token": refresh_token,
                "client_id": self.client_id,
            },
        )


async def new_user(http: httpx2.AsyncClient, base_url: str) -> str:
    """A client registered and signed in once: its access token, for a sandbox of its own."""
    return await (await ManualClient.register(http, base_url)).access_token(http)


async def new_users(http: httpx2.AsyncClient, base_url: str, count: int) -> list[str]:
    """``count`` users signed in through one registered client: their access tokens."""
    client = await ManualClient.register(http, base_url)
    return [await client.access_token(http) for _ in range(count)]
