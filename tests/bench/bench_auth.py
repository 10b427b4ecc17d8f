"""Benchmark: the bearer check's cost per request, and a whole sign-in.

Prints figures, asserts nothing.

1. In process: a trivial ASGI app called directly, against the same app behind
   BearerGate with a valid token (the production TokenService on SQLite), same run.
2. On a real server (loopback): discovery -> registration -> sign-in page -> button ->
   code exchange -> first tool call, median of several sign-ins.

    uv run python tests/bench/bench_auth.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from starlette.types import Receive, Scope, Send

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from e2e_server import start_server, stop_server
from mcp_http import call_tool
from oauth_browser import ManualClient

from app.storage.db import create_engine, upgrade_schema
from app.storage.signin.auth_store import SqlAuthStore
from auth.bearer import BearerGate
from auth.clients import ClientDirectory
from auth.config import AuthConfig
from auth.grants import TokenService
from auth.registration import Registrar
from auth.sealing import Sealer
from auth.signin import SigninFlow
from auth.tokens import TokenHasher

N = 20_000


async def trivial(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def discard(message: object) -> None:
    return None


async def nothing() -> dict[str, object]:
    return {"type": "http.request", "body": b""}


def scope_with(token: str | None) -> Scope:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return {"type": "http", "path": "/mcp", "method": "POST", "headers": headers}


async def time_calls(app: object, scope: Scope) -> list[float]:
    call = app  # an ASGI callable
    samples = []
    for _ in range(N):
        started = time.perf_counter_ns()
        await call(dict(scope), nothing, discard)  # type: ignore[operator]
        samples.append((time.perf_counter_ns() - started) / 1000)
    return samples


async def bearer_overhead() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite+aiosqlite:///{Path(tmp) / 'db.sqlite'}")
        await upgrade_schema(engine)
        config = AuthConfig(issuer="https://mcp.example.test")
        store = SqlAuthStore(engine)
        hasher = TokenHasher(b"k" * 32)
        codes = Sealer(b"k" * 32)
        client_id = str(
            (await Registrar(store).register({"redirect_uris": ["http://127.0.0.1/cb"]}))[
                "client_id"
            ]
        )
        client = await store.load_client(client_id)
        assert client is not None
        flow = SigninFlow(config, ClientDirectory(store, None), hasher, codes)
        tokens = TokenService(config, store, hasher, codes)
        from oauth_browser import authorization_request, pkce_pair, query_of
        from signin_testkit import approve

        verifier, challenge = pkce_pair()
        pending = await flow.start(
            authorization_request(client_id, "http://127.0.0.1/cb", challenge)
        )
        code = query_of((await approve(flow, store, pending)).location)["code"]
        pair = await tokens.exchange_code(
            client,
            {"code": code, "code_verifier": verifier, "redirect_uri": "http://127.0.0.1/cb"},
        )
        gate = BearerGate(trivial, tokens, config)
        token = str(pair["access_token"])
        await time_calls(gate, scope_with(token))  # warm the cache
        plain = await time_calls(trivial, scope_with(None))
        gated = await time_calls(gate, scope_with(token))
        made_up = await time_calls(gate, scope_with("smcp_at_" + "x" * 54))
        # Minted with the server's key but never stored: the one kind that costs a lookup.
        unknown = await time_calls(gate, scope_with(hasher.mint("at")))
        await engine.dispose()
    p, g = statistics.median(plain), statistics.median(gated)
    print(f"bearer check, {N} requests each, in process:")
    print(f"  unauthenticated call     median {p:.2f} us")
    print(f"  with a valid token       median {g:.2f} us   ratio {g / p:.1f}x")
    print(f"  the check itself adds    {g - p:.2f} us = {(g - p) / 1000:.4f} ms per request")
    print(f"  made-up token (tag)      median {statistics.median(made_up):.1f} us")
    print(f"  unknown minted (db trip) median {statistics.median(unknown):.1f} us")


async def whole_signin() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(
            Path(tmp) / "state",
            SANDBOX_MCP_AUTH="oauth",
            SANDBOX_MCP_POOL_SIZE="4",
            SANDBOX_MCP_SIGNINS_PER_MINUTE="1000",
            SANDBOX_MCP_REGISTRATIONS_PER_MINUTE="1000",
        )
        samples = []
        try:
            async with httpx2.AsyncClient(timeout=30) as http:
                for _ in range(15):
                    started = time.perf_counter()
                    unauthorized = await http.post(server.mcp_url, json={})
                    assert unauthorized.status_code == 401
                    await http.get(f"{server.base_url}/.well-known/oauth-protected-resource/mcp")
                    await http.get(f"{server.base_url}/.well-known/oauth-authorization-server")
                    client = await ManualClient.register(http, server.base_url)
                    pair = await client.tokens(http)
                    response = await call_tool(http, server.base_url, pair["access_token"])
                    assert response.status_code == 200
                    samples.append((time.perf_counter() - started) * 1000)
        finally:
            stop_server(server)
    print(
        f"whole sign-in (401 -> discovery -> register -> page -> button -> token -> tool call), "
        f"loopback: median {statistics.median(samples):.1f} ms, min {min(samples):.1f} ms"
    )


if __name__ == "__main__":
    asyncio.run(bearer_overhead())
    asyncio.run(whole_signin())
