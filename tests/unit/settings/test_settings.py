from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import SettingsError, load_settings, variables


def errors_for(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(f"SANDBOX_MCP_{name}", value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    return caught.value.lines


def test_defaults_match_the_design(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_MCP_STATE_DIR")
    settings = load_settings()
    assert settings.storage.state_dir == Path("~/.sandbox-mcp").expanduser()
    assert settings.pool.size == 500
    assert settings.pool.slot_backend == "dir"
    assert settings.pool.idle_timeout_s == 600
    assert settings.auth.mode == "oauth"
    assert settings.storage.effective_database_url.endswith("/.sandbox-mcp/sandbox-mcp.db")
    assert settings.storage.effective_database_url.startswith("sqlite+aiosqlite:///")
    assert settings.server.effective_public_url == "http://127.0.0.1:8000"


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
        # The one parse of the sandbox user (the runtime gets the ids: RuntimeSettings.sandbox_ids).
        ("SANDBOX_USER", "sandbox", "must be uid:gid of an unprivileged user"),
        ("SANDBOX_USER", "0:1000", "must be uid:gid of an unprivileged user"),
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
    assert load_settings().auth.mode == "none"


def test_an_unknown_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert errors_for(monkeypatch, POOLSIZE="3") == [
        "SANDBOX_MCP_POOLSIZE is not a setting of sandbox-mcp"
    ]


def test_every_bad_variable_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = errors_for(monkeypatch, PORT="x", POOL_SIZE="-1")
    assert len(lines) == 2


def test_bad_values_in_every_group_and_a_broken_rule_are_told_in_one_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One bad value in each of several groups, a secret among them, and a rule inside a
    # group whose fields are valid (SMTP): the operator reads all of them at once.
    lines = errors_for(
        monkeypatch,
        PORT="x",
        POOL_SIZE="-1",
        MAX_CPUS="0",
        SYNC_WAIT_S="99",
        EGRESS_ALLOWLIST="https://evil.example/",
        TOKEN_KEY="abcd",
        QUEUE_WAIT_S="-3",
        DATABASE_URL="mysql://x",
        SMTP_HOST="mail.example.com",
        SMTP_SECURITY="none",
    )
    named = sorted(line.split("=", 1)[0] for line in lines)
    assert named == [
        "SANDBOX_MCP_DATABASE_URL",
        "SANDBOX_MCP_EGRESS_ALLOWLIST",
        "SANDBOX_MCP_MAX_CPUS",
        "SANDBOX_MCP_POOL_SIZE",
        "SANDBOX_MCP_PORT",
        "SANDBOX_MCP_QUEUE_WAIT_S",
        "SANDBOX_MCP_SMTP_SECURITY",
        "SANDBOX_MCP_SYNC_WAIT_S",
        "SANDBOX_MCP_TOKEN_KEY",
    ]
    assert "SANDBOX_MCP_TOKEN_KEY='<hidden>' is invalid" in "\n".join(lines)
    assert any(
        line.startswith("SANDBOX_MCP_SMTP_SECURITY='none' is allowed only") for line in lines
    )


def test_rules_inside_two_groups_are_both_told(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = errors_for(
        monkeypatch,
        SLOT_BACKEND="zfs",
        DEFAULT_IMAGE="sandbox-mcp/other:1",
        SMTP_HOST="mail.example.com",
        SMTP_SECURITY="none",
    )
    assert [line.split("=", 1)[0] for line in sorted(lines)] == [
        "SANDBOX_MCP_DEFAULT_IMAGE",
        "SANDBOX_MCP_SLOT_BACKEND",
        "SANDBOX_MCP_SMTP_SECURITY",
    ]


def test_each_variable_feeds_one_field_of_one_group(monkeypatch: pytest.MonkeyPatch) -> None:
    names = variables()
    assert len(names) == len(set(names))
    # The names operators know, read into the group that uses them.
    monkeypatch.setenv("SANDBOX_MCP_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("SANDBOX_MCP_SMTP_PORT", "2525")
    monkeypatch.setenv("SANDBOX_MCP_EGRESS_PROXY", "true")
    monkeypatch.setenv("SANDBOX_MCP_ALLOW_GIT_EGRESS", "1")
    monkeypatch.setenv("SANDBOX_MCP_AUTH", "none")
    monkeypatch.setenv("SANDBOX_MCP_POOL_SIZE", "7")
    monkeypatch.setenv("SANDBOX_MCP_MAX_CPUS", "2.5")
    settings = load_settings()
    assert (settings.smtp.host, settings.smtp.port) == ("127.0.0.1", 2525)
    assert (settings.egress.proxy, settings.egress.allow_git, settings.egress.allow) == (
        True,
        True,
        False,
    )
    assert (settings.auth.mode, settings.auth.hosted) == ("none", False)
    assert settings.pool.size == 7
    assert settings.runtime.ceilings().cpus == 2.5
    assert settings.by_variable()["smtp_port"] == 2525
    assert settings.with_overrides() == settings


def test_an_override_that_is_no_setting_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="'poolsize' is not a setting"):
        load_settings(poolsize=3)


def test_public_url_loses_its_trailing_slash(monkeypatch: pytest.MonkeyPatch) -> None:
    # RFC 8414: the issuer derived from it must not end with a slash.
    monkeypatch.setenv("SANDBOX_MCP_PUBLIC_URL", "https://mcp.example.com/")
    assert load_settings().server.effective_public_url == "https://mcp.example.com"


def test_overrides_win_and_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_MCP_PORT", "9000")
    assert load_settings(port=9100).server.port == 9100
    with pytest.raises(SettingsError):
        load_settings().with_overrides(port=0)


def test_log_level_is_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_MCP_LOG_LEVEL", "debug")
    assert load_settings().server.log_level == "DEBUG"


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
    experiments = settings.experiments
    assert (experiments.max_jobs_per_sandbox, experiments.max_jobs_per_experiment) == (8, 4)
    lines = errors_for(monkeypatch, MAX_JOBS_PER_SANDBOX="0")
    assert lines[0].startswith("SANDBOX_MCP_MAX_JOBS_PER_SANDBOX='0' is invalid")


def test_the_daily_budget_of_stored_job_output_has_a_default_and_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().experiments.job_output_bytes_per_sandbox_per_day == 256 * 1_048_576
    for value in ("65535", "-1", "1.5"):
        lines = errors_for(monkeypatch, JOB_OUTPUT_BYTES_PER_SANDBOX_PER_DAY=value)
        assert lines[0].startswith(
            f"SANDBOX_MCP_JOB_OUTPUT_BYTES_PER_SANDBOX_PER_DAY='{value}' is invalid"
        ), lines


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
    assert settings.auth.trusted_proxy_networks == (
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("10.0.0.0/8"),
    )
    assert settings.auth.proxy_header == "forwarded"
    assert load_settings().with_overrides(trusted_proxies="").auth.trusted_proxy_networks == ()


def test_the_egress_allowlist_is_checked_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = errors_for(monkeypatch, EGRESS_ALLOWLIST="pypi.org, https://evil.example/")
    assert len(lines) == 1
    assert "SANDBOX_MCP_EGRESS_ALLOWLIST" in lines[0]
    assert "'https://evil.example/' is not a host name" in lines[0]
    monkeypatch.setenv("SANDBOX_MCP_EGRESS_ALLOWLIST", "PyPI.org, .example.org")
    assert load_settings().egress.ceiling == ("pypi.org", ".example.org")


def test_the_thread_shares_have_defaults_and_must_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    mcp = load_settings().mcp
    assert (mcp.threads_per_sandbox, mcp.threads_per_address, mcp.tenant_threads) == (2, 8, 16)
    lines = errors_for(monkeypatch, THREADS_PER_SANDBOX="4", TENANT_THREADS="3")
    assert len(lines) == 1
    assert (
        "SANDBOX_MCP_THREADS_PER_SANDBOX must not exceed SANDBOX_MCP_THREADS_PER_ADDRESS"
        in (lines[0])
    )
    lines = errors_for(monkeypatch, THREADS_PER_ADDRESS="17", TENANT_THREADS="16")
    assert "which must not exceed SANDBOX_MCP_TENANT_THREADS" in lines[0]
    monkeypatch.delenv("SANDBOX_MCP_TENANT_THREADS")
    lines = errors_for(monkeypatch, THREADS_PER_SANDBOX="0")
    assert lines[0].startswith("SANDBOX_MCP_THREADS_PER_SANDBOX='0' is invalid")
