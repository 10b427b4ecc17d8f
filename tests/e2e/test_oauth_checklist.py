"""The OAuth checklist (shared/reference/oauth-checklist.md), item by item, on the real server.

Items that need the clock moved (code expiry, the refresh grace window) are in
tests/unit/auth/test_grants_timing.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import call_tool, read_jsonrpc
from oauth_browser import REDIRECT_URI, ManualClient, pkce_pair, press_button, query_of, read_page

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="4",
        SANDBOX_MCP_REGISTRATIONS_PER_MINUTE="1000",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="1000",
        SANDBOX_MCP_SANDBOXES_PER_ADDRESS="1000",  # every test's user signs in from loopback
        SANDBOX_MCP_LOG_LEVEL="DEBUG",
    )


@pytest.fixture
async def client(http: httpx2.AsyncClient, server: RunningServer) -> ManualClient:
    return await ManualClient.register(http, server.base_url)


# -- A. discovery and the resource server ------------------------------------------


async def test_01_401_points_at_resource_metadata(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    response = await http.post(server.mcp_url, json={})
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    url = f"{server.base_url}/.well-known/oauth-protected-resource/mcp"
    assert f'resource_metadata="{url}"' in challenge
    assert "error=" not in challenge  # no credentials: a bare challenge (RFC 6750 3.1)
    assert 'scope="sandbox"' in challenge
    assert (await http.get(url)).status_code == 200


async def test_02_protected_resource_metadata_at_both_urls(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    for path in (
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ):
        response = await http.get(server.base_url + path)
        assert response.status_code == 200
        body = response.json()
        assert body["resource"] == server.mcp_url
        assert body["authorization_servers"] == [server.base_url]
        assert body["scopes_supported"] == ["sandbox"]


async def test_03_authorization_server_metadata(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    body = (await http.get(f"{server.base_url}/.well-known/oauth-authorization-server")).json()
    assert body["issuer"] == server.base_url
    assert not body["issuer"].endswith("/")
    assert body["response_types_supported"] == ["code"]
    assert set(body["grant_types_supported"]) == {"authorization_code", "refresh_token"}
    assert body["code_challenge_methods_supported"] == ["S256"]
    assert "none" in body["token_endpoint_auth_methods_supported"]
    assert body["authorization_response_iss_parameter_supported"] is True
    assert body["client_id_metadata_document_supported"] is True
    for endpoint in ("authorization", "token", "registration", "revocation"):
        assert body[f"{endpoint}_endpoint"].startswith(server.base_url + "/")
    assert "offline_access" not in body["scopes_supported"]


async def test_04_host_header_never_changes_the_metadata(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    url = f"{server.base_url}/.well-known/oauth-authorization-server"
    plain = (await http.get(url)).json()
    forged = (
        await http.get(url, headers={"host": "evil.test", "x-forwarded-host": "evil.test"})
    ).json()
    assert forged == plain


async def test_05_token_in_the_query_string_is_refused(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    tokens = await client.tokens(http)
    response = await http.post(
        f"{server.mcp_url}?access_token={tokens['access_token']}",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 401


async def test_06_invalid_token_gets_invalid_token(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    response = await call_tool(http, server.base_url, "smcp_at_not-a-real-token")
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    # Right prefix and length, made up, with a byte that is not ASCII: still a plain 401.
    hostile = await http.post(
        server.mcp_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"authorization": b"Bearer smcp_at_" + b"A" * 53 + b"\xe9"},
    )
    assert hostile.status_code == 401
    assert 'error="invalid_token"' in hostile.headers["www-authenticate"]


async def test_07_refresh_tokens_and_foreign_tokens_are_not_bearer_credentials(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    tokens = await client.tokens(http)
    foreign_jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    for bearer in (tokens["refresh_token"], foreign_jwt, tokens["access_token"][:-2]):
        assert (await call_tool(http, server.base_url, bearer)).status_code == 401
    ok = await call_tool(http, server.base_url, tokens["access_token"])
    assert ok.status_code == 200, ok.text


async def test_08_a_session_id_never_reaches_another_sandbox(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    # The server is stateless: no session id is issued, and one presented is ignored;
    # the token alone picks the sandbox, so a leaked or guessed id carries nothing.
    alice, bob = await client.tokens(http), await client.tokens(http)
    headers = {"accept": "application/json, text/event-stream"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    response = await http.post(
        server.mcp_url,
        json=init,
        headers={**headers, "authorization": f"Bearer {alice['access_token']}"},
    )
    assert response.status_code == 200, response.text
    assert "mcp-session-id" not in response.headers
    status = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "sandbox_status", "arguments": {}},
    }

    async def sandbox_of(token: str) -> str:
        answer = await http.post(
            server.mcp_url,
            json=status,
            headers={
                **headers,
                "authorization": f"Bearer {token}",
                "mcp-session-id": "a-session-alice-might-have-had",
                "mcp-protocol-version": "2025-11-25",
            },
        )
        assert answer.status_code == 200, answer.text
        return str(read_jsonrpc(answer)["result"]["structuredContent"]["sandbox"])

    assert await sandbox_of(alice["access_token"]) != await sandbox_of(bob["access_token"])


@pytest.mark.parametrize(
    ("header", "status"),
    [
        ({"origin": "https://evil.test"}, 403),  # item 11: a present, foreign Origin
        ({"host": "evil.test"}, 421),  # DNS rebinding: a Host that is not ours
    ],
)
async def test_11_a_foreign_origin_or_host_is_refused_on_mcp(
    http: httpx2.AsyncClient,
    server: RunningServer,
    client: ManualClient,
    header: dict[str, str],
    status: int,
) -> None:
    tokens = await client.tokens(http)
    response = await http.post(
        server.mcp_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={
            "authorization": f"Bearer {tokens['access_token']}",
            "accept": "application/json, text/event-stream",
            **header,
        },
    )
    assert response.status_code == status


# -- B. registration ------------------------------------------------------------------


async def test_12_client_secret_post_is_answered_with_none(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    response = await http.post(
        f"{server.base_url}/register",
        json={
            "redirect_uris": ["https://claude.ai/api/mcp/auth_callback"],
            "client_name": "Claude",
            "token_endpoint_auth_method": "client_secret_post",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        },
    )
    assert response.status_code == 201
    body = response.json()
    assert body["token_endpoint_auth_method"] == "none"
    assert "client_secret" not in body
    for field in (
        "client_id",
        "client_id_issued_at",
        "redirect_uris",
        "grant_types",
        "response_types",
    ):
        assert field in body


@pytest.mark.parametrize(
    "uri",
    [
        "http://evil.test/cb",
        "https://ok.test/cb#frag",
        "javascript:alert(1)",
        "data:text/html,hi",
        "file:///etc/passwd",
        "com.example.app:/cb",
        "https://user:pw@ok.test/cb",
        "https:///no-host",
    ],
)
async def test_13_redirect_uri_policy(
    http: httpx2.AsyncClient, server: RunningServer, uri: str
) -> None:
    response = await http.post(f"{server.base_url}/register", json={"redirect_uris": [uri]})
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_redirect_uri"


async def test_14_registration_is_bounded(http: httpx2.AsyncClient, server: RunningServer) -> None:
    url = f"{server.base_url}/register"
    big = await http.post(url, json={"redirect_uris": ["https://a.test/cb"], "x": "y" * 9000})
    assert big.status_code == 400
    many = await http.post(url, json={"redirect_uris": [f"https://a.test/{i}" for i in range(11)]})
    assert many.status_code == 400
    long_name = await http.post(
        url, json={"redirect_uris": ["https://a.test/cb"], "client_name": "n" * 101}
    )
    assert long_name.status_code == 400
    not_json = await http.post(url, content=b"{", headers={"content-type": "application/json"})
    assert not_json.json()["error"] == "invalid_client_metadata"


async def test_15_unknown_client_at_token_is_401_invalid_client(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    response = await http.post(
        f"{server.base_url}/token",
        data={"grant_type": "authorization_code", "code": "x", "client_id": "nonexistent"},
    )
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_client"


@pytest.mark.parametrize(
    "client_id",
    [
        "https://169.254.169.254/latest/meta-data",  # cloud metadata, by address
        "https://127.0.0.1/x",
        "https://[::ffff:169.254.169.254]/x",
        "https://localhost/x",  # by name (RFC 6761: always loopback)
    ],
)
async def test_16_a_metadata_document_on_a_private_address_is_never_fetched(
    http: httpx2.AsyncClient, server: RunningServer, client_id: str
) -> None:
    # The full CIMD sign-in with the SDK client is in test_oauth_client_documents.py.
    _, challenge = pkce_pair()
    seen = len(server.log())  # the server is shared: look only at what this case logs
    page = await http.get(
        f"{server.base_url}/authorize",
        params={
            "client_id": client_id,
            "redirect_uri": REDIRECT_URI,
            "response_type": "code",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        },
    )
    assert page.status_code == 400
    assert "location" not in page.headers
    assert "private, loopback or link-local" in page.text
    token = await http.post(
        f"{server.base_url}/token",
        data={"grant_type": "authorization_code", "code": "x", "client_id": client_id},
    )
    assert token.status_code == 401
    assert token.json()["error"] == "invalid_client"
    logged = server.log()[seen:].splitlines()
    refusals = [line for line in logged if "oauth.client_document_refused" in line]
    assert len(refusals) == 1, logged
    assert not any("client_document_connect_failed" in line for line in logged), "no connection"


# -- C. /authorize and the page ---------------------------------------------------------


async def test_17_18_redirect_uri_must_match_and_errors_stay_local(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    _, challenge = pkce_pair()
    slash = await http.get(client.authorize_url(challenge, redirect_uri=REDIRECT_URI + "/"))
    assert slash.status_code == 400
    assert "location" not in slash.headers
    other_port = await http.get(
        client.authorize_url(challenge, redirect_uri="http://127.0.0.1:51234/callback")
    )
    assert other_port.status_code == 200  # RFC 8252: any port on loopback
    unknown = await http.get(
        client.authorize_url(challenge).replace(client.client_id, "nobody-registered-this")
    )
    assert unknown.status_code == 400
    assert "location" not in unknown.headers


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"code_challenge": ""}, "invalid_request"),
        ({"code_challenge_method": "plain"}, "invalid_request"),
        ({"response_type": "token"}, "unsupported_response_type"),
        ({"resource": "https://evil.test/mcp"}, "invalid_target"),
        ({"scope": "sandbox offline_access admin"}, "invalid_scope"),
    ],
)
async def test_19_20_errors_redirect_with_state_and_iss(
    http: httpx2.AsyncClient,
    server: RunningServer,
    client: ManualClient,
    change: dict[str, str],
    error: str,
) -> None:
    _, challenge = pkce_pair()
    url = client.authorize_url(challenge, state="keep me & exact", **change)
    response = await http.get(url)
    assert response.status_code == 303
    query = query_of(response.headers["location"])
    assert response.headers["location"].startswith(REDIRECT_URI + "?")
    assert query["error"] == error
    assert query["state"] == "keep me & exact"
    assert query["iss"] == server.base_url


PHISH_URI = "https://phish.example/callback"


@pytest.mark.parametrize(
    "change",
    [
        {"code_challenge": ""},
        {"code_challenge_method": "plain"},
        {"response_type": "token"},
        {"resource": "https://evil.test/mcp"},
        {"scope": "sandbox admin"},
    ],
)
async def test_19_pre_consent_errors_never_redirect_to_a_self_registered_site(
    http: httpx2.AsyncClient, server: RunningServer, change: dict[str, str]
) -> None:
    # Anyone may register https://phish.example/ and link victims to a broken request:
    # redirecting its error would make our address an open redirector (RFC 9700 4.11.2).
    phisher = await ManualClient.register(http, server.base_url, PHISH_URI)
    _, challenge = pkce_pair()
    url = phisher.authorize_url(challenge, redirect_uri=PHISH_URI, **change)
    response = await http.get(url)
    assert response.status_code == 400, response.headers
    assert "location" not in response.headers
    assert "phish.example" in response.text  # the page says where it did not send you
    assert "connect again" in response.text


async def test_19_a_valid_request_to_a_https_client_still_signs_in_and_redirects(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    # After the button the person has seen the return host: the code goes there.
    app = await ManualClient.register(http, server.base_url, PHISH_URI)
    _, challenge = pkce_pair()
    page = read_page(await http.get(app.authorize_url(challenge, redirect_uri=PHISH_URI)))
    assert "phish.example" in page.html
    answer = await press_button(http, server.base_url, page)
    assert answer.status_code == 303
    assert answer.headers["location"].startswith(PHISH_URI + "?code=")


async def test_20_our_own_resource_is_accepted(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    _, challenge = pkce_pair()
    response = await http.get(
        client.authorize_url(challenge, resource=server.mcp_url.upper().replace("/MCP", "/mcp"))
    )
    assert response.status_code == 200


async def test_21_23_page_headers_escaping_and_no_code_on_get(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    response = await http.post(
        f"{server.base_url}/register",
        json={"redirect_uris": [REDIRECT_URI], "client_name": "<script>alert(1)</script>"},
    )
    client = ManualClient(server.base_url, response.json()["client_id"])
    _, challenge = pkce_pair()
    page = await http.get(client.authorize_url(challenge))
    assert page.status_code == 200
    assert "<script>" not in page.text
    assert "&lt;script&gt;" in page.text
    assert "127.0.0.1" in page.text  # the redirect host is shown
    headers = page.headers
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["cache-control"] == "no-store"
    assert "access-control-allow-origin" not in headers
    assert "code=" not in page.headers.get("location", "")
    cookie = page.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=lax" in cookie


async def test_22_csrf_without_cookie_or_with_another_signins_token_is_403(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    _, challenge = pkce_pair()
    first = read_page(await http.get(client.authorize_url(challenge)))
    second = read_page(await http.get(client.authorize_url(challenge)))
    no_cookie = await http.post(
        f"{server.base_url}/authorize", data={"tx": first.tx, "csrf": first.csrf}
    )
    assert no_cookie.status_code == 403
    crossed = await http.post(
        f"{server.base_url}/authorize",
        data={"tx": first.tx, "csrf": second.csrf},
        headers={"cookie": f"{second.cookie_name}={second.cookie}"},
    )
    assert crossed.status_code == 403
    assert "location" not in crossed.headers
    # The real owner can still finish.
    assert (await press_button(http, server.base_url, first)).status_code == 303


async def test_24_25_double_press_creates_one_sandbox_and_redirects_303(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    _verifier, challenge = pkce_pair()
    page = read_page(await http.get(client.authorize_url(challenge, state="s1")))
    first = await press_button(http, server.base_url, page)
    second = await press_button(http, server.base_url, page)
    assert first.status_code == second.status_code == 303
    assert first.headers["location"] == second.headers["location"]
    query = query_of(first.headers["location"])
    assert query["state"] == "s1"
    assert query["iss"] == server.base_url
    assert len(query["code"]) >= 22
    for header in ("x-frame-options", "cache-control", "referrer-policy"):
        assert header in first.headers


# -- D. /token -------------------------------------------------------------------------


async def test_29_wrong_or_malformed_verifier_is_invalid_grant(
    http: httpx2.AsyncClient, client: ManualClient
) -> None:
    code, verifier = await client.sign_in(http)
    for bad in ("x" * 43, "abc", ""):
        response = await client.exchange(http, code, bad)
        assert response.status_code == 400
        assert response.json()["error"] == "invalid_grant"
    assert (await client.exchange(http, code, verifier)).status_code == 200


async def test_30_second_redemption_revokes_the_first(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    code, verifier = await client.sign_in(http)
    first = (await client.exchange(http, code, verifier)).json()
    bad_replay = await client.exchange(http, code, "y" * 43)
    assert bad_replay.json()["error"] == "invalid_grant"
    assert (await call_tool(http, server.base_url, first["access_token"])).status_code == 200
    replay = await client.exchange(http, code, verifier)
    assert replay.status_code == 400
    assert replay.json()["error"] == "invalid_grant"
    assert (await call_tool(http, server.base_url, first["access_token"])).status_code == 401
    assert (await client.refresh(http, first["refresh_token"])).status_code == 400


async def test_31_34_token_response_shape(http: httpx2.AsyncClient, client: ManualClient) -> None:
    code, verifier = await client.sign_in(http)
    response = await client.exchange(http, code, verifier)
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 3600
    assert body["refresh_token"].startswith("smcp_rt_")  # without offline_access
    assert body["access_token"].startswith("smcp_at_")
    assert body["scope"] == "sandbox"


async def test_28_32_codes_and_refresh_tokens_are_bound_to_their_client(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    other = await ManualClient.register(http, server.base_url)
    code, verifier = await client.sign_in(http)
    stolen = await other.exchange(http, code, verifier)
    assert stolen.json()["error"] == "invalid_grant"
    tokens = (await client.exchange(http, code, verifier)).json()
    assert (await other.refresh(http, tokens["refresh_token"])).json()["error"] == "invalid_grant"
    wrong_target = await http.post(
        f"{server.base_url}/token",
        data={
            "grant_type": "refresh_token",
            "refresh_token": tokens["refresh_token"],
            "client_id": client.client_id,
            "resource": "https://evil.test/mcp",
        },
    )
    assert wrong_target.json()["error"] == "invalid_target"
    assert (await client.refresh(http, tokens["refresh_token"])).status_code == 200


async def test_33_rotation_with_grace_keeps_one_family(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    tokens = await client.tokens(http)
    rotated = await client.refresh(http, tokens["refresh_token"])
    assert rotated.status_code == 200
    again = await client.refresh(
        http, tokens["refresh_token"]
    )  # a concurrent refresh, seconds later
    assert again.status_code == 200
    assert again.json() == rotated.json()  # the same pair: no fork
    newer = await client.refresh(http, rotated.json()["refresh_token"])
    assert newer.status_code == 200
    assert (await call_tool(http, server.base_url, newer.json()["access_token"])).status_code == 200


async def test_revocation_works_for_public_clients(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    tokens = await client.tokens(http)
    url = f"{server.base_url}/revoke"
    response = await http.post(
        url, data={"token": tokens["access_token"], "client_id": client.client_id}
    )
    assert response.status_code == 200
    assert (await call_tool(http, server.base_url, tokens["access_token"])).status_code == 401
    assert (await client.refresh(http, tokens["refresh_token"])).status_code == 200
    tokens = await client.tokens(http)
    await http.post(url, data={"token": tokens["refresh_token"], "client_id": client.client_id})
    assert (await client.refresh(http, tokens["refresh_token"])).status_code == 400
    assert (await call_tool(http, server.base_url, tokens["access_token"])).status_code == 401
    unknown = await http.post(url, data={"token": "whatever", "client_id": client.client_id})
    assert unknown.status_code == 200


async def test_each_sign_in_gets_its_own_sandbox(
    http: httpx2.AsyncClient, server: RunningServer, client: ManualClient
) -> None:
    a, b = await client.tokens(http), await client.tokens(http)
    seen = []
    for tokens in (a, b):
        response = await call_tool(http, server.base_url, tokens["access_token"])
        seen.append(response.json()["result"]["structuredContent"]["sandbox"])
    assert seen[0] != seen[1]


# -- 35: nothing replayable on disk or in the logs ------------------------------------


async def test_35_database_and_logs_hold_no_credential(
    http: httpx2.AsyncClient, server: RunningServer, tmp_path: Path
) -> None:
    client = await ManualClient.register(http, server.base_url)
    verifier, challenge = pkce_pair()
    page = read_page(await http.get(client.authorize_url(challenge)))
    email = "secret.person@example.org"
    answer = await press_button(http, server.base_url, page, email=email)
    code = query_of(answer.headers["location"])["code"]
    tokens = (await client.exchange(http, code, verifier)).json()
    rotated = (await client.refresh(http, tokens["refresh_token"])).json()
    await call_tool(http, server.base_url, rotated["access_token"])
    secrets_issued = [
        code,
        verifier,
        page.csrf,
        page.tx,
        email,
        tokens["access_token"],
        tokens["refresh_token"],
        rotated["access_token"],
        rotated["refresh_token"],
    ]
    state_dir = Path(server.log_path).parent / "state"
    db_bytes = b"".join(p.read_bytes() for p in state_dir.glob("sandbox-mcp.db*"))
    with sqlite3.connect(state_dir / "sandbox-mcp.db") as db:
        dump = "\n".join(db.iterdump())
    logs = server.log()
    for secret in secrets_issued:
        assert secret.encode() not in db_bytes, secret[:12]
        assert secret not in dump, secret[:12]
        assert secret not in logs, secret[:12]
