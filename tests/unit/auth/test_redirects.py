from __future__ import annotations

import pytest

from auth.errors import OAuthError
from auth.pkce import is_valid_verifier, verifier_matches
from auth.redirects import check_registrable, matches
from auth.signin import same_resource


@pytest.mark.parametrize(
    "uri",
    [
        "https://claude.ai/api/mcp/auth_callback",
        "https://claude.com/api/mcp/auth_callback",
        "http://127.0.0.1/cb",
        "http://localhost:8080/cb",
        "http://[::1]:9/cb",
    ],
)
def test_allowed_redirects(uri: str) -> None:
    check_registrable(uri)


@pytest.mark.parametrize(
    "uri",
    ["http://evil.test/cb", "https://a.test/#", "javascript:x", "ftp://a.test/", "https://a b/"],
)
def test_refused_redirects(uri: str) -> None:
    with pytest.raises(OAuthError) as caught:
        check_registrable(uri)
    assert caught.value.error == "invalid_redirect_uri"


def test_exact_match_with_loopback_port_freedom() -> None:
    registered = ("http://127.0.0.1/cb", "https://app.test/cb")
    assert matches("http://127.0.0.1:51234/cb", registered)
    assert matches("https://app.test/cb", registered)
    assert not matches("https://app.test/cb/", registered)
    assert not matches("https://app.test:444/cb", registered)
    assert not matches("http://127.0.0.1:5/other", registered)
    assert not matches("http://127.0.0.1:99999/cb", registered)


def test_pkce_verifier_rules() -> None:
    assert not is_valid_verifier("abc")
    assert not is_valid_verifier("a" * 129)
    assert not is_valid_verifier("a" * 42 + "!")
    verifier = "a" * 43
    assert verifier_matches(verifier, "F6_EbCMz4Eoj54ZcrKFy5TVmmW9v8xXpQ_gZ4lnJoMc") is False
    from authlib.oauth2.rfc7636.challenge import create_s256_code_challenge

    assert verifier_matches(verifier, create_s256_code_challenge(verifier))


def test_resource_comparison() -> None:
    ours = "https://mcp.example.com/mcp"
    assert same_resource("HTTPS://MCP.Example.com/mcp", ours)
    assert same_resource("https://mcp.example.com/mcp/", ours)
    assert not same_resource("https://mcp.example.com/MCP", ours)
    assert not same_resource("https://evil.test/mcp", ours)
    assert not same_resource("https://mcp.example.com/mcp?x=1", ours)
