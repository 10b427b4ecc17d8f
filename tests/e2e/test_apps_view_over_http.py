"""The MCP Apps view against the real server, over HTTP: claude.ai's rules for an App,
offered only to the clients that declare the extension, and only the caller's sandbox.

claude.ai's rules (public threads, late 2026): ``resources/read`` carries
``_meta.ui.domain`` (SHA-256 of the endpoint URL, 32 hex digits, then
``.claudemcpcontent.com``); tools carry the flat key ``_meta["ui/resourceUri"]``; a CSP
is declared on the resource and every script and style is inline; no payload the view
receives passes about 150k characters; no ``outputSchema`` has a top-level ``anyOf``.
"""

from __future__ import annotations

import hashlib
import json
import re
from html.parser import HTMLParser
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import legacy_rpc, post_rpc, read_jsonrpc, tool
from oauth_browser import new_user, new_users

pytestmark = pytest.mark.e2e

VIEW_URI = "ui://sandbox-mcp/view.html"
APP_MIME = "text/html;profile=mcp-app"
UI = "io.modelcontextprotocol/ui"
DECLARES = {"extensions": {UI: {"mimeTypes": [APP_MIME]}}}
APP_ONLY = {"view_sandbox", "view_experiment", "view_file_diff"}
NAMING_THE_VIEW = {"get_experiment", "inspect_changes", "compare_experiments", "sandbox_status"}
MAX_PAYLOAD_BYTES = 130_000  # claude.ai swaps a payload past about 150k characters

FAILING_TESTS = (
    "import unittest\n\n"
    "class Checks(unittest.TestCase):\n"
    "    def test_fine(self):\n        self.assertTrue(True)\n\n"
    "    def test_broken_widget(self):\n        self.assertEqual(1, 2)\n"
)


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="4",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
    )


async def rpc(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    method: str,
    params: dict[str, Any],
    *,
    declares: bool = True,
) -> tuple[int, dict[str, Any]]:
    """One 2026-07-28 request, declaring the extension or not: (bytes on the wire, body)."""
    name = params.get("name") or params.get("uri")
    response = await post_rpc(
        http,
        server.mcp_url,
        method,
        params,
        token=token,
        name=name,
        capabilities=DECLARES if declares else {},
    )
    body = read_jsonrpc(response)
    # A JSON-RPC error goes out as 400 in the 2026-07-28 era.
    assert response.status_code == (400 if "error" in body else 200), response.text[:500]
    return len(response.content), body


async def call(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    declares: bool = True,
) -> tuple[int, dict[str, Any]]:
    size, body = await rpc(
        http,
        server,
        token,
        "tools/call",
        {"name": name, "arguments": arguments or {}},
        declares=declares,
    )
    assert "result" in body, body
    return size, body["result"]


async def tools_of(
    http: httpx2.AsyncClient, server: RunningServer, token: str, *, declares: bool
) -> list[dict[str, Any]]:
    _, body = await rpc(http, server, token, "tools/list", {}, declares=declares)
    return list(body["result"]["tools"])


