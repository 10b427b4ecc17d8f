from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import SettingsError, load_settings


def errors_for(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(f"SANDBOX_MCP_{name}", value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    return caught.value.lines


def test_defaults_match_the_design(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_MCP_STATE_DIR")
    settings = load_settings()
    assert settings.state_dir == Path("~/.sandbox-mcp").expanduser()
    assert settings.pool_size == 500
    assert settings.slot_backend == "dir"
    assert settings.idle_timeout_s == 600
    assert settings.auth == "oauth"
    assert settings.effective_database_url.endswith("/.sandbox-mcp/sandbox-mcp.db")
    assert settings.effective_database_url.startswith("sqlite+aiosqlite:///")
    assert settings.effective_public_url == "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("PORT", "abc", "SANDBOX_MCP_PORT='abc' is invalid: Input should be a valid integer"),
        ("PORT", "70000", "SANDBOX_MCP_PORT='70000' is invalid: Input should be less than"),
        ("POOL_SIZE", "0", "SANDBOX_MCP_POOL_SIZE='0' is invalid: Input should be greater than"),
        ("SLOT_BACKEND", "nfs", "SANDBOX_MCP_SLOT_BACKEND='nfs' is invalid: Input should be 'dir'"),
        ("AUTH", "basic", "SANDBOX_MCP_AUTH='basic' is invalid: Input should be 'oauth' or 'none'"),
        ("LOG_LEVEL", "loud", "SANDBOX_MCP_LOG_LEVEL='loud' is invalid: Input should be 'DEBUG'"),
        ("IDLE_TIMEOUT_S", "1", "SANDBOX_MCP_IDLE_TIMEOUT_S='1' is invalid"),
        (
            "DATABASE_URL",
            "mysql://x",
            "must start with sqlite+aiosqlite:// or postgresql+asyncpg://",
        ),
        ("PUBLIC_URL", "ftp://x", "must be an absolute http(s) URL"),
        (
            "METRICS_TOKEN",
            "short-secret",
            "SANDBOX_MCP_METRICS_TOKEN='<hidden>' is invalid: must be at least 16",
        ),
        ("TOKEN_KEY", "abcd", "SANDBOX_MCP_TOKEN_KEY='<hidden>' is invalid"),
        ("PUBLIC_URL", "https://x.test/mcp", "must be a base URL with no path"),
        ("PUBLIC_URL", "http://x.test", "must use https unless the host is loopback"),
    ],
)
def test_a_bad_value_gets_one_line_naming_variable_value_and_rule(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    lines = errors_for(monkeypatch, **{name: value})
    assert len(lines) == 1
    assert expected in lines[0]


def test_auth_none_is_refused_off_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = errors_for(monkeypatch, AUTH="none", HOST="0.0.0.0")
    assert lines == [
        "SANDBOX_MCP_AUTH='none' is allowed only when SANDBOX_MCP_HOST is loopback "
        "(it is '0.0.0.0'): without sign-in every caller would share one sandbox"
    ]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "localhost", "::1"])
def test_auth_none_is_allowed_on_loopback(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.setenv("SANDBOX_MCP_AUTH", "none")
    monkeypatch.setenv("SANDBOX_MCP_HOST", host)
    assert load_settings().auth == "none"


def test_an_unknown_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert errors_for(monkeypatch, POOLSIZE="3") == [
        "SANDBOX_MCP_POOLSIZE is not a setting of sandbox-mcp"
    ]


def test_every_bad_variable_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = errors_for(monkeypatch, PORT="x", POOL_SIZE="-1")
    assert len(lines) == 2


def test_public_url_loses_its_trailing_slash(monkeypatch: pytest.MonkeyPatch) -> None:
    # RFC 8414: the issuer derived from it must not end with a slash.
    monkeypatch.setenv("SANDBOX_MCP_PUBLIC_URL", "https://mcp.example.com/")
    assert load_settings().effective_public_url == "https://mcp.example.com"


def test_overrides_win_and_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_MCP_PORT", "9000")
    assert load_settings(port=9100).port == 9100
    with pytest.raises(SettingsError):
        load_settings().with_overrides(port=0)


def test_log_level_is_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_MCP_LOG_LEVEL", "debug")
    assert load_settings().log_level == "DEBUG"


def test_max_containers_defaults_to_twice_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().effective_max_containers == 1000
    monkeypatch.setenv("SANDBOX_MCP_POOL_SIZE", "6")
    assert load_settings().effective_max_containers == 12
    monkeypatch.setenv("SANDBOX_MCP_MAX_CONTAINERS", "6")
    assert load_settings().effective_max_containers == 6


def test_fewer_containers_than_slots_is_refused_with_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = errors_for(monkeypatch, POOL_SIZE="6", MAX_CONTAINERS="5")
    assert lines == [
        "SANDBOX_MCP_MAX_CONTAINERS=5 is below SANDBOX_MCP_POOL_SIZE=6: every sandbox the "
        "pool hands out must be able to run one experiment, so the server keeps a container "
        "for each slot; set SANDBOX_MCP_MAX_CONTAINERS to at least 6 (unset, it is twice the "
        "pool size) or lower SANDBOX_MCP_POOL_SIZE"
    ]


def test_the_job_caps_have_defaults_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert (settings.max_jobs_per_sandbox, settings.max_jobs_per_experiment) == (8, 4)
    lines = errors_for(monkeypatch, MAX_JOBS_PER_SANDBOX="0")
    assert lines[0].startswith("SANDBOX_MCP_MAX_JOBS_PER_SANDBOX='0' is invalid")


def test_trusted_proxies_are_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = errors_for(monkeypatch, TRUSTED_PROXIES="127.0.0.1, proxy.example")
    assert len(lines) == 1
    assert "SANDBOX_MCP_TRUSTED_PROXIES" in lines[0]
    assert "'proxy.example' is not an IP address or network" in lines[0]
    assert (
        "PROXY_HEADER='via'" in errors_for(monkeypatch, TRUSTED_PROXIES="", PROXY_HEADER="via")[0]
    )


def test_trusted_proxies_and_the_header_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    import ipaddress

    monkeypatch.setenv("SANDBOX_MCP_TRUSTED_PROXIES", "127.0.0.1,10.0.0.0/8")
    monkeypatch.setenv("SANDBOX_MCP_PROXY_HEADER", "Forwarded")
    settings = load_settings()
    assert settings.trusted_proxy_networks == (
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("10.0.0.0/8"),
    )
    assert settings.proxy_header == "forwarded"
    assert load_settings().with_overrides(trusted_proxies="").trusted_proxy_networks == ()


def test_the_egress_allowlist_is_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = errors_for(monkeypatch, EGRESS_ALLOWLIST="pypi.org, https://evil.example/")
    assert len(lines) == 1
    assert "SANDBOX_MCP_EGRESS_ALLOWLIST" in lines[0]
    assert "'https://evil.example/' is not a host name" in lines[0]
    monkeypatch.setenv("SANDBOX_MCP_EGRESS_ALLOWLIST", "PyPI.org, .example.org")
    assert load_settings().egress_ceiling == ("pypi.org", ".example.org")
