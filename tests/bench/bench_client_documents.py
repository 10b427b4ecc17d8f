"""Benchmark: what a Client ID Metadata Document costs a sign-in.

Prints figures, asserts nothing. In process, on the production SigninFlow,
ClientDirectory, SqlAuthStore (SQLite) and PublicFetcher, with the document
served over real TLS on loopback (the address policy admits loopback here, as
in the unit tests). Medians of ``flow.start`` (what GET /authorize does before
rendering the page), same run:

- a registered client (one database read): the baseline;
- a document client, document cached (an upsert, no fetch);
- a document client with ``Cache-Control: no-store`` (resolve, TLS, GET, parse, upsert);
- a refused private target (169.254.169.254), which never connects.

    uv run python tests/bench/bench_client_documents.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from fetch_testkit import loopback_too
from oauth_browser import authorization_request, pkce_pair
from tls_testkit import Answer, DocumentServer, make_ca

from app.observability import configure_logging
from app.storage.db import create_engine, upgrade_schema
from app.storage.signin.auth_store import SqlAuthStore
from auth.client_documents import ClientDocuments
from auth.clients import ClientDirectory
from auth.config import AuthConfig
from auth.registration import Registrar
from auth.safe_fetch import PublicFetcher
from auth.sealing import Sealer
from auth.signin import LocalError, SigninFlow
from auth.tokens import TokenHasher

N = 300
REDIRECT = "http://127.0.0.1:9/cb"


async def median_ms(action: Callable[[], Awaitable[object]], n: int = N) -> float:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await action()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def main() -> None:
    configure_logging("ERROR")  # one line per fetch would bury the figures
    with tempfile.TemporaryDirectory() as tmp:
        ca = make_ca(Path(tmp) / "ca", dns_names=["client.test"], ip_addresses=["127.0.0.1"])
        engine = create_engine(f"sqlite+aiosqlite:///{Path(tmp) / 'db.sqlite'}")
        await upgrade_schema(engine)
        store = SqlAuthStore(engine)
        fetcher = PublicFetcher(
            resolver=lambda host, port: _loopback(),
            allow=loopback_too,
            ssl_context=ca.client_context(),
            ports=None,
        )
        documents = ClientDocuments(fetcher, fetches_per_minute=100_000)
        config = AuthConfig(issuer="https://mcp.example.test")
        flow = SigninFlow(
            config, ClientDirectory(store, documents), TokenHasher(b"k" * 32), Sealer(b"k" * 32)
        )
        _, challenge = pkce_pair()

        def start(client_id: str) -> Callable[[], Awaitable[object]]:
            params = authorization_request(client_id, REDIRECT, challenge)
            return lambda: flow.start(params)

        async def refused() -> None:
            with contextlib.suppress(LocalError):
                await flow.start({"client_id": "https://169.254.169.254/latest/x"})

        registered = await Registrar(store).register({"redirect_uris": [REDIRECT]})
        async with DocumentServer(ca.server_context()) as server:
            for path, cache in (("/cached.json", "max-age=3600"), ("/fresh.json", "no-store")):
                url = f"https://client.test:{server.port}{path}"
                server.answers[path] = Answer(
                    body=json.dumps(
                        {"client_id": url, "client_name": "Bench", "redirect_uris": [REDIRECT]}
                    ).encode(),
                    headers={"Cache-Control": cache},
                )
            base = f"https://client.test:{server.port}"
            await start(f"{base}/cached.json")()  # the first fetch fills the cache
            baseline = await median_ms(start(str(registered["client_id"])))
            cached = await median_ms(start(f"{base}/cached.json"))
            fresh = await median_ms(start(f"{base}/fresh.json"), n=100)
            private = await median_ms(refused)
            fetches = len(server.seen)
        await engine.dispose()
    print(f"flow.start (GET /authorize before the page), medians, SQLite, N={N}:")
    print(f"  registered client           {baseline:.2f} ms   (baseline)")
    print(f"  document client, cached     {cached:.2f} ms   ratio {cached / baseline:.1f}x")
    print(f"  document client, no-store   {fresh:.2f} ms   ratio {fresh / baseline:.1f}x")
    print(f"  169.254.169.254, refused    {private:.3f} ms (no connection; refusal cached)")
    print(f"  documents fetched in all    {fetches} (1 for the cached client, 100 no-store)")


async def _loopback() -> list[str]:
    return ["127.0.0.1"]


if __name__ == "__main__":
    asyncio.run(main())
