"""The stateless transport adapter in front of the SDK's Streamable HTTP app."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.shared.inbound import decode_header_value
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send
from structlog.testing import capture_logs

from app.mcp.request_bounds import LARGE_BODY
from app.mcp.transport import StatelessTransport
from auth.grants import SIGNIN_CLAIM

MODERN = "2026-07-28"
EVENT = "mcp.protocol_version_header_mismatch"


@dataclass
class Recorder:
    """Stands in for the SDK app: keeps what reached it, answers 200."""

    seen: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append((headers, body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(method: str = "tools/call", version: str | None = MODERN, **params: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"io.modelcontextprotocol/clientCapabilities": {}}
    if version is not None:
        meta["io.modelcontextprotocol/protocolVersion"] = version
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": method,
        "params": {"name": "sandbox_status", "arguments": {}, **params, "_meta": meta},
    }


async def send(
    adapter: StatelessTransport,
    body: bytes | dict[str, Any] | None = None,
    *,
    method: str = "POST",
    path: str = "/mcp",
    headers: dict[str, str] | None = None,
) -> httpx2.Response:
    content = json.dumps(body).encode() if isinstance(body, dict) else body
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=adapter), base_url="http://t"
    ) as http:
        return await http.request(method, path, content=content, headers=headers or {})


async def test_a_2026_body_under_a_2025_header_is_labelled_by_its_body() -> None:
    app = Recorder()
    body = call()
    await send(StatelessTransport(app), body, headers={"mcp-protocol-version": "2025-11-25"})
    headers, received = app.seen[0]
    assert headers["mcp-protocol-version"] == MODERN
    assert headers["mcp-method"] == "tools/call"
    assert headers["mcp-name"] == "sandbox_status"
    assert json.loads(received) == body, "the body reaches the SDK unchanged"


async def test_a_2026_body_with_no_header_and_a_non_ascii_name_is_labelled() -> None:
    app = Recorder()
    uri = "file:///résumé.txt"
    body = call("resources/read", uri=uri)
    await send(StatelessTransport(app), body)
    headers, _ = app.seen[0]
    assert headers["mcp-protocol-version"] == MODERN
    assert headers["mcp-method"] == "resources/read"
    assert decode_header_value(headers["mcp-name"]) == uri


async def test_stale_routing_headers_are_replaced_not_duplicated() -> None:
    app = Recorder()
    await send(
        StatelessTransport(app),
        call(),
        headers={"mcp-protocol-version": "2025-06-18", "mcp-method": "tools/list"},
    )
    headers, _ = app.seen[0]
    assert (headers["mcp-protocol-version"], headers["mcp-method"]) == (MODERN, "tools/call")


async def test_requests_that_agree_with_themselves_are_left_alone() -> None:
    app = Recorder()
    adapter = StatelessTransport(app)
    legacy = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    await send(adapter, legacy, headers={"mcp-protocol-version": "2025-11-25"})
    await send(adapter, call(), headers={"mcp-protocol-version": MODERN})
    await send(adapter, call(version="2099-01-01"), headers={"mcp-protocol-version": MODERN})
    assert [h["mcp-protocol-version"] for h, _ in app.seen] == ["2025-11-25", MODERN, MODERN]
    assert all("mcp-method" not in h for h, _ in app.seen), "nothing was added"


async def test_a_legacy_body_version_under_a_modern_header_is_served_as_legacy() -> None:
    app = Recorder()
    await send(
        StatelessTransport(app),
        call(version="2025-11-25"),
        headers={"mcp-protocol-version": MODERN},
    )
    headers, _ = app.seen[0]
    assert headers["mcp-protocol-version"] == "2025-11-25"
    assert "mcp-method" not in headers


async def test_malformed_and_oversized_bodies_reach_the_sdk_whole_and_unlabelled() -> None:
    app = Recorder()
    adapter = StatelessTransport(app, max_body_size=1000)
    broken = b'{"io.modelcontextprotocol/protocolVersion": "2026-07-28", '
    await send(adapter, broken, headers={"mcp-protocol-version": "2025-11-25"})
    huge = json.dumps(call(arguments={"pad": "x" * 5000})).encode()
    await send(adapter, huge, headers={"mcp-protocol-version": "2025-11-25"})
    assert [(h["mcp-protocol-version"], b) for h, b in app.seen] == [
        ("2025-11-25", broken),
        ("2025-11-25", huge),
    ]


async def test_a_large_body_is_parsed_off_the_event_loop_and_still_labelled() -> None:
    app = Recorder()
    body = call(arguments={"pad": "x" * 200_000})
    await send(StatelessTransport(app), body, headers={"mcp-protocol-version": "2025-11-25"})
    assert app.seen[0][0]["mcp-protocol-version"] == MODERN


async def test_get_and_delete_answer_405_without_reaching_the_sdk() -> None:
    app = Recorder()
    adapter = StatelessTransport(app)
    for method in ("GET", "DELETE"):
        response = await send(adapter, method=method, headers={"mcp-session-id": "abc"})
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"
        assert "stateless" in response.json()["error"]["message"]
    assert app.seen == []
    other = await send(adapter, method="GET", path="/elsewhere")
    assert other.status_code == 200, "only /mcp is the transport's"


async def test_the_mismatch_is_logged_once_per_client_and_kind() -> None:
    app = Recorder()
    adapter = StatelessTransport(app, remembered_clients=2)
    claude = call()
    claude["params"]["_meta"]["io.modelcontextprotocol/clientInfo"] = {"name": "claude-ai"}
    other = call()
    other["params"]["_meta"]["io.modelcontextprotocol/clientInfo"] = {"name": "other"}
    legacy = {"mcp-protocol-version": "2025-11-25"}
    with capture_logs() as logs:
        for _ in range(3):
            await send(adapter, claude, headers=legacy)
        await send(adapter, claude)  # no header: another kind of mismatch
        await send(adapter, other, headers=legacy)  # a third entry pushes out the oldest
        await send(adapter, claude, headers=legacy)
    events = [(e["client"], e["header"]) for e in logs if e["event"] == EVENT]
    assert events == [
        ("claude-ai", "2025-11-25"),
        ("claude-ai", None),
        ("other", "2025-11-25"),
        ("claude-ai", "2025-11-25"),
    ]
    assert len(app.seen) == 6, "every request was served"


async def test_a_body_that_agrees_with_its_header_is_not_parsed_here(monkeypatch: Any) -> None:
    """The SDK parses the body; a second parse here cost every light call (issue 13)."""
    import app.mcp.transport as transport

    def no_parse(_: object) -> object:
        raise AssertionError("parsed twice")

    monkeypatch.setattr(transport.json, "loads", no_parse)
    app = Recorder()
    spaced = json.dumps(call(), indent=2).encode()  # "key" :  "value", with any spacing
    await send(StatelessTransport(app), spaced, headers={"mcp-protocol-version": MODERN})
    assert app.seen[0] == ({**app.seen[0][0], "mcp-protocol-version": MODERN}, spaced)


async def test_a_lookalike_of_the_version_key_still_gets_the_full_parse() -> None:
    """Only a body whose every mention of the key is a plain member equal to the header
    skips the parse: the key inside a string, or a second member saying otherwise, does not."""
    app = Recorder()
    adapter = StatelessTransport(app)
    legacy_meta = call(version="2025-11-25")
    # An argument mentions the modern version under the same key; the _meta says legacy.
    legacy_meta["params"]["arguments"] = {"io.modelcontextprotocol/protocolVersion": MODERN}
    await send(adapter, legacy_meta, headers={"mcp-protocol-version": MODERN})
    # The key, quoted, inside a string value: not a member, so the header is not trusted.
    in_string = call(version="2025-11-25")
    in_string["params"]["arguments"] = {
        "text": '"io.modelcontextprotocol/protocolVersion": "2026-07-28"'
    }
    await send(adapter, in_string, headers={"mcp-protocol-version": MODERN})
    assert [h["mcp-protocol-version"] for h, _ in app.seen] == ["2025-11-25", "2025-11-25"]


async def test_a_post_to_mcp_goes_straight_to_the_sdk_endpoint() -> None:
    """The SDK's Starlette app (router, error and exception middlewares) is skipped for
    ``POST /mcp``: ours already ran around it. Other paths still get the whole app."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    endpoint = Recorder()
    routed: list[bool] = []
    scopes: list[Scope] = []

    async def direct_check(scope: Scope, receive: Receive, send: Send) -> None:
        scopes.append(scope)
        await Recorder.__call__(endpoint, scope, receive, send)

    class Endpoint:  # a plain ASGI endpoint, as the SDK's StreamableHTTPASGIApp is
        __call__ = staticmethod(direct_check)

    class Routed:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            routed.append(True)
            await self.app(scope, receive, send)

    plain = Starlette(routes=[Route("/mcp", endpoint=Endpoint())])
    await send(StatelessTransport(plain), call(), headers={"mcp-protocol-version": MODERN})
    assert len(endpoint.seen) == 1
    assert "router" not in scopes[0], "the SDK's router did not run"
    # An SDK app with middleware of its own is served as built, middleware included.
    wrapped = Starlette(
        routes=[Route("/mcp", endpoint=Endpoint())], middleware=[Middleware(Routed)]
    )
    await send(StatelessTransport(wrapped), call())
    assert routed == [True]
    assert "router" in scopes[1]
    redirected = await send(StatelessTransport(plain), call(), path="/mcp/")
    assert redirected.status_code == 307, "not /mcp exactly: the whole app (its redirect)"


