"""The server process: where it listens and under which URL, its workers, its
connections' deadlines, its logs and ``/metrics``'s token."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from app.settings.base import Group
from jail.addresses import is_loopback_host

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


class ServerSettings(Group):
    public_url: str | None = Field(
        default=None,
        description=(
            "External base URL (scheme://host[:port]); issuer, resource and the allowed Host "
            "header derive from it. Default: http://HOST:PORT."
        ),
    )
    host: str = Field(default="127.0.0.1", description="Address the HTTP server binds to.")
    port: int = Field(
        default=8000, ge=1, le=65535, description="TCP port the HTTP server binds to."
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Server processes sharing the port (`serve --workers N`); more than one needs "
            "PostgreSQL, which they share."
        ),
    )
    process_stale_s: float = Field(
        default=30,
        ge=3,
        le=3600,
        description=(
            "Server processes sharing one database write a heartbeat every sixth of this; "
            "one silent this long is taken for dead: its running jobs are reported lost "
            "(their process trees killed) and its containers judged by the records alone."
        ),
    )
    max_connections: int = Field(
        default=4096,
        ge=16,
        le=1_000_000,
        description=(
            "Most HTTP connections open at once (lowered to the descriptor limit minus 256). "
            "Past it, the oldest connection still sending its request is closed."
        ),
    )
    header_timeout_s: float = Field(
        default=10,
        gt=0,
        le=300,
        description="Seconds a client has to send a request's line and headers (slowloris).",
    )
    body_timeout_s: float = Field(
        default=60,
        gt=0,
        le=3600,
        description="Seconds a client has to send a request's body once its headers are in.",
    )
    log_level: LogLevel = Field(default="INFO", description="Lowest level written to stderr.")
    metrics_token: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token Prometheus must send for /metrics; unset: /metrics is open, like /health."
        ),
    )

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an absolute http(s) URL such as https://mcp.example.com")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("must be a base URL with no path, query or fragment")
        if parts.scheme == "http" and not is_loopback_host(parts.hostname):
            raise ValueError("must use https unless the host is loopback (OAuth 2.1 requires TLS)")
        # The issuer is derived from it and must not end with a slash (RFC 8414 section 2).
        return value.rstrip("/")

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_log_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("metrics_token")
    @classmethod
    def _check_metrics_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (openssl rand -hex 16)")
        return value

    @property
    def effective_public_url(self) -> str:
        if self.public_url:
            return self.public_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def listening_url(self) -> str:
        """Where this process listens (the public URL may be a proxy in front of it)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def metrics_secret(self) -> str | None:
        return self.metrics_token.get_secret_value() if self.metrics_token else None
