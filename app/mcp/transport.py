"""Stateless Streamable HTTP in front of the SDK, for the clients that exist.

The SDK app is built with ``stateless_http=True``: every legacy-era request gets a
fresh transport, so a missing, unknown or stale ``Mcp-Session-Id`` is served (our
state is keyed by the sandbox key, never by an MCP session) and no request can
open a session that outlives it. This adapter adds what the SDK does not do:

- ``GET`` and ``DELETE /mcp`` answer 405. A stateless server offers no standalone
  SSE stream and has no session to end (Streamable HTTP, "Listening for Messages
  from the Server" and "Session Management"); the SDK would hold a GET open for
  nothing.
- A body over 64 KiB is measured before the SDK parses it, on the event loop
  (``request_bounds.py``): one that would hold the loop is refused, and a sign-in
  address has a bounded number of large bodies in flight.
- The body's ``_meta`` protocol version wins over the ``MCP-Protocol-Version``
  header. claude.ai connectors send a 2026-07-28 body under a 2025-11-25 header
  (anthropics/claude-code#93290) or no header at all (anthropics/claude-ai-mcp#70);
  the SDK routes by the header alone, so the request is re-labelled from its body
  and the mismatch is logged once per client.
- A version header sent twice is read as sent once. Claude Code sends
  ``MCP-Protocol-Version: 2025-11-25, 2025-11-25`` (the header joined with itself, RFC
  9110 section 5.3); the SDK compares the whole string with the versions it knows, routes it
  to the 2026-07-28 entry and refuses it. Values that all agree become the one value;
  values that disagree are refused with 400 and a sentence (``_TWO_VERSIONS``), since
  no single era can serve them.

Light calls cost what the SDK costs, plus little (bench_light_calls.py): a ``POST
/mcp`` goes straight to the SDK's Streamable HTTP endpoint, not through the Starlette
app around it (its router and middlewares would run a second time, after ours); and
a body whose version agrees with its header, the common case, is not parsed here
(the SDK parses it once), only scanned.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

import anyio.to_thread
import structlog
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    NAME_BEARING_METHODS,
    encode_header_value,
)
from mcp_types import CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.mcp import request_bounds
from app.mcp.light_calls import LightCalls
from app.mcp.request_bounds import LargeBodies
from app.mcp.runner import LOCAL_SANDBOX_KEY
from app.tenancy.threads import TenantThreads
from auth.grants import SIGNIN_CLAIM

log = structlog.get_logger(__name__)

_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("latin-1")
_METHOD_HEADER = MCP_METHOD_HEADER.lower().encode("latin-1")
_NAME_HEADER = MCP_NAME_HEADER.lower().encode("latin-1")
_VERSION_KEY = PROTOCOL_VERSION_META_KEY.encode()
# The key as a JSON member with a plain string value (no escapes): what clients send.
_VERSION_MEMBER = re.compile(rb'"' + re.escape(_VERSION_KEY) + rb'"\s*:\s*"([^"\\]*)"')
# Parsing a body this large inline would hold the event loop for several milliseconds.
_PARSE_INLINE_MAX = request_bounds.LARGE_BODY
_NOT_ALLOWED = (
    "Method Not Allowed: this server is stateless; it offers no SSE stream on GET and has "
    "no session to DELETE. Send every request as a POST."
)
_TWO_VERSIONS = (
    "The MCP-Protocol-Version header carries {count} different versions ({shown}); send "
    "one version, the one this request is written for."
)
_TOO_MANY_LARGE = (
    "The sandboxes signed in from your address already have {limit} requests of more "
    "than 64 KiB in flight, the most one address may have at once; wait for one to be "
    "answered, then send this again."
)


class StatelessTransport:
    """Wraps the SDK's Streamable HTTP app (built with ``stateless_http=True``)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str = "/mcp",
        max_body_size: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
        remembered_clients: int = 4096,
        threads: TenantThreads | None = None,
        light_tools: Collection[str] = (),
    ) -> None:
        """``threads``: the tenants' thread shares, where a large body is measured;
        ``light_tools``: the tools whose calls are served in one exchange (``light_calls.py``)."""
        self._app = app
        self._threads = threads or TenantThreads()
        self.large_bodies = LargeBodies()
        self._endpoint = _endpoint_of(app, path)
        self._light = LightCalls(self._endpoint, light_tools)
        self._path = path
        self._max_body_size = max_body_size
        self._mismatch_seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._remembered_clients = remembered_clients

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != self._path:
            await self._app(scope, receive, send)
            return
        if scope["method"] in ("GET", "DELETE"):
            await _not_allowed(send)
            return
        if scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        small = min(_PARSE_INLINE_MAX, self._max_body_size)
        messages, state = await _read_body(receive, [], small)
        versions = _one_version(scope)  # (a client gone: the SDK sees it, as below)
        if versions is not None and state != "gone":
            log.info("mcp.request_refused", limit="protocol_version_header", count=len(versions))
            # Read to its end first, as below: a client still sending cannot read an answer.
            if not _more(messages[-1]) or await _discard_body(receive, self._max_body_size):
                shown = ", ".join(_short(v) for v in versions[:4])
                await _refuse(send, 400, _TWO_VERSIONS.format(count=len(versions), shown=shown))
            return
        if state != "over" or small == self._max_body_size:
            await self._forward(scope, messages, state, receive, send)
            return
        # A large body: counted for its address until answered, measured before the SDK.
        key, address = _caller(scope)
        if address is not None and not self.large_bodies.enter(address):
            limit = self.large_bodies.per_address
            log.info("mcp.request_refused", limit="large_bodies_per_address", value=limit)
            # Read to its end, keeping nothing: a client answered while it still sends
            # waits for ever for the answer it cannot read until it has sent.
            if not _more(messages[-1]) or await _discard_body(receive, self._max_body_size):
                await _refuse(send, 429, _TOO_MANY_LARGE.format(limit=limit))
            return
        try:
            messages, state = await _read_body(receive, messages, self._max_body_size)
            if state == "complete":
                body = _body_of(messages)
                why = await self._threads.run_as(key, address, request_bounds.refusal, body)
                if why is not None:
                    log.info("mcp.request_refused", limit="request_values", bytes=len(body))
                    await _refuse(send, 413, why)
                    return
            await self._forward(scope, messages, state, receive, send)
        finally:
            if address is not None:
                self.large_bodies.leave(address)

    async def _forward(
        self, scope: Scope, messages: list[Message], state: str, receive: Receive, send: Send
    ) -> None:
        """Hand the request to the SDK, its body read so far replayed first."""
        app = self._endpoint if scope["path"] == self._path else self._app
        if state == "complete":
            body = _body_of(messages)
            await self._label_by_body(scope, body)
            if app is self._endpoint and self._light.takes(scope, len(body)):
                app = self._light
        try:
            await app(scope, _replay(messages, receive), send)
        except ClientDisconnect:
            # The client went away while the SDK read its body: nobody to answer, and no
            # fault of ours (uvicorn would log a traceback at error level for each one).
            log.info(
                "mcp.client_disconnected", read_bytes=sum(len(m.get("body", b"")) for m in messages)
            )

    async def _label_by_body(self, scope: Scope, body: bytes) -> None:
        """Make the version header say what the body says (the body is the request)."""
        if _VERSION_KEY not in body:
            return  # a legacy-era body: the header routes it, as the SDK expects
        if len(body) <= _PARSE_INLINE_MAX and _agrees_with_header(scope, body):
            return  # (a larger body is parsed off the loop rather than scanned on it)
        try:
            decoded = (
                json.loads(body)
                if len(body) <= _PARSE_INLINE_MAX
                else await anyio.to_thread.run_sync(json.loads, body)
            )
        except (ValueError, RecursionError):
            return  # the SDK answers the parse error
        meta = _meta_of(decoded)
        version = meta.get(PROTOCOL_VERSION_META_KEY)
        if version not in (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS):
            return  # an unsupported version: the SDK says which ones it speaks
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        sent = next((v.decode("latin-1") for k, v in headers if k == _VERSION_HEADER), None)
        if sent == version:
            return
        relabel = {_VERSION_HEADER: version}
        if version in MODERN_PROTOCOL_VERSIONS:
            # 2026-07-28 also mirrors the method and the name in headers; a client that
            # labelled the request with another era does not send them, or not these.
            method = decoded.get("method")
            if isinstance(method, str):
                relabel[_METHOD_HEADER] = method
                name = decoded["params"].get(NAME_BEARING_METHODS.get(method, ""))
                if isinstance(name, str):
                    relabel[_NAME_HEADER] = encode_header_value(name)
        scope["headers"] = [(k, v) for k, v in headers if k not in relabel] + [
            (k, v.encode("latin-1", "replace")) for k, v in relabel.items()
        ]
        self._log_once(scope, meta, sent or "", version)

    def _log_once(self, scope: Scope, meta: dict[str, Any], sent: str, version: str) -> None:
        user = scope.get("user")
        if isinstance(user, AuthenticatedUser):
            client = user.access_token.client_id
        else:
            info = meta.get(CLIENT_INFO_META_KEY)
            name = info.get("name") if isinstance(info, dict) else None
            client = name if isinstance(name, str) else "unknown"
        key = (client[:200], sent[:40], version)
        if key in self._mismatch_seen:
            self._mismatch_seen.move_to_end(key)
            return
        self._mismatch_seen[key] = None
        if len(self._mismatch_seen) > self._remembered_clients:
            self._mismatch_seen.popitem(last=False)
        log.info(
            "mcp.protocol_version_header_mismatch",
            client=key[0],
            header=key[1] or None,
            body=version,
            served_as=version,
        )


