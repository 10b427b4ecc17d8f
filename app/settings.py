"""Every tunable of the service, read once from ``SANDBOX_MCP_*`` environment variables.

Domain code never reads ``os.environ``: the composition root validates a
``Settings`` at start-up and passes the pieces down (``app/options.py`` maps them
to each part's options).

Longer than 400 lines for a reason: one model validates every variable at once,
so an operator with three bad values is told all three in one start, and the
cross-field rules (a default image in the allow-list, containers for every slot,
local mode on loopback only) see every field. Each field is its own description.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.runtime.egress_rules import DEFAULT_ALLOWLIST, parse_allowlist
from auth.client_address import parse_trusted_proxies

ENV_PREFIX = "SANDBOX_MCP_"
# Variables of the test harness, not settings (the image build's are SANDBOX_IMAGE_*).
HARNESS_PREFIXES = (ENV_PREFIX + "TEST_", ENV_PREFIX + "CI_")

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


class SettingsError(Exception):
    """The environment holds a value the service cannot start with.

    ``lines`` has one human sentence per bad variable, naming the variable, the
    value it had and what is allowed.
    """

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and any loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """The service's configuration (``SANDBOX_MCP_<FIELD>`` for each field)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    state_dir: Path = Field(
        default=Path("~/.sandbox-mcp"),
        description="Where the database, slots (dir backend), keys and artifacts live.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy async URL; default: SQLite file `sandbox-mcp.db` in the state dir.",
    )
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
    max_connections: int = Field(
        default=4096,
        ge=16,
        le=1_000_000,
        description=(
            "Most HTTP connections open at once (lowered to the descriptor limit minus 256). "
            "Past it, the oldest connection still sending its request is closed."
        ),
    )
    max_listen_streams_per_sandbox: int = Field(
        default=4,
        ge=1,
        le=1000,
        description=(
            "Open subscriptions/listen streams per sandbox (Claude Code holds one per "
            "running client); past it the new one is refused with TOO_MANY_LISTEN_STREAMS."
        ),
    )
    max_listen_streams: int = Field(
        default=1024,
        ge=1,
        le=100_000,
        description="Open subscriptions/listen streams, all sandboxes together.",
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
    pool_size: int = Field(default=500, ge=1, le=10_000, description="Number of sandbox slots.")
    slot_backend: Literal["dir", "zfs"] = Field(
        default="dir", description="`dir` (folders in the state dir) or `zfs` (one dataset a slot)."
    )
    idle_timeout_s: int = Field(
        default=600,
        ge=10,
        le=86_400,
        description="Seconds of inactivity before a sandbox is emptied.",
    )
    auth: Literal["oauth", "none"] = Field(
        default="oauth",
        description="`oauth` (anonymous OAuth 2.1) or `none` (one local user; loopback only).",
    )
    log_level: LogLevel = Field(default="INFO", description="Lowest level written to stderr.")
    zfs_parent: str | None = Field(
        default=None,
        description="Dataset holding the slots (`POOL/DATASET`); required with the zfs backend.",
    )
    queue_wait_s: float = Field(
        default=20,
        ge=0,
        le=50,
        description=(
            "How long a call waits in the queue (sending progress) before it returns its "
            "position; MCP clients give up after about 60 s."
        ),
    )
    progress_interval_s: float = Field(
        default=15,
        ge=1,
        le=30,
        description=(
            "How often a long call (a synchronous command, a wait for a job's result) tells "
            "a client that asked for progress that it is alive."
        ),
    )
    task_keep_s: int = Field(
        default=3600,
        ge=60,
        le=86_400,
        description=(
            "How long a finished MCP task (its final result) is kept for tasks/get; then it "
            "reads as unknown (its command's job stays in the records)."
        ),
    )
    max_tasks_per_sandbox: int = Field(
        default=20,
        ge=1,
        le=1000,
        description=(
            "MCP tasks one sandbox holds, running and finished; a new one forgets the "
            "sandbox's oldest finished task, and a call finding them all running is served "
            "without a task."
        ),
    )
    max_tasks: int = Field(
        default=2000,
        ge=1,
        le=100_000,
        description=(
            "MCP tasks the server holds in memory, all sandboxes together; beyond it calls "
            "are served without a task (no sandbox's results are dropped for another's)."
        ),
    )
    images: str = Field(
        default="sandbox-mcp/python:3,sandbox-mcp/node:22,sandbox-mcp/node:18,sandbox-mcp/base:bookworm",
        description="Comma-separated allow-list of images experiments may use (built locally).",
    )
    default_image: str = Field(
        default="sandbox-mcp/python:3", description="The image used when none is asked for."
    )
    sandbox_user: str = Field(
        default="1000:1000",
        description="uid:gid the commands run as inside containers (never root).",
    )
    exec_path: Literal["auto", "docker-exec"] = Field(
        default="auto",
        description=(
            "How commands reach a container: auto runs them through the container's "
            "persistent executor when it is ready (falling back to docker exec), "
            "docker-exec runs each through its own docker exec."
        ),
    )
    dir_slot_budget_mb: int = Field(
        default=1024,
        ge=16,
        le=10_000_000,
        description=(
            "Bytes (MB) a sandbox's dir slot and artifacts may allocate, measured after each "
            "writing call and every DISK_CHECK_INTERVAL_S; past it writing calls get "
            "QUOTA_EXCEEDED and the sandbox's commands are killed (a soft bound)."
        ),
    )
    dir_slot_max_entries: int = Field(
        default=200_000,
        ge=1000,
        le=10_000_000,
        description="Files and folders a dir slot may hold (bounds each walk, and inodes).",
    )
    disk_check_interval_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="Seconds between measurements of the dir slots that were written to.",
    )
    max_experiments: int = Field(
        default=4,
        ge=1,
        le=50,
        description="Live experiments per sandbox (4: a baseline plus three candidate fixes).",
    )
    max_containers: int | None = Field(
        default=None,
        ge=1,
        le=20_000,
        description=(
            "Live experiment containers, server-wide; at least POOL_SIZE, as every sandbox is "
            "promised one (second and later experiments share the rest). Default: twice "
            "POOL_SIZE (an idle container costs about 3.6 MB)."
        ),
    )
    warm_containers: int = Field(
        default=2,
        ge=0,
        le=100,
        description=(
            "Containers of the default image kept started and hardened, each in one of the "
            "free slots handed out next, so a new sandbox's first experiment starts without "
            "waiting for Docker (0: none). Each counts as its slot's promised container; an "
            "idle one costs a few MB of memory (tests/bench/bench_warm.py)."
        ),
    )
    label_prefix: str = Field(
        default="io.sandbox-mcp",
        pattern=r"^[a-z0-9]+([.-][a-z0-9]+)*$",
        description=(
            "Prefix of the Docker labels on our containers; servers sharing one Docker engine "
            "need different ones (each counts and sweeps the containers with its own)."
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
    max_jobs_per_sandbox: int = Field(
        default=8,
        ge=1,
        le=100,
        description="Commands one sandbox may run at once, across its experiments.",
    )
    max_jobs_per_experiment: int = Field(
        default=4, ge=1, le=100, description="Commands one experiment may run at once."
    )
    max_cpus: float = Field(default=4, gt=0, le=256, description="Ceiling on CPUs per experiment.")
    max_memory_mb: int = Field(
        default=8192, ge=64, le=1_048_576, description="Ceiling on memory per experiment (MB)."
    )
    max_pids: int = Field(
        default=2048, ge=16, le=1_000_000, description="Ceiling on processes per experiment."
    )
    max_command_timeout_s: int = Field(
        default=1800, ge=1, le=86_400, description="Ceiling on one command's wall clock (s)."
    )
    sync_wait_s: float = Field(
        default=45,
        gt=0,
        le=55,
        description=(
            "How long a synchronous command is waited for before its job id is returned "
            "(MCP clients give up after about 60 s)."
        ),
    )
    allow_egress: bool = Field(
        default=False, description="Whether experiments may ask for network egress."
    )
    allow_git_egress: bool = Field(
        default=False,
        description="Whether create_experiment may clone https repositories (egress for a helper).",
    )
    egress_proxy: bool = Field(
        default=False,
        description=(
            "Offer network 'restricted': experiments reach only the allow-listed names, "
            "through a Squid proxy the server starts (needs squid, iptables and root)."
        ),
    )
    egress_allowlist: str = Field(
        default=",".join(DEFAULT_ALLOWLIST),
        description=(
            "Names network 'restricted' may reach, comma-separated (.example.org: it and "
            "every name below it); the most an experiment may ask for."
        ),
    )
    egress_max_bytes: int = Field(
        default=2 * 1024**3,
        ge=1024**2,
        description="Bytes one restricted experiment may move through the proxy (both ways).",
    )
    egress_proxy_port: int = Field(
        default=3128, ge=1, le=65535, description="The proxy's port on the restricted network."
    )
    egress_test_hosts: str = Field(
        default="",
        description="Tests only: name=address pairs the proxy resolves before DNS.",
    )
    accept_shared_disk: bool = Field(
        default=False,
        description=(
            "Serve anyone (oauth) on the dir backend although its slots have no quota and share "
            "a filesystem with the database, so one tenant could fill it: for trials only."
        ),
    )
    artifact_ttl_s: int = Field(
        default=86_400,
        ge=60,
        le=30 * 86_400,
        description="How long collected artifacts are kept after their sandbox is emptied.",
    )
    max_artifact_mb: int = Field(
        default=200,
        ge=1,
        le=1_048_576,
        description="Artifacts one sandbox may keep on the shelf (MB), whatever their count.",
    )
    record_retention_days: float = Field(
        default=7,
        gt=0,
        le=3650,
        description=(
            "How long tool-call audit rows and destroyed experiments (with their jobs' output) "
            "are kept."
        ),
    )
    snapshot_excludes: str = Field(
        default="",
        description="Comma-separated extra glob patterns never copied from a host project.",
    )
    strict_env_denylist: bool = Field(
        default=True,
        description="Refuse credential-shaped environment names even when asked for.",
    )
    registrations_per_minute: int = Field(
        default=30,
        ge=1,
        le=100_000,
        description="Client registrations accepted per minute, in all.",
    )
    signins_per_minute: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description="Sandboxes one browser address may create per minute (the sign-in button).",
    )
    sandboxes_per_address: int = Field(
        default=20,
        ge=1,
        le=100_000,
        description=(
            "Live sandboxes (sign-ins neither revoked nor expired) one address may hold: "
            "an IPv4 address, or an IPv6 /64."
        ),
    )
    new_sandboxes_per_hour: int = Field(
        default=200,
        ge=1,
        le=1_000_000,
        description="New sandboxes (sign-ins) the whole server accepts per hour.",
    )
    trusted_proxies: str = Field(
        default="",
        description=(
            "Comma-separated addresses and CIDR networks of the reverse proxies whose "
            "forwarding header names the client; empty: the peer is the client."
        ),
    )
    proxy_header: Literal["x-forwarded-for", "forwarded"] = Field(
        default="x-forwarded-for",
        description=(
            "The header the trusted proxies add: `x-forwarded-for` or `forwarded` (RFC 7239); "
            "only that one is read."
        ),
    )
    client_metadata_documents: bool = Field(
        default=True,
        description=(
            "Accept an https URL as client_id and fetch the client's metadata document there "
            "(public addresses only, 5 KB, 10 s, no redirects)."
        ),
    )
    client_document_fetches_per_minute: int = Field(
        default=60,
        ge=1,
        le=10_000,
        description="New client metadata documents fetched per minute, in all.",
    )
    token_key: SecretStr | None = Field(
        default=None,
        description=(
            "Hex key (at least 64 digits) for the HMAC under which tokens are stored; "
            "default: a key created 0600 in the state dir at first start."
        ),
    )
    host_state_dir: Path | None = Field(
        default=None,
        description=(
            "Where the state dir is on the Docker host, when this server runs in a container "
            "that mounts it under another path; unset: the same path."
        ),
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token Prometheus must send for /metrics; unset: /metrics is open, like /health."
        ),
    )
    smtp_host: str | None = Field(
        default=None, description="SMTP server for the one 'ready' e-mail; unset: no e-mail."
    )
    smtp_port: int = Field(default=587, ge=1, le=65535, description="SMTP port.")
    smtp_security: Literal["starttls", "tls", "none"] = Field(
        default="starttls", description="`starttls`, `tls` (implicit) or `none` (loopback only)."
    )
    smtp_user: str | None = Field(default=None, description="SMTP user name, if any.")
    smtp_password: SecretStr | None = Field(default=None, description="SMTP password, if any.")
    smtp_sender: str = Field(
        default="sandbox-mcp@localhost", description="The From address of the 'ready' e-mail."
    )
    smtp_max_per_hour: int = Field(
        default=60, ge=0, le=10_000, description="At most this many e-mails leave in any hour."
    )

    @field_validator("state_dir")
    @classmethod
    def _expand_state_dir(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_log_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError(
                "must start with sqlite+aiosqlite:// or postgresql+asyncpg:// "
                "(the service talks to its database asynchronously)"
            )
        return value

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

    @field_validator("host_state_dir")
    @classmethod
    def _check_host_state_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("must be an absolute path on the Docker host")
        return value

    @field_validator("metrics_token")
    @classmethod
    def _check_metrics_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (openssl rand -hex 16)")
        return value

    @field_validator("sandbox_user")
    @classmethod
    def _check_sandbox_user(cls, value: str) -> str:
        match = re.fullmatch(r"(\d+):(\d+)", value)
        if not match or int(match.group(1)) == 0:
            raise ValueError("must be uid:gid of an unprivileged user, such as 1000:1000")
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _check_trusted_proxies(cls, value: str) -> str:
        parse_trusted_proxies(value)  # raises ValueError naming the bad entry
        return value

    @property
    def trusted_proxy_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return parse_trusted_proxies(self.trusted_proxies)

    @field_validator("proxy_header", mode="before")
    @classmethod
    def _lower_proxy_header(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("egress_allowlist")
    @classmethod
    def _check_egress_allowlist(cls, value: str) -> str:
        return ",".join(parse_allowlist(value))  # raises ValueError naming the bad entry

    @property
    def egress_ceiling(self) -> tuple[str, ...]:
        return parse_allowlist(self.egress_allowlist)

    @property
    def egress_test_host_pairs(self) -> tuple[tuple[str, str], ...]:
        pairs = [item.split("=", 1) for item in self.egress_test_hosts.split(",") if "=" in item]
        return tuple((name.strip(), str(ipaddress.ip_address(a.strip()))) for name, a in pairs)

    @field_validator("images")
    @classmethod
    def _check_images(cls, value: str) -> str:
        names = [name.strip() for name in value.split(",") if name.strip()]
        if not names or not all(
            re.fullmatch(r"[a-z0-9][a-z0-9._/-]*(:[\w.-]+)?", n) for n in names
        ):
            raise ValueError("must be a comma-separated list of image names such as repo/name:tag")
        return ",".join(names)

    @property
    def sandbox_ids(self) -> tuple[int, int]:
        """``sandbox_user`` as (uid, gid): parsed here once, validated above."""
        uid, gid = self.sandbox_user.split(":")
        return int(uid), int(gid)

    @property
    def hosted(self) -> bool:
        """Anyone may sign in (OAuth): host paths are refused, limits matter."""
        return self.auth == "oauth"

    @property
    def image_list(self) -> tuple[str, ...]:
        return tuple(self.images.split(","))

    @property
    def snapshot_exclude_list(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.snapshot_excludes.split(",") if p.strip())

    @field_validator("token_key")
    @classmethod
    def _check_token_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or value.get_secret_value() == "":
            return None
        text = value.get_secret_value()
        if len(text) < 64 or len(text) % 2 or not re.fullmatch(r"[0-9a-fA-F]+", text):
            raise ValueError(
                "must be at least 64 hexadecimal digits (32 bytes), e.g. openssl rand -hex 32"
            )
        return value

    @field_validator("zfs_parent")
    @classmethod
    def _check_zfs_parent(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*(/[A-Za-z0-9_.:-]+)+", value):
            raise ValueError("must name a dataset below a pool, such as tank/sandboxes")
        return value

    @model_validator(mode="after")
    def _default_image_is_allowed(self) -> Settings:
        if self.default_image not in self.images.split(","):
            raise ValueError(
                f"SANDBOX_MCP_DEFAULT_IMAGE={self.default_image!r} is not in SANDBOX_MCP_IMAGES"
            )
        return self

    @model_validator(mode="after")
    def _zfs_needs_a_parent(self) -> Settings:
        if self.slot_backend == "zfs" and self.zfs_parent is None:
            raise ValueError(
                "SANDBOX_MCP_SLOT_BACKEND='zfs' needs SANDBOX_MCP_ZFS_PARENT (the dataset that "
                "holds the slots, e.g. tank/sandboxes)"
            )
        if self.smtp_security == "none" and self.smtp_host and not is_loopback_host(self.smtp_host):
            raise ValueError(
                "SANDBOX_MCP_SMTP_SECURITY='none' is allowed only for a loopback SMTP_HOST: "
                "the message and the password would cross the network in clear"
            )
        return self

    @model_validator(mode="after")
    def _every_slot_can_have_a_container(self) -> Settings:
        if self.max_containers is not None and self.max_containers < self.pool_size:
            raise ValueError(
                f"SANDBOX_MCP_MAX_CONTAINERS={self.max_containers} is below "
                f"SANDBOX_MCP_POOL_SIZE={self.pool_size}: every sandbox the pool hands out "
                "must be able to run one experiment, so the server keeps a container for each "
                f"slot; set SANDBOX_MCP_MAX_CONTAINERS to at least {self.pool_size} (unset, "
                "it is twice the pool size) or lower SANDBOX_MCP_POOL_SIZE"
            )
        return self

    @model_validator(mode="after")
    def _auth_none_only_on_loopback(self) -> Settings:
        if self.auth == "none" and not is_loopback_host(self.host):
            raise ValueError(
                f"SANDBOX_MCP_AUTH='none' is allowed only when SANDBOX_MCP_HOST is loopback "
                f"(it is {self.host!r}): without sign-in every caller would share one sandbox"
            )
        return self

    @property
    def effective_public_url(self) -> str:
        if self.public_url:
            return self.public_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def effective_max_containers(self) -> int:
        # Twice the pool: every slot's first container plus as many again for second
        # and third experiments; 1,000 idle hardened containers take about 3.6 GB.
        return self.max_containers or 2 * self.pool_size

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.state_dir / 'sandbox-mcp.db'}"

    def with_overrides(self, **changes: object) -> Settings:
        """A validated copy with some fields replaced (used for CLI flags).

        Raises:
            SettingsError: a replaced value is invalid.
        """
        data = self.model_dump()
        data.update({k: v for k, v in changes.items() if v is not None})
        return _validate(data)


def load_settings(**overrides: object) -> Settings:
    """Read and validate the configuration from the process environment.

    Args:
        overrides: field values that take precedence over the environment (CLI flags).

    Raises:
        SettingsError: a value is invalid or a ``SANDBOX_MCP_*`` variable is unknown,
            with one line per problem.
    """
    unknown = sorted(
        name
        for name in os.environ
        if name.startswith(ENV_PREFIX)
        and name[len(ENV_PREFIX) :].lower() not in Settings.model_fields
        # Not ours: the test suite passes its service addresses as SANDBOX_MCP_TEST_*,
        # and .ci/run takes its own knobs as SANDBOX_MCP_CI_*.
        and not name.startswith(HARNESS_PREFIXES)
    )
    if unknown:
        raise SettingsError([f"{name} is not a setting of sandbox-mcp" for name in unknown])
    return _validate({k: v for k, v in overrides.items() if v is not None})


def _validate(values: dict[str, object]) -> Settings:
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError(_describe(exc, values)) from None


def _describe(exc: ValidationError, values: dict[str, object]) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:
            # A rule across fields: its message already names the variables.
            lines.append(message)
            continue
        field = str(error["loc"][0])
        variable = f"{ENV_PREFIX}{field.upper()}"
        shown = values.get(field, os.environ.get(variable, "<unset>"))
        if field in _secret_fields():
            shown = "<hidden>"
        lines.append(f"{variable}={shown!r} is invalid: {message}")
    return lines


def _secret_fields() -> frozenset[str]:
    """Every SecretStr setting: its value never appears in an error line."""
    return frozenset(
        name
        for name, info in Settings.model_fields.items()
        if info.annotation in (SecretStr, SecretStr | None)
    )
