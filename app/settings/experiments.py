"""Experiments: how many per sandbox, how many commands at once, how long a synchronous
command is waited for, what a snapshot leaves out, and the artifacts' shelf."""

from __future__ import annotations

from pydantic import Field

from app.settings.base import Group


class ExperimentSettings(Group):
    max_experiments: int = Field(
        default=4,
        ge=1,
        le=50,
        description="Live experiments per sandbox (4: a baseline plus three candidate fixes).",
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
    sync_wait_s: float = Field(
        default=45,
        gt=0,
        le=55,
        description=(
            "How long a synchronous command is waited for before its job id is returned "
            "(MCP clients give up after about 60 s)."
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

    @property
    def snapshot_exclude_list(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.snapshot_excludes.split(",") if p.strip())
