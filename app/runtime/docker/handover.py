"""Handing a running (warm) container over to the experiment a sandbox asks for.

A warm container (:mod:`app.runtime.warm.pool`) was created like any other, for no one.
It can become the one a ``ContainerSpec`` asks for only where nothing fixed at
creation differs: the image, the network, the environment (a warm one has none of
its own) and the size of ``/tmp`` (a tmpfs). CPU, memory and pids limits can change
in a running container, so they are updated in place to the request's (clamped as
for a cold one). From then on it counts in its new sandbox's share (the backend
claims it: its labels cannot change).

A sandbox's prepared container (:mod:`app.runtime.warm.prepared`) was made outside the
shares; its hand-over is admitted like a cold create of that sandbox (``admit``), so
it is refused exactly when a cold one would be.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import docker
import structlog

from app.runtime.backend import Container, ContainerSpec, Isolation, Limits, NetworkMode
from app.runtime.docker.engine import HANDED_OVER, Engine
from app.runtime.docker.engine_errors import translated
from app.runtime.docker.threads import Offload
from app.runtime.limits import Ceilings, clamp_limits

log = structlog.get_logger(__name__)


async def hand_over(
    warm: Container,
    spec: ContainerSpec,
    *,
    image: str,
    engine: Engine,
    offload: Offload,
    ceilings: Ceilings,
    admit: bool = False,
) -> Container | None:
    """The running container ``warm`` made the one ``spec`` asks for (its ``image``, the
    default one when the spec names none), claimed by its sandbox; None when it cannot be.

    Raises:
        LimitReached, CapacityExceeded: ``admit`` and the sandbox's share is full.
    """
    if not fits(warm.isolation, image=image, network=spec.network, env=spec.env):
        return None
    api = await engine.api()
    limits, warnings = clamp_limits(spec.limits, ceilings, await engine.cpus(api))
    isolation = retuned(warm.isolation, limits)
    if isolation is None:
        return None
    updated = isolation is not warm.isolation
    name = f"{HANDED_OVER}{spec.sandbox_label}-{secrets.token_hex(4)}"
    async with engine.admitted(spec.sandbox_label, name, admit=admit):
        if updated:
            with translated(warm.container_id):
                await offload.call(update_limits, api, warm.container_id, limits)
        engine.claim(warm.container_id, spec.sandbox_label)
        # Its label still says warm-slot-NNN or prepared (labels are fixed): its new name
        # tells the other server processes whose share it is now.
        await engine.rename(warm.container_id, name)
    log.info("runtime.hand_over", container_id=warm.container_id[:12], updated=updated)
    return Container(warm.container_id, isolation, warnings)


def fits(given: Isolation, *, image: str, network: NetworkMode, env: dict[str, str]) -> bool:
    """Whether a container created with ``given`` can serve a request for these."""
    return image == given.image and network == given.network and not env


def retuned(given: Isolation, limits: Limits) -> Isolation | None:
    """``given`` with ``limits`` (clamped) applied; None when they cannot be (another
    /tmp size), ``given`` itself when nothing changes."""
    if limits.tmp_mb != given.tmp_mb:
        return None
    if (limits.cpus, limits.memory_mb, limits.pids) == (given.cpus, given.memory_mb, given.pids):
        return given
    return dataclasses.replace(
        given, cpus=limits.cpus, memory_mb=limits.memory_mb, pids=limits.pids
    )


def update_limits(api: docker.APIClient, container_id: str, limits: Limits) -> None:
    """Set a running container's CPU, memory (no swap) and pids limits (blocking)."""
    # The SDK's update_container knows neither NanoCpus nor PidsLimit; the engine does.
    memory = limits.memory_mb * 1024 * 1024
    body = {
        "NanoCpus": round(limits.cpus * 1e9),
        "Memory": memory,
        "MemorySwap": memory,
        "PidsLimit": limits.pids,
    }
    raw: Any = api  # the SDK has no public call for these two fields
    raw._raise_for_status(
        raw._post_json(raw._url("/containers/{0}/update", container_id), data=body)
    )