def view_chars(result: dict[str, Any]) -> int:
    """The result's length as the view's ``JSON.stringify`` counts it (UTF-16 units)."""
    text = json.dumps(result, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-16-le")) // 2


def expected_domain(server: RunningServer) -> str:
    endpoint = f"{server.base_url}/mcp"
    return hashlib.sha256(endpoint.encode()).hexdigest()[:32] + ".claudemcpcontent.com"


# -- what a declaring client sees --------------------------------------------------------


async def test_a_declaring_client_sees_the_view_on_its_tools_and_resources(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    tools = {t["name"]: t for t in await tools_of(http, server, token, declares=True)}
    for name in NAMING_THE_VIEW:
        meta = tools[name]["_meta"]
        assert meta["ui"]["resourceUri"] == VIEW_URI, name
        assert meta["ui/resourceUri"] == VIEW_URI, name  # the legacy flat key
        assert "visibility" not in meta["ui"]  # the model sees these
    for name in APP_ONLY:
        assert tools[name]["_meta"]["ui"] == {"resourceUri": VIEW_URI, "visibility": ["app"]}
    # No output schema anywhere with a top-level anyOf (claude.ai refuses the listing).
    assert [t["name"] for t in tools.values() if "anyOf" in (t.get("outputSchema") or {})] == []

    _, listed = await rpc(http, server, token, "resources/list", {})
    (view,) = [r for r in listed["result"]["resources"] if r["uri"].startswith("ui://")]
    assert view["uri"] == VIEW_URI
    assert view["mimeType"] == APP_MIME

    _, body = await rpc(http, server, token, "server/discover", {})
    assert UI in body["result"]["capabilities"]["extensions"]


async def test_the_resource_carries_claudes_domain_a_csp_and_only_inline_code(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    size, body = await rpc(http, server, token, "resources/read", {"uri": VIEW_URI})
    (content,) = body["result"]["contents"]
    assert content["mimeType"] == APP_MIME
    ui = content["_meta"]["ui"]
    assert ui["domain"] == expected_domain(server)
    assert re.fullmatch(r"[0-9a-f]{32}\.claudemcpcontent\.com", ui["domain"])
    # A CSP declared, naming no domain at all: nothing to connect to, load or frame.
    csp = ui["csp"]
    assert set(csp) >= {"connectDomains", "resourceDomains", "frameDomains"}
    assert all(domains == [] for domains in csp.values()), csp
    assert size < MAX_PAYLOAD_BYTES, size

    html = content["text"]
    scan = _Scan()
    scan.feed(html)
    assert scan.scripts >= 1
    assert scan.styles >= 1
    assert scan.external == [], scan.external  # no src=, no <link>, no href to a site
    code = "\n".join(scan.code)
    for forbidden in (
        "@import",
        "url(",
        "fetch(",
        "XMLHttpRequest",
        "WebSocket",
        "EventSource",
        "import(",
        "importScripts",
        "sendBeacon",
        "http://",
        "https://",
    ):
        assert forbidden not in code, forbidden
    # The page's own policy says the same as the declared one.
    assert "default-src 'none'" in scan.meta_csp
    assert "connect-src 'none'" in scan.meta_csp
    assert "frame-src 'none'" in scan.meta_csp


# -- what everyone else sees ------------------------------------------------------------


async def test_a_client_without_the_extension_sees_no_view_in_either_era(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    plain = await tools_of(http, server, token, declares=False)
    assert not {t["name"] for t in plain} & APP_ONLY
    for t in plain:
        meta = t.get("_meta") or {}
        assert "ui" not in meta, t["name"]
        assert "ui/resourceUri" not in meta, t["name"]

    _, listed = await rpc(http, server, token, "resources/list", {}, declares=False)
    assert not [r for r in listed["result"]["resources"] if r["uri"].startswith("ui://")]
    # Reading the resource or calling an app-only tool answers like a name that never
    # existed.
    _, read = await rpc(http, server, token, "resources/read", {"uri": VIEW_URI}, declares=False)
    _, unknown = await rpc(
        http, server, token, "resources/read", {"uri": "ui://sandbox-mcp/none.html"}
    )
    assert read["error"]["code"] == unknown["error"]["code"]
    assert read["error"]["message"] == f"Unknown resource: {VIEW_URI}"
    _, hidden = await call(http, server, token, "view_sandbox", declares=False)
    _, never = await call(http, server, token, "no_such_tool", declares=False)
    assert hidden["isError"]
    assert never["isError"]
    assert hidden["content"][0]["text"] == never["content"][0]["text"].replace(
        "no_such_tool", "view_sandbox"
    )
    _, body = await rpc(http, server, token, "server/discover", {}, declares=False)
    assert UI not in body["result"]["capabilities"].get("extensions", {})

    # The legacy era: no capabilities after initialize, and no session to remember
    # them: never the view, even for a client that declared it in its handshake.
    for declared in (DECLARES, {}):
        init = await legacy_rpc(http, server, token, "initialize", _initialize(declared))
        assert UI not in read_jsonrpc(init)["result"]["capabilities"].get("extensions", {})
    legacy = read_jsonrpc(await legacy_rpc(http, server, token, "tools/list", {}))
    assert legacy["result"]["tools"] == plain


async def test_with_the_setting_off_no_client_sees_it_and_the_listing_is_unchanged(
    http: httpx2.AsyncClient, server: RunningServer, serve: Servers
) -> None:
    token = await new_user(http, server.base_url)
    plain = await tools_of(http, server, token, declares=False)
    off = serve(SANDBOX_MCP_AUTH="oauth", SANDBOX_MCP_APPS_VIEW="false")
    other = await new_user(http, off.base_url)
    declared = await tools_of(http, off, other, declares=True)
    undeclared = await tools_of(http, off, other, declares=False)
    _, listed = await rpc(http, off, other, "resources/list", {})
    _, read = await rpc(http, off, other, "resources/read", {"uri": VIEW_URI})
    _, body = await rpc(http, off, other, "server/discover", {})
    # Off: a declaring client gets exactly what a client without the extension gets,
    # and that is what it gets from a server with the view on.
    assert declared == undeclared == plain
    assert not [r for r in listed["result"]["resources"] if r["uri"].startswith("ui://")]
    assert read["error"]["message"] == f"Unknown resource: {VIEW_URI}"
    assert UI not in body["result"]["capabilities"].get("extensions", {})


# -- sizes and ownership -----------------------------------------------------------------


async def test_every_payload_the_view_receives_stays_under_130_kb(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    big_name = "x" * 100
    files = {"test_checks.py": FAILING_TESTS}
    exp = (await tool(http, server, token, "create_experiment", {"files": files}))["experiment_id"]
    other = (await tool(http, server, token, "create_experiment", {"name": big_name}))[
        "experiment_id"
    ]
    noisy = (
        "python3 -c 'import sys\n"
        'for n in range(200_000): sys.stdout.write(f"\\u00e9\\U0001f600\\"<{n:07d}>\\\\\\n")\n'
        "sys.exit(4)'"
    )
    for _ in range(12):
        await tool(
            http, server, token, "execute_experiment", {"experiment_id": exp, "command": noisy}
        )
    await tool(
        http,
        server,
        token,
        "execute_experiment",
        {
            "experiment_id": exp,
            "command": 'python3 -c \'open("big.txt", "w").write("".join('
            'f"line {n} " + chr(233) * 40 + chr(10) for n in range(4000)))\'',
        },
    )
    await tool(
        http,
        server,
        token,
        "run_tests",
        {"experiment_id": exp, "command": "python3 -m unittest -v"},
    )

    calls: list[tuple[str, dict[str, Any]]] = [
        ("view_sandbox", {}),
        ("view_experiment", {"experiment_id": exp}),
        ("view_file_diff", {"experiment_id": exp, "path": "big.txt"}),
        ("get_experiment", {"experiment_id": exp}),
        ("inspect_changes", {"experiment_id": exp, "include_diff": True}),
        ("compare_experiments", {"experiment_ids": [exp, other]}),
        ("sandbox_status", {}),
    ]
    wire, chars = {}, {}
    for name, arguments in calls:
        size, result = await call(http, server, token, name, arguments)
        assert not result.get("isError"), (name, result)
        wire[name], chars[name] = size, view_chars(result)
    print("payload bytes on the wire:", json.dumps(wire), "characters:", json.dumps(chars))
    # What the view receives (the result, as the host hands it over) in characters, as
    # claude.ai counts them; the app-only tools are under the bound in bytes on the
    # wire too, where the SDK escapes each non-ASCII character in six or twelve.
    assert max(chars.values()) < MAX_PAYLOAD_BYTES, chars
    assert max(wire[name] for name in APP_ONLY) < MAX_PAYLOAD_BYTES, wire
    # The diff was real and large: the view got its head and a count of the rest.
    _, diff = await call(
        http, server, token, "view_file_diff", {"experiment_id": exp, "path": "big.txt"}
    )
    assert diff["structuredContent"]["found"]
    assert diff["structuredContent"]["diff"].startswith("--- /dev/null\n+++ b/big.txt\n")
    assert diff["structuredContent"]["chars_left_out"] > 0


async def test_the_app_only_tools_show_only_the_callers_own_sandbox(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    alice, mallory = await new_users(http, server.base_url, 2)
    exp = (await tool(http, server, alice, "create_experiment", {"files": {"a.txt": "one\n"}}))[
        "experiment_id"
    ]
    await tool(
        http,
        server,
        alice,
        "execute_experiment",
        {"experiment_id": exp, "command": "echo alice-secret-output; echo two > a.txt"},
    )
    _, mine = await call(http, server, alice, "view_sandbox")
    assert [e["experiment_id"] for e in mine["structuredContent"]["experiments"]] == [exp]
    _, detail = await call(http, server, alice, "view_experiment", {"experiment_id": exp})
    assert "alice-secret-output" in json.dumps(detail)

    _, theirs = await call(http, server, mallory, "view_sandbox")
    assert theirs["structuredContent"]["experiments"] == []
    assert theirs["structuredContent"]["experiments_total"] == 0
    assert "alice" not in json.dumps(theirs)
    for name, arguments in [
        ("view_experiment", {"experiment_id": exp}),
        ("view_file_diff", {"experiment_id": exp, "path": "a.txt"}),
    ]:
        _, stolen = await call(http, server, mallory, name, arguments)
        _, made_up = await call(
            http, server, mallory, name, {**arguments, "experiment_id": "exp_" + "0" * 12}
        )
        assert stolen["isError"], (name, stolen)
        assert made_up["isError"], (name, made_up)
        assert "alice-secret-output" not in json.dumps(stolen)
        assert "two" not in json.dumps(stolen["structuredContent"])
        # Another sandbox's experiment reads exactly like one that never existed.
        assert (
            stolen["structuredContent"]["error"]["code"]
            == made_up["structuredContent"]["error"]["code"]
        )
        assert stolen["content"][0]["text"].replace(exp, "ID") == made_up["content"][0][
            "text"
        ].replace("exp_" + "0" * 12, "ID")


async def test_while_queued_the_overview_gives_the_place_and_the_estimated_wait(
    http: httpx2.AsyncClient, serve: Servers
) -> None:
    full = serve(SANDBOX_MCP_AUTH="oauth", SANDBOX_MCP_POOL_SIZE="1", SANDBOX_MCP_QUEUE_WAIT_S="0")
    holder, waiter = await new_users(http, full.base_url, 2)
    await tool(http, full, holder, "create_experiment", {})
    refused = await tool(http, full, waiter, "create_experiment", {})
    assert refused["is_error"], refused
    assert refused["error"]["code"] == "SANDBOX_QUEUED", refused
    _, seen = await call(http, full, waiter, "view_sandbox")
    _, held = await call(http, full, holder, "view_sandbox")
    overview = seen["structuredContent"]
    assert overview["holds_slot"] is False
    assert overview["queue_position"] == 1
    assert overview["estimated_wait_s"] >= 1
    assert overview["estimated_wait_s"] == refused["error"]["estimated_wait_s"]
    assert held["structuredContent"]["holds_slot"] is True
    assert held["structuredContent"]["queue_position"] is None


# -- helpers ---------------------------------------------------------------------------


def _initialize(capabilities: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocolVersion": "2025-11-25",
        "capabilities": capabilities,
        "clientInfo": {"name": "view-test", "version": "1"},
    }


class _Scan(HTMLParser):
    """What the page loads from elsewhere (nothing, it must be), and its inline code."""

    def __init__(self) -> None:
        super().__init__()
        self.external: list[str] = []
        self.code: list[str] = []
        self.scripts = self.styles = 0
        self.meta_csp = ""
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag in ("link", "iframe", "object", "embed", "base", "frame"):
            self.external.append(tag)
        for attr in ("src", "href", "srcset", "action", "data", "poster", "background"):
            if named.get(attr):
                self.external.append(f"{tag} {attr}={named[attr]}")
        if tag == "meta" and (named.get("http-equiv") or "").lower() == "content-security-policy":
            self.meta_csp = named.get("content") or ""
        if tag in ("script", "style"):
            self._in = tag
            self.scripts += tag == "script"
            self.styles += tag == "style"

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self.code.append(data)
