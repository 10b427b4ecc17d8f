"""The official TypeScript SDK's client against the real server, signing in by itself.

tests/e2e/clients/ts_client.mjs connects with the SDK's StreamableHTTPClientTransport
and its own OAuthClientProvider: the SDK discovers the server (RFC 9728, RFC 8414),
registers (RFC 7591) and starts code + PKCE; the script plays the browser (loads the
sign-in page, presses "Create my sandbox", lands on its loopback callback) and calls
``finishAuth``. Then it lists the tools and runs ``echo hi`` in an experiment.

- @modelcontextprotocol/sdk (v1, what Claude Code's generation of clients is built
  on) speaks the legacy era only: its SUPPORTED_PROTOCOL_VERSIONS stop at 2025-11-25.
- @modelcontextprotocol/client (v2) speaks both: ``versionNegotiation`` 'legacy' or
  pinned to 2026-07-28.

Needs `bash tests/e2e/clients/install.sh` first (Node 22 and the SDKs, from npm).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from e2e_server import RunningServer, Servers
from npm_clients import NODE, TS_CLIENT, installed, pinned, require

pytestmark = pytest.mark.e2e

LEGACY, MODERN = "2025-11-25", "2026-07-28"
PACKAGES = {"v1": "@modelcontextprotocol/sdk", "v2": "@modelcontextprotocol/client"}


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="4",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
    )


@pytest.fixture(
    scope="module",
    params=[("v1", LEGACY), ("v2", LEGACY), ("v2", MODERN)],
    ids=lambda p: "-".join(p),
)
def outcome(server: RunningServer, request: pytest.FixtureRequest) -> dict[str, Any]:
    """One run of the script per SDK and era, shared by the tests below."""
    sdk, era = request.param
    node = require(NODE, "v22.")
    assert installed(PACKAGES[sdk]) == pinned(PACKAGES[sdk])
    done = subprocess.run(
        [node, TS_CLIENT, "--sdk", sdk, "--era", era, "--url", server.mcp_url],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        cwd=TS_CLIENT.parent,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{done.stderr}\n{done.stdout}\n{server.log()[-4000:]}"
    output: dict[str, Any] = json.loads(done.stdout)
    print(json.dumps(output["requests"], indent=1))  # what the SDK sent, for the record
    return {**output, "asked": (sdk, era)}


def test_sdk_signs_in_by_itself_and_runs_a_command(outcome: dict[str, Any]) -> None:
    out = outcome
    sdk, era = out["asked"]

    assert (out["sdk"], out["sdk_version"]) == (PACKAGES[sdk], pinned(PACKAGES[sdk]))
    assert out["negotiated_protocol_version"] == era
    # It signed in through the page, and the code came back to its own loopback URI.
    assert out["signed_in"] is True
    assert out["signin"]["pages"] == 1
    assert out["signin"]["button"] is True
    assert out["signin"]["redirect"] == out["signin"]["redirect_uri"]

    assert {"sandbox_status", "create_experiment", "execute_experiment"} <= set(out["tools"])
    status = out["sandbox_status"]
    assert status["is_error"] is False, status
    assert status["structured"]["sandbox"].startswith("sbx-")
    created = out["create_experiment"]
    assert created["is_error"] is False, created
    assert created["structured"]["state"] == "READY"
    executed = out["execute_experiment"]
    assert executed["is_error"] is False, executed
    assert executed["structured"]["status"] == "completed"
    assert (executed["structured"]["exit_code"], executed["structured"]["stdout"]) == (0, "hi\n")


def test_sdk_requests_follow_the_spec_of_their_era(
    server: RunningServer, outcome: dict[str, Any]
) -> None:
    _, era = outcome["asked"]
    requests = outcome["requests"]
    paths = [(r["method"], r["path"], r["status"]) for r in requests]

    # Discovery from the 401, then registration and the token, all before any tool call.
    first = requests[0]
    assert (first["method"], first["path"], first["status"]) == ("POST", "/mcp", 401)
    assert first["authorization"] is False
    for step in (
        ("GET", "/.well-known/oauth-protected-resource/mcp", 200),
        ("GET", "/.well-known/oauth-authorization-server", 200),
        ("POST", "/register", 201),
        ("POST", "/token", 200),
    ):
        assert step in paths, paths
    assert paths.index(("POST", "/token", 200)) < next(
        i for i, r in enumerate(requests) if r.get("rpc_method") == "tools/list"
    )

    rpc = [r for r in requests if r["path"] == "/mcp" and r["authorization"]]
    methods = [r.get("rpc_method") for r in rpc if r["method"] == "POST"]
    assert methods.count("tools/call") == 3, methods
    # Stateless: the server never hands out a session id, so none is ever echoed.
    assert not [r for r in requests if r["mcp_session_id"]]
    if era == LEGACY:
        assert methods[:2] == ["initialize", "notifications/initialized"], methods
        assert "server/discover" not in methods
        assert all(r["mcp_protocol_version"] == LEGACY for r in rpc[1:]), rpc
        # The SDK tries the standalone SSE stream once; the stateless server says 405.
        assert ("GET", "/mcp", 405) in paths
    else:
        assert methods[0] == "server/discover", methods
        assert "initialize" not in methods
        for r in rpc:  # the 2026-07-28 per-request envelope, header and body agreeing
            assert (r["mcp_protocol_version"], r["body_protocol_version"]) == (MODERN, MODERN)
            assert r["mcp_method"] == r["rpc_method"], r
        assert [r["mcp_name"] for r in rpc if r["rpc_method"] == "tools/call"] == [
            "sandbox_status",
            "create_experiment",
            "execute_experiment",
        ]
        assert ("GET", "/mcp", 405) not in paths
    # Every /mcp answer after sign-in was a success (202 for the legacy notification).
    assert all(r["status"] in (200, 202) for r in rpc if r["method"] == "POST"), rpc
    # No request was served under a relabelled version: each client labels its own era.
    assert "mcp.protocol_version_header_mismatch" not in server.log()
