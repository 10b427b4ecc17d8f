from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from docker_testkit import BACKEND_PREFIX, GIT_PREFIX, IMAGES, docker_client, labelled


@pytest.fixture(scope="session")
def engine() -> Iterator[docker.DockerClient]:
    """The real engine; its absence is a failure, never a skip."""
    try:
        client = docker_client()
        client.ping()
    except Exception as exc:
        pytest.fail(
            "Docker must be running for the integration tests (.ci/run starts it; or "
            f"`source .ci/lib/services.sh; start_dockerd`): {exc}"
        )
    for image in IMAGES:
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail(f"{image} is missing: run deploy/build-base-image first")
    try:
        yield client
    finally:
        for prefix in (BACKEND_PREFIX, GIT_PREFIX):
            for container_id in labelled(client, f"{prefix}.managed=1"):
                client.api.remove_container(container_id, force=True)
        client.close()


@pytest.fixture(scope="session")
def slots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The slots folder of the backends under test; each test takes a fresh workspace."""
    return tmp_path_factory.mktemp("slots")
