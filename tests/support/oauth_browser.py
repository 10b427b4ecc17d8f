"""Plays the user's browser and a hand-rolled OAuth client against the real server."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2
from e2e_server import RunningServer

REDIRECT_URI = "http://127.0.0.1:9/callback"


def pkce_pair() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
    return verifier, challenge.decode()


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
        params = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": REDIRECT_URI,
            "state": "st-" + secrets.token_hex(4),
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            **extra,
        }
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

    async def refresh(self, http: httpx2.AsyncClient, refresh_token: str) -> httpx2.Response:
        return await http.post(
            f"{self.base_url}/token",
            data={
                "grant_type": "refresh_token",
                "refresh_token": refresh_token,
                "client_id": self.client_id,
            },
        )


async def call_tool(
    http: httpx2.AsyncClient, base_url: str, token: str, name: str = "sandbox_status"
) -> httpx2.Response:
    """One sessionless (2026-07-28) tools/call with a bearer token."""
    return await http.post(
        f"{base_url}/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": name,
                "arguments": {},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        },
        headers={
            "authorization": f"Bearer {token}",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": name,
        },
    )


async def tool(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    name: str,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One sessionless tools/call; returns the structured content plus ``is_error``."""
    response = await http.post(
        server.mcp_url,
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": name,
                "arguments": arguments or {},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        },
        headers={
            # An empty token means local mode (SANDBOX_MCP_AUTH=none): no header at all.
            **({"authorization": f"Bearer {token}"} if token else {}),
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": name,
        },
    )
    assert response.status_code == 200, response.text
    body = read_jsonrpc(response)
    assert "result" in body, body
    result = body["result"]
    structured = result.get("structuredContent") or {}
    return {"is_error": result.get("isError", False), **structured}


async def probe(
    http: httpx2.AsyncClient, server: RunningServer, token: str, write: str = ""
) -> dict[str, Any]:
    """Call the test suite's slot-taking probe tool (tests/support/probe_app.py)."""
    return await tool(http, server, token, "probe_sandbox", {"write": write})


SESSIONLESS_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


async def post_rpc(
    http: httpx2.AsyncClient,
    mcp_url: str,
    method: str,
    params: dict[str, Any],
    *,
    token: str = "",
    name: str | None = None,
    capabilities: dict[str, Any] | None = None,
) -> httpx2.Response:
    """One sessionless (2026-07-28) JSON-RPC request; ``name`` fills the Mcp-Name header.

    ``params`` goes out as given (plus the protocol ``_meta``, declaring
    ``capabilities``, none by default), so tests can send arguments of any shape,
    hostile ones included."""
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": method,
        **({"mcp-name": name} if name is not None else {}),
        **({"authorization": f"Bearer {token}"} if token else {}),
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": method,
        "params": {
            **params,
            "_meta": {
                **SESSIONLESS_META,
                "io.modelcontextprotocol/clientCapabilities": capabilities or {},
            },
        },
    }
    return await http.post(mcp_url, content=json.dumps(body), headers=headers)


def read_jsonrpc(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer, whether sent as JSON or as an SSE stream (after progress)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if "result" in message or "error" in message:
                    return dict(message)
        raise AssertionError(f"no JSON-RPC answer in the stream: {response.text[:500]}")
    return dict(response.json())
