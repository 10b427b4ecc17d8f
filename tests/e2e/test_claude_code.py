"""Claude Code itself (npm @anthropic-ai/claude-code, pinned in tests/e2e/clients)
against the real server: `claude mcp add --transport http`, then `claude mcp list`
health-checks every server and must report ours "✔ Connected".

- local mode (SANDBOX_MCP_AUTH=none): no sign-in at all;
- hosted mode with a token passed as a header (`--header "Authorization: Bearer ..."`);
- hosted mode with Claude Code's own sign-in (`claude mcp login`): it discovers the
  server, registers, opens $BROWSER on the sign-in page, where a "person" presses the
  button, and redeems the code on its loopback callback;
- what it sends, recorded by a loopback relay: the 2026-07-28 era, no session id.

Claude Code needs no API key and no network for this (its HOME is a temp dir).
Needs `bash tests/e2e/clients/install.sh` first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from claude_code import ClaudeCode
from e2e_server import RunningServer, Servers, free_port
from oauth_browser import new_user
from recording_proxy import RecordingProxy

pytestmark = pytest.mark.e2e

HOSTED = {
    "SANDBOX_MCP_AUTH": "oauth",
    "SANDBOX_MCP_POOL_SIZE": "2",
    "SANDBOX_MCP_SIGNINS_PER_MINUTE": "100",
}


def listed(output: str, name: str, url: str) -> str:
    """The status `claude mcp list` printed for ``name``."""
    match = re.search(rf"^{re.escape(name)}: {re.escape(url)} \(HTTP\) - (.+)$", output, re.M)
    assert match, output
    return match.group(1).strip()


def server_errors(server: RunningServer) -> list[str]:
    """Log records at error level or above (a dropped stream must not leave any)."""
    return [
        line
        for line in server.log().splitlines()
        if line.strip() and json.loads(line).get("level") in ("error", "critical")
    ]


@pytest.fixture
def claude(tmp_path: Path) -> ClaudeCode:
    return ClaudeCode.in_dir(tmp_path / "claude")


@pytest.fixture
def hosted(serve: Servers) -> RunningServer:
    return serve(**HOSTED)


def add(claude: ClaudeCode, name: str, url: str, *header: str) -> None:
    # --header takes several values, so it goes after the name and the URL.
    extra = [arg for h in header for arg in ("--header", h)]
    added = claude.run("mcp", "add", "--transport", "http", name, url, *extra)
    assert added.returncode == 0, added.stderr + added.stdout
    assert f"Added HTTP MCP server {name} with URL: {url}" in added.stdout


def test_local_mode_is_connected(server: RunningServer, claude: ClaudeCode) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/mcp"  # control: the check is a real one
    add(claude, "sandbox", server.mcp_url)
    add(claude, "nowhere", nowhere)

    shown = claude.run("mcp", "list")
    assert shown.returncode == 0, shown.stderr + shown.stdout
    assert listed(shown.stdout, "sandbox", server.mcp_url) == "✔ Connected"
    assert listed(shown.stdout, "nowhere", nowhere).startswith("✘ Failed to connect")
    got = claude.run("mcp", "get", "sandbox")
    assert "Status: ✔ Connected" in got.stdout, got.stdout + got.stderr
    # The health check really reached /mcp (the control beside it fails; answered /mcp
    # requests have no access line since their calls' lines are bounded per sandbox,
    # app/observability.py), and nothing came back an error (5xx lines are kept).
    assert '"POST /mcp HTTP/1.1\\" 5' not in server.log()
    assert not server_errors(server)


@pytest.fixture
def recorded(serve: Servers) -> Iterator[tuple[RunningServer, RecordingProxy]]:
    """A local-mode server behind a proxy that writes down what Claude Code sends."""
    proxy = RecordingProxy(free_port(), free_port()).start()
    running = serve(port=proxy.target_port, SANDBOX_MCP_PUBLIC_URL=proxy.base_url)
    yield running, proxy
    serve.stop(running)
    proxy.stop()


def test_claude_code_speaks_2026_07_28_and_keeps_no_session(
    recorded: tuple[RunningServer, RecordingProxy], claude: ClaudeCode
) -> None:
    server, proxy = recorded
    url = f"{proxy.base_url}/mcp"
    add(claude, "sandbox", url)
    shown = claude.run("mcp", "list")
    assert listed(shown.stdout, "sandbox", url) == "✔ Connected", shown.stdout
    assert not proxy.unparsed, proxy.unparsed

    sent = proxy.requests
    print(json.dumps([(r.method, r.path, r.rpc_method, r.headers) for r in sent], indent=1))
    methods = [r.rpc_method for r in sent]
    # It probes the 2026-07-28 era first and, served, never falls back to initialize.
    assert methods[0] == "server/discover", methods
    assert "tools/list" in methods, methods
    assert "initialize" not in methods, methods
    for request in sent:
        assert (request.method, request.path) == ("POST", "/mcp"), request
        assert request.headers["mcp-protocol-version"] == "2026-07-28", request
        assert request.headers["mcp-method"] == request.rpc_method, request
        assert "mcp-session-id" not in request.headers, request
        meta = request.body["params"]["_meta"]
        assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28", request
        assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "claude-code", request
        assert request.headers["user-agent"].startswith("claude-code/2.1.332 "), request
    assert "mcp.protocol_version_header_mismatch" not in server.log()
    # Claude Code exits with its subscriptions/listen stream still open; the server
    # closes it quietly.
    assert not server_errors(server)


async def test_hosted_mode_with_a_bearer_header_is_connected(
    hosted: RunningServer, claude: ClaudeCode
) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        token = await new_user(http, hosted.base_url)
    add(claude, "sandbox", hosted.mcp_url, f"Authorization: Bearer {token}")
    add(claude, "anonymous", hosted.mcp_url)  # controls: no token, a forged one
    add(claude, "forged", hosted.mcp_url, "Authorization: Bearer smcp_at_forged")

    shown = claude.run("mcp", "list")
    assert shown.returncode == 0, shown.stderr + shown.stdout
    assert listed(shown.stdout, "sandbox", hosted.mcp_url) == "✔ Connected"
    assert listed(shown.stdout, "anonymous", hosted.mcp_url) == "! Needs authentication"
    forged = listed(shown.stdout, "forged", hosted.mcp_url)
    assert forged.startswith("✘ Failed to connect"), forged
    assert "HTTP 401" in forged, forged
    # The refused ones were seen by the server (refused /mcp requests keep their line).
    assert '"POST /mcp HTTP/1.1\\" 401' in hosted.log()


@pytest.fixture
def hosted_without_documents(serve: Servers) -> RunningServer:
    # Where the server advertises client ID metadata documents, Claude Code identifies
    # itself as https://claude.ai/oauth/claude-code-client-metadata, which the server
    # must fetch from the internet (CI has none). Without them it registers (RFC 7591).
    return serve(**HOSTED, SANDBOX_MCP_CLIENT_METADATA_DOCUMENTS="false")


def test_claude_code_signs_in_by_itself_and_is_connected(
    hosted_without_documents: RunningServer, claude: ClaudeCode, tmp_path: Path
) -> None:
    server = hosted_without_documents
    add(claude, "sandbox", server.mcp_url)
    before = claude.run("mcp", "list")
    assert listed(before.stdout, "sandbox", server.mcp_url) == "! Needs authentication"

    press_log = tmp_path / "pressed.jsonl"
    code, screen = claude.login("sandbox", press_log)
    assert code == 0, screen
    assert 'Authenticated with "sandbox"' in screen, screen

    # The "person" saw the page, pressed the button once, and landed on Claude Code.
    [pressed] = [json.loads(line) for line in press_log.read_text().splitlines()]
    assert pressed["page"] == 200, pressed
    assert pressed["button"] is True, pressed
    assert pressed["url"].startswith(f"{server.base_url}/authorize?"), pressed
    assert "code_challenge_method=S256" in pressed["url"], pressed
    assert pressed["pressed"] == 303, pressed
    assert re.match(r"http://(localhost|127\.0\.0\.1):\d+/callback\?code=", pressed["location"])
    assert pressed["landed"] == 200, pressed

    after = claude.run("mcp", "list")
    assert after.returncode == 0, after.stderr + after.stdout
    assert listed(after.stdout, "sandbox", server.mcp_url) == "✔ Connected"
    log = server.log()
    for step in ('"POST /register HTTP/1.1\\" 201', '"POST /token HTTP/1.1\\" 200'):
        assert step in log, log[-4000:]
