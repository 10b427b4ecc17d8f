"""Environment policy, table-driven."""

from __future__ import annotations

import pytest

from jail import JailError, is_credential_shaped, resolve_env
from jail.env_policy import MAX_REQUESTS, MAX_VALUE_BYTES

HOST = {
    "LANG": "C.UTF-8",
    "TZ": "UTC",
    "GITHUB_TOKEN": "ghp_hostsecret",
    "AWS_REGION": "eu-west-1",
    "SANDBOX_MCP_SERVER_KEY": "server-secret",
    "HUGE": "x" * (MAX_VALUE_BYTES + 1),
    "NUL": "a\x00b",
}


@pytest.mark.parametrize(
    ("name", "shaped"),
    [
        ("GITHUB_TOKEN", True),
        ("GH_TOKEN", True),
        ("TOKEN", True),
        ("token_url", True),
        ("NPM_TOKENS", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("CLIENT_SECRET", True),
        ("SECRET_KEY_BASE", True),
        ("OPENAI_API_KEY", True),
        ("MY_APIKEY", True),
        ("STRIPE_KEY", True),
        ("SIGNING_KEYS", True),
        ("PGPASSWORD", True),
        ("DB_PASS", True),
        ("DB_PWD", True),
        ("PWD", False),
        ("OLDPWD", False),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("AWS_REGION", True),
        ("aws_access_key_id", True),
        ("DATABASE_URL", True),
        ("PROD_DATABASE_URL", True),
        ("SENTRY_DSN", True),
        ("REDIS_URL", True),
        ("SSH_AUTH_SOCK", True),
        ("DOCKER_HOST", True),
        ("KUBECONFIG", True),
        ("GITLAB_PAT", True),
        ("SESSION_COOKIE", True),
        ("PATH", False),
        ("HOME", False),
        ("LANG", False),
        ("NODE_ENV", False),
        ("PYTHONPATH", False),
        ("KEYBOARD_LAYOUT", False),
        ("MONKEY", False),
        ("CI", False),
    ],
)
def test_is_credential_shaped(name: str, shaped: bool) -> None:
    assert is_credential_shaped(name) is shaped


@pytest.mark.parametrize(
    ("requests", "strict", "expected"),
    [
        ([], True, {}),
        (["LANG"], True, {"LANG": "C.UTF-8"}),
        (["LANG", "TZ"], True, {"LANG": "C.UTF-8", "TZ": "UTC"}),
        (["MODE=test"], True, {"MODE": "test"}),
        (["EMPTY="], True, {"EMPTY": ""}),
        (["EQ=a=b=c"], True, {"EQ": "a=b=c"}),
        (["_X1=1"], True, {"_X1": "1"}),
        (["GITHUB_TOKEN"], False, {"GITHUB_TOKEN": "ghp_hostsecret"}),
        (["API_KEY=test"], False, {"API_KEY": "test"}),
    ],
)
def test_accepted(requests: list[str], strict: bool, expected: dict[str, str]) -> None:
    assert resolve_env(requests, HOST, strict=strict) == expected


def test_host_environment_is_never_inherited() -> None:
    assert resolve_env(["LANG"], HOST) == {"LANG": "C.UTF-8"}


@pytest.mark.parametrize(
    ("requests", "strict", "code"),
    [
        (["GITHUB_TOKEN"], True, "ENV_NAME_REFUSED"),
        (["API_KEY=literal"], True, "ENV_NAME_REFUSED"),
        (["AWS_REGION"], True, "ENV_NAME_REFUSED"),
        (["SANDBOX_MCP_SERVER_KEY"], False, "ENV_NAME_REFUSED"),
        (["sandbox_mcp_anything=1"], False, "ENV_NAME_REFUSED"),
        (["NOT_SET_ANYWHERE"], True, "ENV_INVALID"),
        (["1ABC=x"], True, "ENV_INVALID"),
        (["A-B=x"], True, "ENV_INVALID"),
        (["=value"], True, "ENV_INVALID"),
        ([""], True, "ENV_INVALID"),
        (["A B"], True, "ENV_INVALID"),
        (["ÄPFEL=1"], True, "ENV_INVALID"),
        (["A\x00B=1"], True, "ENV_INVALID"),
        (["X" * 200 + "=1"], True, "ENV_INVALID"),
        (["V=a\x00b"], True, "ENV_INVALID"),
        (["NUL"], True, "ENV_INVALID"),
        ([f"V={'x' * (MAX_VALUE_BYTES + 1)}"], True, "ENV_INVALID"),
        (["HUGE"], True, "ENV_INVALID"),
        (["LANG", "LANG=C"], True, "ENV_INVALID"),
        ([f"V{n}=1" for n in range(MAX_REQUESTS + 1)], True, "ENV_INVALID"),
    ],
)
def test_refused(requests: list[str], strict: bool, code: str) -> None:
    with pytest.raises(JailError) as excinfo:
        resolve_env(requests, HOST, strict=strict)
    assert excinfo.value.code == code


@pytest.mark.parametrize(
    "request_",
    ["GITHUB_TOKEN", "SANDBOX_MCP_SERVER_KEY", "V=topsecretvalue\x00", "ghp_pasted=topsecretvalue"],
)
def test_messages_never_show_values(request_: str) -> None:
    with pytest.raises(JailError) as excinfo:
        resolve_env([request_, "HUGE"], HOST)
    shown = excinfo.value.message + repr(excinfo.value.details)
    for value in (*HOST.values(), "topsecretvalue"):
        assert value not in shown


def test_malformed_requests_are_named_by_position_only() -> None:
    with pytest.raises(JailError) as excinfo:
        resolve_env(["LANG", "sk-live-abc123"], HOST)
    assert "sk-live-abc123" not in excinfo.value.message
    assert "#2" in excinfo.value.message
