"""An MCP Apps host for the browser test: a loopback site serving a host page
(tests/e2e/apps/host.html) built on
the ext-apps SDK's host bridge (AppBridge), and a pass-through of ``POST /mcp`` to the
real server.

The page speaks MCP itself (fetch, 2026-07-28, declaring the Apps extension, with the
signed-in user's bearer token), reads the tool's ``ui://`` resource, mounts it in a
sandboxed iframe (``allow-scripts`` only: an opaque origin) under the CSP built from
the resource's declared ``_meta.ui.csp``, as hosts do, and connects an ``AppBridge``
to it. ``/mcp`` is passed through so the page's requests are same-origin (the server
answers no CORS preflight, and a host's requests come from its own backend anyway).

The bridge bundle is made by tests/e2e/apps/install.sh (``npm ci`` of the pinned
@modelcontextprotocol/ext-apps, then esbuild).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2
import pytest

APPS_DIR = Path(__file__).resolve().parents[1] / "e2e" / "apps"
BRIDGE_BUNDLE = APPS_DIR / "node_modules" / ".bundle" / "host-bridge.js"
FORWARDED = (
    "authorization",
    "content-type",
    "accept",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
)

# The host page; __TOKEN__ is replaced by the signed-in user's token (a JSON string).
HOST_PAGE = APPS_DIR / "host.html"


class AppsHost:
    """The host page, the bundle, and ``/mcp`` passed through to ``mcp_url``; every
    other path answers 404 and is recorded (the CSP test's beacon must never arrive)."""

    def __init__(self, mcp_url: str, token: str) -> None:
        if not BRIDGE_BUNDLE.exists():
            pytest.fail(f"{BRIDGE_BUNDLE} is missing: run `bash tests/e2e/apps/install.sh`")
        self.requests: list[str] = []
        page = HOST_PAGE.read_text().replace("__TOKEN__", json.dumps(token)).encode()
        bundle = BRIDGE_BUNDLE.read_bytes()
        upstream = httpx2.Client(timeout=120)
        self._upstream = upstream
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.requests.append(self.path)
                if self.path == "/":
                    self._answer(200, "text/html; charset=utf-8", page)
                elif self.path == "/host-bridge.js":
                    self._answer(200, "text/javascript; charset=utf-8", bundle)
                else:
                    self._answer(404, "text/plain", b"not found")

            def do_POST(self) -> None:
                site.requests.append(self.path)
                if self.path != "/mcp":
                    self._answer(404, "text/plain", b"not found")
                    return
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k: v for k in FORWARDED if (v := self.headers.get(k)) is not None}
                answer = upstream.post(mcp_url, content=body, headers=headers)
                kind = answer.headers.get("content-type", "application/json")
                self._answer(answer.status_code, kind, answer.content)

            def _answer(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
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

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._upstream.close()
