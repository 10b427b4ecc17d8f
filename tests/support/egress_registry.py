"""A small package registry over https (and http), for the egress tests: run as a script.

Serves ``<root>/<Host header>/<path>`` (``index.html`` for a folder), with the
certificate given, on 443, and the same over plain http on 80; paths of
``*.git`` repositories under ``<root>/<host>/`` go to ``git http-backend`` (smart
http, so shallow clones work); ``/slow/<n>`` on any host sends ``n`` bytes at
2.5 MiB/s (a download that lasts, for the byte cap). Started by
``tests/support/egress_testkit.py`` inside a network namespace of its own, so it
owns a public-looking address.

Usage: python egress_registry.py ROOT CERT KEY
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(sys.argv[1])
SLOW_CHUNK = 64 * 1024
SLOW_PAUSE_S = 0.025  # 2.5 MiB/s


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.headers.get('Host')} {format % args}\n")

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        host = (self.headers.get("Host") or "").split(":")[0]
        path, _, query = self.path.partition("?")
        site = ROOT / host
        if ".git/" in path:
            self._git(site, path, query)
            return
        if path.startswith("/slow/") and path[6:].isdecimal():
            self._slow(int(path[6:]))
            return
        target = (site / path.lstrip("/")).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(site.resolve()) or not target.is_file():
            self._send(404, b"not found\n", "text/plain")
            return
        kind = "text/html"
        if target.suffix in (".tgz", ".whl"):
            kind = "application/octet-stream"
        elif host.startswith("registry.npmjs"):
            kind = "application/json"
        self._send(200, target.read_bytes(), kind)

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _slow(self, size: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        chunk = os.urandom(SLOW_CHUNK)
        try:
            while size > 0:
                self.wfile.write(chunk[:size])
                size -= len(chunk)
                time.sleep(SLOW_PAUSE_S)
        except OSError:
            self.close_connection = True  # the proxy cut it: the point of the test

    def _git(self, site: Path, path: str, query: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(site),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
        }
        done = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        )
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode(errors="replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def main() -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[2], sys.argv[3])
    secure = ThreadingHTTPServer(("0.0.0.0", 443), Handler)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    plain = ThreadingHTTPServer(("0.0.0.0", 80), Handler)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    print("ready", flush=True)
    secure.serve_forever()


if __name__ == "__main__":
    main()