def signed_in(address: str, sandbox: str) -> Scope:
    """A POST /mcp as the bearer gate hands it on: its token's sign-in address claimed."""
    token = AccessToken(
        token="t",
        client_id="c",
        scopes=[],
        subject=sandbox,
        claims={SIGNIN_CLAIM: address},
    )
    return {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [],
        "user": AuthenticatedUser(token),
    }


async def post_in_pieces(adapter: StatelessTransport, scope: Scope, pieces: list[bytes]) -> int:
    """``pieces`` handed over as uvicorn does, one ``http.request`` message each."""
    messages: list[Message] = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)  # never asked past the last one

    async def send(message: Message) -> None:
        sent.append(message)

    await adapter(scope, receive, send)
    return int(sent[0]["status"])


async def test_a_large_body_counts_for_its_sign_in_address_whole_or_in_pieces() -> None:
    """A body is counted for the address in its token once it passes 64 KiB, whether
    uvicorn hands it over in one message or several, until it is answered; a body of
    exactly 64 KiB is not. Seen from inside the SDK, with a share of one: another
    sandbox's large body from the same address is refused meanwhile, another address's
    is served."""
    large = json.dumps(call(arguments={"pad": "x" * (2 * LARGE_BODY)})).encode()
    exact = json.dumps(call(arguments={"pad": ""})).encode()
    exact = exact.replace(b'"pad": ""', b'"pad": "' + b"x" * (LARGE_BODY - len(exact)) + b'"')
    assert len(exact) == LARGE_BODY
    meanwhile: list[tuple[int, int]] = []

    async def sdk(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body", False):
            pass
        if scope.get("outer"):
            same = await post_in_pieces(adapter, signed_in("a", "s2"), [large])
            other = await post_in_pieces(adapter, signed_in("b", "s3"), [large])
            meanwhile.append((same, other))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    adapter = StatelessTransport(sdk)
    adapter.large_bodies.per_address = 1
    step = 16 * 1024
    for pieces in (
        [large],
        [large[i : i + step] for i in range(0, len(large), step)],
        [large[:LARGE_BODY], large[LARGE_BODY:]],  # 64 KiB exactly, then past it
    ):
        assert await post_in_pieces(adapter, {**signed_in("a", "s1"), "outer": True}, pieces) == 200
        assert meanwhile.pop() == (429, 200)
    # Answered, each gave its place back; a body of exactly 64 KiB never took one.
    assert await post_in_pieces(adapter, {**signed_in("a", "s1"), "outer": True}, [exact]) == 200
    assert meanwhile.pop() == (200, 200)


async def test_a_client_gone_mid_body_is_logged_not_raised() -> None:
    """The SDK reads the body with Starlette, which raises ClientDisconnect when the
    client goes away; that is no server error (uvicorn would log a traceback for it)."""

    async def sdk(scope: Scope, receive: Receive, send: Send) -> None:
        await Request(scope, receive).body()
        raise AssertionError("a body was read from a client that went away")

    incoming: list[Message] = [
        {"type": "http.request", "body": b'{"jsonrpc": "2.0", ', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return incoming.pop(0)

    async def no_send(message: Message) -> None:
        raise AssertionError(f"an answer was sent to a client that went away: {message}")

    scope: Scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": []}
    with capture_logs() as logs:
        await StatelessTransport(sdk)(scope, receive, no_send)
    gone = [e for e in logs if e["event"] == "mcp.client_disconnected"]
    assert gone == [{"event": "mcp.client_disconnected", "log_level": "info", "read_bytes": 19}]


@dataclass
class RawRecorder(Recorder):
    """A Recorder that also keeps the header lines as the SDK would see them, repeats kept."""

    raw: list[list[tuple[bytes, bytes]]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.raw.append(list(scope["headers"]))
        await super().__call__(scope, receive, send)


def versions_seen(app: RawRecorder) -> list[list[bytes]]:
    return [[v for k, v in headers if k == b"mcp-protocol-version"] for headers in app.raw]


async def test_a_version_header_sent_twice_reaches_the_sdk_once() -> None:
    """Claude Code sends ``MCP-Protocol-Version: 2025-11-25, 2025-11-25``; the SDK
    compared the whole string with the versions it knows and routed it to 2026-07-28.
    Joined by commas or repeated as lines, agreeing values become the one value."""
    app = RawRecorder()
    adapter = StatelessTransport(app)
    legacy = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    await send(adapter, legacy, headers={"mcp-protocol-version": "2025-11-25, 2025-11-25"})
    await send(adapter, legacy, headers={"mcp-protocol-version": "2025-11-25,2025-11-25,"})
    await send(
        adapter,
        legacy,
        headers=[("mcp-protocol-version", "2025-11-25"), ("mcp-protocol-version", "2025-11-25")],
    )
    # A 2026-07-28 body under a doubled header: collapsed, then labelled by its body.
    await send(adapter, call(), headers={"mcp-protocol-version": f"{MODERN}, {MODERN}"})
    await send(adapter, call(), headers={"mcp-protocol-version": "2025-11-25, 2025-11-25"})
    assert versions_seen(app) == [
        [b"2025-11-25"],
        [b"2025-11-25"],
        [b"2025-11-25"],
        [MODERN.encode()],
        [MODERN.encode()],
    ]
    assert app.seen[4][0]["mcp-method"] == "tools/call"


async def test_a_version_header_with_disagreeing_values_is_refused_with_a_sentence() -> None:
    app = RawRecorder()
    adapter = StatelessTransport(app)
    legacy = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    with capture_logs() as logs:
        joined = await send(
            adapter, legacy, headers={"mcp-protocol-version": f"2025-11-25, {MODERN}"}
        )
        lines = await send(
            adapter,
            call(),
            headers=[("mcp-protocol-version", MODERN), ("mcp-protocol-version", "2025-06-18")],
        )
    for response, shown in ((joined, f"2025-11-25, {MODERN}"), (lines, f"{MODERN}, 2025-06-18")):
        assert response.status_code == 400
        assert response.json()["error"] == {
            "code": -32600,
            "message": (
                f"The MCP-Protocol-Version header carries 2 different versions ({shown}); "
                "send one version, the one this request is written for."
            ),
        }
    assert app.seen == [], "neither reached the SDK"
    refused = [e for e in logs if e["event"] == "mcp.request_refused"]
    assert [e["limit"] for e in refused] == ["protocol_version_header"] * 2


async def test_a_long_disagreeing_version_header_is_quoted_short_and_its_body_read_first() -> None:
    """A refused request's body is read to its end before the answer (a client still
    sending cannot read one), and the caller's values are quoted a few dozen characters."""
    app = RawRecorder()
    body = json.dumps(call(arguments={"pad": "x" * (3 * LARGE_BODY)})).encode()
    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(b"mcp-protocol-version", b"2025-11-25, " + b"9" * 500)],
    }
    step = 16 * 1024
    incoming: list[Message] = [
        {"type": "http.request", "body": body[i : i + step], "more_body": i + step < len(body)}
        for i in range(0, len(body), step)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0)

    async def record(message: Message) -> None:
        sent.append(message)

    await StatelessTransport(app)(scope, receive, record)
    assert incoming == [], "the whole body was read"
    assert sent[0]["status"] == 400
    message = json.loads(sent[1]["body"])["error"]["message"]
    assert len(message) < 250, message
    assert app.seen == []
