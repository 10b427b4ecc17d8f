"""How the composition root builds the experiments' parts from the settings: the
manager's options, the dir slots' byte budget, and what emptying a sandbox does to
the rest of the service."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from app.experiments.core.jobs import JobRegistry
from app.experiments.core.store import ExperimentStore
from app.experiments.disk_budget import DiskBudget
from app.experiments.evidence.shelf import fingerprint
from app.experiments.manager import ExperimentManager
from app.experiments.options import ExperimentOptions
from app.experiments.workspace.dirs import Owner
from app.runtime.backend import SandboxBackend
from app.runtime.warm.prepared import PreparedContainers
from app.settings import PoolSettings, Settings
from app.tenancy.threads import TenantThreads
from jail.context import SandboxMemory
from jail.privilege import can_chown
from pool.leases import SlotPool


def experiment_options(settings: Settings) -> ExperimentOptions:
    """What the manager enforces: the experiments' caps, the runtime's ceilings, the
    egress offered, and where artifacts are kept."""
    runtime, experiments, egress = settings.runtime, settings.experiments, settings.egress
    limits = runtime.ceilings()
    uid, gid = runtime.sandbox_ids
    return ExperimentOptions(
        hosted=settings.auth.hosted,
        default_image=runtime.default_image,
        max_experiments=experiments.max_experiments,
        max_jobs_per_sandbox=experiments.max_jobs_per_sandbox,
        max_jobs_per_experiment=experiments.max_jobs_per_experiment,
        sync_wait_s=experiments.sync_wait_s,
        max_timeout_s=runtime.max_command_timeout_s,
        # Only root (or CAP_CHOWN) can hand files to the container's user; otherwise run the server
        # as that user (SANDBOX_MCP_SANDBOX_USER = the server's uid:gid).
        owner=Owner(uid, gid) if can_chown() else None,
        snapshot_excludes=experiments.snapshot_exclude_list,
        strict_env=experiments.strict_env_denylist,
        egress_allowed=egress.allow,
        restricted_allowed=egress.proxy,
        egress_allowlist=egress.ceiling if egress.proxy else (),
        egress_max_bytes=egress.max_bytes,
        ceilings={
            "cpus": limits.cpus,
            "memory_mb": limits.memory_mb,
            "pids": limits.pids,
            "timeout_s": limits.timeout_s,
        },
        artifact_dir=settings.storage.state_dir / "artifacts",
        artifact_ttl_s=experiments.artifact_ttl_s,
        max_artifact_bytes=experiments.max_artifact_mb * 1_048_576,
        job_output_bytes_per_day=experiments.job_output_bytes_per_sandbox_per_day,
    )


def build_disk_budget(
    pool_settings: PoolSettings,
    pool: SlotPool,
    records: ExperimentStore,
    jobs: JobRegistry,
    backend: SandboxBackend,
    threads: TenantThreads,
    *,
    trash_settled: Callable[[Path, float], Awaitable[bool]] | None = None,
) -> DiskBudget | None:
    """The measured byte budget of dir slots; None on ZFS, whose slots have a kernel quota."""
    if pool_settings.slot_backend != "dir":
        return None
    return DiskBudget(
        slot_root_of=lambda key: slot.root if (slot := pool.lease_of(key)) else None,
        holdings_of=records.disk_holdings,
        jobs=jobs,
        backend=backend,
        limit_bytes=pool_settings.dir_slot_budget_mb * 1_048_576,
        max_entries=pool_settings.dir_slot_max_entries,
        interval_s=pool_settings.disk_check_interval_s,
        threads=threads,
        trash_settled=trash_settled,
    )


@dataclass
class SandboxReset:
    """What happens to the rest of the service when the pool empties a sandbox (the
    pool's ``before_reset``)."""

    memory: SandboxMemory
    manager: ExperimentManager
    prepared: PreparedContainers | None = None

    async def __call__(self, sandbox_key: str) -> None:
        # Containers first (they hold the slot's folders), then what we remembered. The
        # prepared one first of all: no experiment of the sandbox may take it meanwhile.
        if self.prepared is not None:
            await self.prepared.drop(sandbox_key, fingerprint(sandbox_key))
        await self.manager.teardown_sandbox(sandbox_key, "the sandbox was emptied after being idle")
        self.memory.drop(sandbox_key)
