"""A loopback HTTP/1.1 relay that writes down every request a client sends.

Bytes go through untouched both ways (SSE streams included); only the client's
requests are parsed (request line, headers, Content-Length body) and recorded.
Start the server with ``SANDBOX_MCP_PUBLIC_URL`` set to the relay's URL, so the
Host the client sends and the URLs the server advertises are the relay's.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any = None  # the JSON body, parsed, when there is one

    @property
    def rpc_method(self) -> str | None:
        return self.body.get("method") if isinstance(self.body, dict) else None


@dataclass
class RecordingProxy:
    listen_port: int
    target_port: int
    requests: list[Recorded] = field(default_factory=list)
    unparsed: list[str] = field(default_factory=list)  # anything it could not read

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def start(self) -> RecordingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("the recording proxy did not start")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.listen_port)
        )
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        back = asyncio.ensure_future(_relay(server_r, client_w))
        try:
            while head := await _read_head(client_r):
                body = await self._record(head, client_r)
                server_w.write(head + body)
                await server_w.drain()
        except ConnectionError:
            pass  # a client that exits resets its connections: not a parse failure
        except (asyncio.IncompleteReadError, ValueError) as error:
            self.unparsed.append(repr(error))
        finally:
            server_w.close()
            await back

    async def _record(self, head: bytes, reader: asyncio.StreamReader) -> bytes:
        line, *lines = head.decode("latin-1").split("\r\n")
        method, path, _ = line.split(" ", 2)
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (h.partition(":") for h in lines if h)
        }
        if "chunked" in headers.get("transfer-encoding", ""):
            raise ValueError(f"a chunked request body ({method} {path}) is not recorded")
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode(errors="replace")
        self.requests.append(Recorded(method, path.split("?")[0], headers, parsed))
        return body


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise
        return b""  # the client closed between requests


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
