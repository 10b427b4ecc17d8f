"""The sandbox images a server needs, and how they get built (``deploy/build-base-image``).

``serve`` looks before it listens: without the default image every
``create_experiment`` would answer IMAGE_MISSING. It never builds unasked: a hosted
server's start stays fast and does only what its operator wrote down; it logs what to
run instead. ``serve --build-images`` builds the default image when it is missing
(needs root; minutes the first time, for debootstrap of Debian 12, seconds once the
root filesystem is cached) and says what it is doing and how long it took.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import anyio
import structlog

from app.errors import ConfigurationError
from app.runtime.docker.probe import DockerProbe, RuntimeStatus
from app.settings import RuntimeSettings

log = structlog.get_logger(__name__)

# The images deploy/build-base-image makes, and the argument that makes each.
BUILD_TARGETS = {
    "sandbox-mcp/base:bookworm": "base",
    "sandbox-mcp/python:3": "python",
    "sandbox-mcp/node:18": "node18",
    "sandbox-mcp/node:22": "node22",
}
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "build-base-image"


class ImageBuildFailed(ConfigurationError):
    code = "IMAGE_BUILD_FAILED"


def how_to_build(image: str) -> str:
    """One sentence: what the operator runs to build ``image``."""
    target = BUILD_TARGETS.get(image)
    if target is None:
        return (
            f"{image} is not one of deploy/build-base-image's images: build or pull it "
            "under that tag, or choose another SANDBOX_MCP_DEFAULT_IMAGE"
        )
    return (
        f"build it with `sudo deploy/build-base-image {target}` (minutes the first time), "
        "or start with `sandbox-mcp serve --build-images`"
    )


async def ensure_default_image(
    runtime: RuntimeSettings,
    *,
    build: bool,
    script: Path = BUILD_SCRIPT,
    targets: Mapping[str, str] = BUILD_TARGETS,
) -> RuntimeStatus:
    """Look at the engine and the default image; with ``build``, build it if missing.

    Returns what the engine looked like at the end. Without ``build`` a missing Docker
    or image is logged with what to do, and the server starts anyway (``/health`` says
    ``degraded``): sign-in and the file tools work without them.

    Raises:
        ImageBuildFailed: ``build`` was asked and the image could not be built.
    """
    status = await _probe(runtime)
    image = runtime.default_image
    if not status.reachable:
        if build:
            raise ImageBuildFailed(
                f"Cannot build {image}: {status.reason} Start the Docker engine, or point "
                "DOCKER_HOST at its socket, first."
            )
        todo = (
            "Start the Docker engine, or point DOCKER_HOST at its socket; until it "
            "answers the server runs degraded: sign-in and files work, experiments do not."
        )
        log.warning("runtime.unreachable", reason=status.reason, todo=todo)
        # Said plainly too: a first start's operator reads this line, not the JSON.
        print(f"sandbox-mcp: {status.reason} {todo}", file=sys.stderr, flush=True)
        return status
    assert status.images is not None
    if status.images.default_ready:
        log.info(
            "images.ready", ready=list(status.images.ready), missing=list(status.images.missing)
        )
        return status
    if not build:
        log.warning(
            "images.default_missing",
            image=image,
            todo=how_to_build(image),
            effect="create_experiment answers IMAGE_MISSING until it is built",
        )
        return status
    await _build(image, script, targets)
    return await _probe(runtime)


async def _probe(runtime: RuntimeSettings) -> RuntimeStatus:
    probe = DockerProbe(images=runtime.image_list, default_image=runtime.default_image)
    try:
        return await probe()
    finally:
        probe.close()


async def _build(image: str, script: Path, targets: Mapping[str, str]) -> None:
    target = targets.get(image)
    if target is None:
        raise ImageBuildFailed(f"Cannot build the default image: {how_to_build(image)}.")
    if not await anyio.Path(script).is_file():
        raise ImageBuildFailed(
            f"Cannot build {image}: {script} is not here (an installed copy has no deploy/); "
            "build it from a clone of the repository: sudo deploy/build-base-image "
            f"{target}."
        )
    if os.geteuid() != 0:
        raise ImageBuildFailed(
            f"Building {image} needs root (debootstrap): run `sudo {script} {target}` once, "
            "then start the server again."
        )
    log.info(
        "images.building",
        image=image,
        command=f"{script} {target}",
        expect="a few minutes the first time (debootstrap of Debian 12), seconds with the "
        "cached root filesystem; its progress follows on stderr",
    )
    started = time.monotonic()
    # Its output goes to our stderr (descriptor 2): stdout stays clean (the stdio
    # transport owns it).
    done = await anyio.run_process([str(script), target], stdout=2, stderr=2, check=False)
    seconds = round(time.monotonic() - started, 1)
    if done.returncode != 0:
        raise ImageBuildFailed(
            f"{script} {target} failed (exit {done.returncode}, after {seconds} s; its "
            "output is above); fix what it says, or run it yourself and start again."
        )
    log.info("images.built", image=image, seconds=seconds)
