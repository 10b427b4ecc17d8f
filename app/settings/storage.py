"""Where the service keeps its state: the state dir, the database, and how long records stay."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from app.settings.base import Group


class StorageSettings(Group):
    state_dir: Path = Field(
        default=Path("~/.sandbox-mcp"),
        description="Where the database, slots (dir backend), keys and artifacts live.",
    )
    host_state_dir: Path | None = Field(
        default=None,
        description=(
            "Where the state dir is on the Docker host, when this server runs in a container "
            "that mounts it under another path; unset: the same path."
        ),
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy async URL; default: SQLite file `sandbox-mcp.db` in the state dir.",
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

    audit_refusals_per_minute: int = Field(
        default=10,
        ge=0,
        le=100_000,
        description=(
            "Refused calls of one sandbox written each minute per tool and error code (a "
            "`tool.call` log line and an audit row each); the rest are counted and told in "
            "one line and one row a minute (`tool.calls_not_recorded`, its `calls` column)."
        ),
    )
    audit_rows_per_sandbox_per_day: int = Field(
        default=100_000,
        ge=1,
        le=100_000_000,
        description=(
            "Calls of one sandbox written in a UTC day (log line and audit row), every "
            "server process together; past it its calls are counted and told in one line "
            "and one row an hour per tool and outcome."
        ),
    )
    audit_rows_per_address_per_day: int = Field(
        default=400_000,
        ge=0,
        le=1_000_000_000,
        description=(
            "Calls written in a UTC day for all the sandboxes signed in from one address "
            "together (hosted mode), every server process together; past it they are "
            "counted as past the per-sandbox bound. 0: no bound per address."
        ),
    )

    @field_validator("state_dir")
    @classmethod
    def _expand_state_dir(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("host_state_dir")
    @classmethod
    def _check_host_state_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("must be an absolute path on the Docker host")
        return value

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

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.state_dir / 'sandbox-mcp.db'}"

    @property
    def host_paths(self) -> tuple[Path, Path] | None:
        """(our path, the Docker host's path) of the state dir, when they differ."""
        return (self.state_dir, self.host_state_dir) if self.host_state_dir else None

    @property
    def record_retention_s(self) -> float:
        return self.record_retention_days * 86_400
