"""Bind-mount sources as the Docker engine sees them, for a server that runs in a container."""

from __future__ import annotations

from pathlib import Path

import docker
import requests

from app.runtime.backends.docker import DockerBackend
from app.runtime.docker.engine_errors import translate
from pool.slots import SlotsAt


def backend(state: Path, host_state: Path | None) -> DockerBackend:
    return DockerBackend(
        slots=SlotsAt(state / "slots"),
        allowed_images=("sandbox-mcp/python:3",),
        client_factory=docker.from_env,  # never called: no engine is asked
        host_paths=(state, host_state) if host_state else None,
    )


def test_a_workspace_under_the_state_dir_is_mounted_from_the_hosts_path(tmp_path: Path) -> None:
    workspace = tmp_path / "slots" / "slot-000" / "exp_1" / "workspace"
    translated = backend(tmp_path, Path("/var/lib/sandbox-mcp"))._engine.path(workspace)
    assert translated == "/var/lib/sandbox-mcp/slots/slot-000/exp_1/workspace"


def test_without_host_paths_or_outside_the_state_dir_paths_are_unchanged(tmp_path: Path) -> None:
    inside = tmp_path / "slots" / "slot-000"
    assert backend(tmp_path, None)._engine.path(inside) == str(inside)
    elsewhere = Path("/srv/zfs/slot-000")
    assert backend(tmp_path, Path("/host"))._engine.path(elsewhere) == str(elsewhere)


def test_an_engine_that_cannot_see_the_folder_says_what_to_set() -> None:
    response = requests.Response()
    response.status_code = 400
    refused = docker.errors.APIError(
        "400 Client Error",
        response=response,
        explanation=(
            'invalid mount config for type "bind": bind source path does not exist: /state/slots/x'
        ),
    )
    failure = translate(refused, None)
    assert "SANDBOX_MCP_HOST_STATE_DIR" in failure.message
    assert "/state/slots/x" not in failure.message  # a host path is not the agent's business
