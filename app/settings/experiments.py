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
    job_output_bytes_per_sandbox_per_day: int = Field(
        default=256 * 1_048_576,
        ge=65_536,
        le=1 << 40,
        description=(
            "Bytes of job output (each job's command, stdout and stderr) one sandbox may "
            "store in the database in a UTC day, all its experiments together, counted in "
            "the database for every server process. Past it a job still runs and the call "
            "that waits for it gets its result whole, but its record keeps only the last "
            "4,096 characters of each stream and the command's first 1,000, and the result "
            "says so; at twice it the sandbox starts no job until the day ends. At least "
            "65536."
        ),
    )

    @property
    def snapshot_exclude_list(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.snapshot_excludes.split(",") if p.strip())
