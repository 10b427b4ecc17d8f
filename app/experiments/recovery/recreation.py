"""A live experiment whose container the engine no longer has (removed behind the
server's back, or lost with the engine's own state) gets a new one: the same image,
network and limits, through the same hardened creation path, on its intact
workspace. Environment variables given at creation are never stored, so the new
container has none of them, and the experiment's warnings say so.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from app.experiments.core.records import Experiment
from app.experiments.core.store import ExperimentStore
from app.experiments.evidence.shelf import fingerprint
from app.experiments.workspace.dirs import ExperimentDirs
from app.runtime.backend import ContainerSpec, Limits, SandboxBackend

log = structlog.get_logger(__name__)

RECREATED = (
    "Its container disappeared from the Docker engine and was recreated on the same "
    "workspace with the same image, network and limits; /tmp, the home folder and any "
    "environment variables given at creation did not survive."
)


def spec_of(experiment: Experiment, slot_root: Path) -> ContainerSpec:
    """The container an experiment was created with, as recorded (env excepted)."""
    isolation = experiment.isolation
    limits = Limits(
        cpus=float(isolation["cpus"]),
        memory_mb=int(isolation["memory_mb"]),
        pids=int(isolation["pids"]),
        tmp_mb=int(isolation["tmp_mb"]),
    )
    return ContainerSpec(
        experiment_id=experiment.experiment_id,
        sandbox_label=fingerprint(experiment.sandbox_key),
        image=str(isolation.get("image") or experiment.image),
        workspace=ExperimentDirs.of(slot_root, experiment.experiment_id).workspace,
        network=isolation.get("network", "none"),
        # A restricted experiment keeps the names it was given (None: the whole ceiling).
        egress_allowlist=tuple(isolation["egress_allowlist"])
        if isolation.get("egress_allowlist")
        else None,
        limits=limits,
    )


async def recreate(
    records: ExperimentStore,
    backend: SandboxBackend,
    experiment: Experiment,
    slot_root: Path,
) -> bool:
    """Give ``experiment`` a new container; False if another process (or a destroy)
    changed it first, in which case the new container is removed again."""
    assert experiment.container_id is not None
    container = await backend.create(spec_of(experiment, slot_root))
    replaced = await records.replace_container(
        experiment.experiment_id,
        experiment.container_id,
        container.container_id,
        [*experiment.warnings, RECREATED],
    )
    if not replaced:
        await backend.remove(container.container_id)
        return False
    log.warning(
        "experiment.container_recreated",
        experiment_id=experiment.experiment_id,
        container_id=container.container_id[:12],
    )
    return True