def _endpoint_of(app: ASGIApp, path: str) -> ASGIApp:
    """The SDK's own endpoint for ``path`` inside the Starlette app it built, when calling
    it directly skips nothing but routing: no middleware, a plain ASGI endpoint. Else the
    whole app (an SDK that wraps the endpoint in more than a route is served as built)."""
    if not isinstance(app, Starlette) or app.user_middleware:
        return app
    for route in app.routes:
        if isinstance(route, Route) and route.path == path and route.endpoint is route.app:
            return route.app
    return app


def _agrees_with_header(scope: Scope, body: bytes) -> bool:
    """True when every occurrence of the version key in ``body`` is a plain member whose
    value is the version header's: then the body's ``_meta`` (wherever it is) says what
    the header says, and nothing needs parsing. Anything else (an escaped value, the key
    inside a string, another version) is left to the full parse."""
    sent = next((v for k, v in scope["headers"] if k == _VERSION_HEADER), None)
    if sent is None:
        return False
    values = _VERSION_MEMBER.findall(body)
    return (
        len(values) == body.count(_VERSION_KEY)
        and bool(values)
        and all(value == sent for value in values)
    )


def _one_version(scope: Scope) -> list[str] | None:
    """Collapse the version header to one entry holding one value when every value it
    carries (over repeated header lines, or joined by commas in one) is the same; leave
    it alone when there is none or one. Returns the distinct values when they disagree."""
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    sent = [v for k, v in headers if k == _VERSION_HEADER]
    if len(sent) == 1 and b"," not in sent[0]:
        return None  # the common case, touched by nothing
    if not sent:
        return None
    values = [part.strip() for value in sent for part in value.split(b",")]
    distinct = list(dict.fromkeys(value for value in values if value))
    if len(distinct) > 1:
        return [value.decode("latin-1") for value in distinct]
    if distinct:
        scope["headers"] = [(k, v) for k, v in headers if k != _VERSION_HEADER] + [
            (_VERSION_HEADER, distinct[0])
        ]
    return None


