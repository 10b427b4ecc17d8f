"""How the validated settings become each part's options: the one place a setting's name
meets the parameter it feeds (the composition root passes the results along)."""

from __future__ import annotations

import os

import structlog

from app.experiments.options import ExperimentOptions
from app.experiments.workspace import Owner
from app.runtime.limits import Ceilings
from app.settings import Settings
from jail.privilege import can_chown
from pool.mailer import SmtpOptions

log = structlog.get_logger(__name__)


def ceilings(settings: Settings) -> Ceilings:
    """The most one experiment may get; the runtime clamps to it and the agent is told."""
    return Ceilings(
        cpus=settings.max_cpus,
        memory_mb=settings.max_memory_mb,
        pids=settings.max_pids,
        timeout_s=settings.max_command_timeout_s,
    )


def experiment_options(settings: Settings, limits: Ceilings) -> ExperimentOptions:
    uid, gid = settings.sandbox_ids
    return ExperimentOptions(
        hosted=settings.hosted,
        default_image=settings.default_image,
        max_experiments=settings.max_experiments,
        max_jobs_per_sandbox=settings.max_jobs_per_sandbox,
        max_jobs_per_experiment=settings.max_jobs_per_experiment,
        sync_wait_s=settings.sync_wait_s,
        max_timeout_s=settings.max_command_timeout_s,
        # Only root (or CAP_CHOWN) can hand files to the container's user; otherwise run the server
        # as that user (SANDBOX_MCP_SANDBOX_USER = the server's uid:gid).
        owner=Owner(uid, gid) if can_chown() else None,
        snapshot_excludes=settings.snapshot_exclude_list,
        strict_env=settings.strict_env_denylist,
        egress_allowed=settings.allow_egress,
        restricted_allowed=settings.egress_proxy,
        egress_allowlist=settings.egress_ceiling if settings.egress_proxy else (),
        egress_max_bytes=settings.egress_max_bytes,
        ceilings={
            "cpus": limits.cpus,
            "memory_mb": limits.memory_mb,
            "pids": limits.pids,
            "timeout_s": limits.timeout_s,
        },
        artifact_dir=settings.state_dir / "artifacts",
        artifact_ttl_s=settings.artifact_ttl_s,
        max_artifact_bytes=settings.max_artifact_mb * 1_048_576,
    )


def smtp_options(settings: Settings) -> SmtpOptions | None:
    if not settings.smtp_host:
        return None
    return SmtpOptions(
        host=settings.smtp_host,
        port=settings.smtp_port,
        security=settings.smtp_security,
        sender=settings.smtp_sender,
        username=settings.smtp_user,
        password=settings.smtp_password.get_secret_value() if settings.smtp_password else None,
    )


def warn_if_sandboxes_cannot_write(settings: Settings) -> None:
    """Only root can hand a workspace to another uid: a server that is not root must run
    sandbox commands as its own uid, or they can read their workspace but not write it."""
    uid, _ = settings.sandbox_ids
    if not can_chown() and uid != os.geteuid():
        log.warning(
            "config.sandbox_user_cannot_write",
            sandbox_user=settings.sandbox_user,
            server_uid=os.geteuid(),
            fix=f"set SANDBOX_MCP_SANDBOX_USER={os.geteuid()}:{os.getegid()} or run as root",
        )
