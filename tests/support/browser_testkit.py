"""A real browser for the sign-in page: Debian's headless Chromium, driven by Playwright,
and the loopback site and OAuth client around it (shared by the browser tests).

The browser is /usr/bin/chromium (`apt-get install -y chromium`, which
.ci/lib/install-packages.sh does); Playwright's own browser download is never used.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import httpx2
import pytest
from e2e_server import RunningServer
from oauth_browser import pkce_pair, query_of
from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling Google's hosts, which
# this machine's closed network refuses. Playwright gives every launch a new empty
# user-data-dir of its own.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BUTTON = "Create my sandbox"
CLIENT_NAME = "Browser E2E Client"


@contextmanager
def chromium() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `apt-get install -y chromium` (or .ci/run)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield launched
        finally:
            launched.close()


# -- a loopback web site the test owns ----------------------------------------------


class LoopbackSite:
    """An HTTP server on its own loopback port: serves `pages`, records every request path."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {"/callback": "<!doctype html><title>back</title>signed in"}
        self.requests: list[str] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.requests.append(self.path)
                page = site.pages.get(self.path.partition("?")[0])
                body = (page or "not found").encode()
                self.send_response(200 if page is not None else 404)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def callbacks(self) -> list[dict[str, str]]:
        """The query of every request that reached /callback, in order."""
        return [query_of(path) for path in self.requests if path.startswith("/callback?")]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@dataclass
class Authorization:
    client_id: str
    redirect_uri: str
    state: str
    verifier: str
    url: str


def authorization(
    server: RunningServer, redirect_uri: str, client_name: str = CLIENT_NAME
) -> Authorization:
    """Registers a public client for `redirect_uri` and builds its authorization request."""
    registered = httpx2.post(
        f"{server.base_url}/register",
        json={"redirect_uris": [redirect_uri], "client_name": client_name},
        timeout=30,
    )
    assert registered.status_code == 201, registered.text
    client_id = registered.json()["client_id"]
    verifier, challenge = pkce_pair()
    # Printable ASCII that needs escaping: it must come back byte for byte.
    state = f"st-{secrets.token_urlsafe(9)} /+=?&"
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "resource": server.mcp_url,
    }
    url = f"{server.base_url}/authorize?{urlencode(params)}"
    return Authorization(client_id, redirect_uri, state, verifier, url)


def exchange(server: RunningServer, auth: Authorization, code: str) -> httpx2.Response:
    return httpx2.post(
        f"{server.base_url}/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": auth.verifier,
            "client_id": auth.client_id,
            "redirect_uri": auth.redirect_uri,
            "resource": server.mcp_url,
        },
        timeout=30,
    )


def lands_on(redirect_uri: str) -> Callable[[str], bool]:
    return lambda url: url.startswith(redirect_uri + "?")