def _short(text: str, limit: int = 40) -> str:
    """A header value is the caller's: never repeat more than a few dozen characters."""
    return text if len(text) <= limit else text[:limit] + "..."


def _meta_of(decoded: object) -> dict[str, Any]:
    if not isinstance(decoded, dict):
        return {}  # a batch or a scalar: the SDK rejects it
    params = decoded.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else {}


async def _read_body(
    receive: Receive, messages: list[Message], limit: int
) -> tuple[list[Message], str]:
    """``messages`` and the request's next body messages, read until the end
    ("complete"), past ``limit`` bytes in all ("over"), or the client's going ("gone")."""
    size = sum(len(m.get("body", b"")) for m in messages)
    if messages and not _more(messages[-1]):
        # Already read to its end (a receive now would wait for the client to go).
        return messages, "over" if size > limit else "complete"
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, "gone"  # the client went away: let the SDK see it
        size += len(message.get("body", b""))
        if size > limit:
            return messages, "over"  # past the SDK's cap: it answers 413
        if not _more(message):
            return messages, "complete"


async def _discard_body(receive: Receive, limit: int) -> bool:
    """Read the rest of the body, up to ``limit`` bytes, and drop it; False when the
    client went away."""
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return False
        size += len(message.get("body", b""))
        if size > limit or not _more(message):
            return True


def _more(message: Message) -> bool:
    """Whether the body goes on after this (http.request) message."""
    return bool(message.get("more_body", False))


def _body_of(messages: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in messages)


def _caller(scope: Scope) -> tuple[str, str | None]:
    """The sandbox key and sign-in address of the request (the bearer gate has checked
    its token); local mode has neither: its one user, no address."""
    user = scope.get("user")
    if not isinstance(user, AuthenticatedUser):
        return LOCAL_SANDBOX_KEY, None
    address = (user.access_token.claims or {}).get(SIGNIN_CLAIM)
    return user.access_token.subject or "", address if isinstance(address, str) else None


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """Hand the SDK the messages already read, then the live stream (disconnects included)."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _not_allowed(send: Send) -> None:
    await _refuse(send, 405, _NOT_ALLOWED, [(b"allow", b"POST")])


async def _refuse(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer a JSON-RPC error of ``message`` (the request was never parsed: no id)."""
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                *(headers or []),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
