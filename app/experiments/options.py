"""What the operator configured for experiments (built in app/root/experiments.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.experiments.workspace.dirs import Owner
from app.runtime.limits import clamp_timeout


@dataclass(frozen=True)
class ExperimentOptions:
    hosted: bool
    default_image: str
    max_experiments: int = 4
    max_jobs_per_sandbox: int = 8
    max_jobs_per_experiment: int = 4
    sync_wait_s: float = 45.0
    default_timeout_s: float = 600.0
    max_timeout_s: float = 1800.0
    max_output_bytes: int = 1_048_576
    # Stored job bytes (command, stdout, stderr) per sandbox and UTC day: output_budget.
    job_output_bytes_per_day: int = 256 * 1_048_576
    owner: Owner | None = None
    snapshot_excludes: tuple[str, ...] = ()
    strict_env: bool = True
    egress_allowed: bool = False
    # Network "restricted" is offered (the proxy runs), and the most it may reach.
    restricted_allowed: bool = False
    egress_allowlist: tuple[str, ...] = ()
    egress_max_bytes: int = 0
    ceilings: Mapping[str, float] = field(default_factory=dict)
    artifact_dir: Path = Path("/nonexistent")
    artifact_ttl_s: float = 86_400
    max_artifact_bytes: int = 200 * 1_048_576  # per sandbox, on the shelf

    def command_timeout(self, requested: float | None) -> tuple[float, str | None]:
        """A command's wall clock (a run's, or the setup commands' of a creation): the
        request, or the default, clamped to the ceiling, with the warning the agent is
        told. The one place the domain clamps a timeout; the backend keeps the
        runtime's own ceiling for any caller (``app/runtime/backends/docker.py``)."""
        return clamp_timeout(requested or self.default_timeout_s, self.max_timeout_s)
